"""Write docs/images/viewer.png: the viewer on a fetch-pick-place dataset (RGB and a colour-mapped depth camera),
photographed by a real browser.

Generates a small dataset (or takes --dataset), serves it with ``demoforge view``'s server, opens it in Debian's
chromium (headless, through chromium-driver; both installed by tools/setup.sh), seeks into the third segment of
an episode and saves the window.

    .venv/bin/python tools/screenshot_viewer.py                      # generate, then photograph
    .venv/bin/python tools/screenshot_viewer.py --dataset runs/fetch-dataset --out /tmp/viewer.png
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("MUJOCO_GL", "egl")
REPO = Path(__file__).resolve().parent.parent


def generate(workdir: Path, episodes: int, image_size: int, depth: bool) -> Path:
    store, dataset = workdir / "store", workdir / "dataset"
    cmd = [sys.executable, "-m", "demoforge.pipeline.cli", "generate", "--task", "fetch-pick-place",
           "--episodes", str(episodes), "--option", f"image_size={image_size}", "--option", f"depth={str(depth).lower()}",
           "--store", str(store), "--export", str(dataset)]
    print(f"generating {episodes} fetch-pick-place episodes ({image_size}x{image_size}"
          f"{', with depth' if depth else ''}) ...", flush=True)
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    return dataset


def photograph(dataset: Path, out: Path, width: int, height: int, episode: int, segment: int) -> None:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.wait import WebDriverWait

    from demoforge.pipeline.viewer.server import ViewerServer
    from demoforge.pipeline.viewer.source import open_source

    source = open_source(dataset)
    server = ViewerServer(source, "127.0.0.1", 0).start()
    options = webdriver.ChromeOptions()
    options.binary_location = "/usr/bin/chromium"
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", f"--window-size={width},{height}",
                "--hide-scrollbars", "--force-device-scale-factor=1"):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=options)
    try:
        driver.get(f"{server.url}#episode={episode}")
        wait = WebDriverWait(driver, 30, poll_frequency=0.1)
        spans = wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, "#timeline .seg") or False)
        spans[min(segment, len(spans) - 1)].click()
        driver.find_element(By.TAG_NAME, "body").send_keys("\ue014" * 4)  # four frames into the segment
        wait.until(lambda d: d.execute_script(  # every camera (a depth preview too) shows its frame
            "const vs = [...document.querySelectorAll('#videos video')];"
            "return vs.length > 0 && vs.every(v => !v.seeking && v.readyState >= 2);"))
        time.sleep(0.5)  # let the decoded frame reach the screen
        out.parent.mkdir(parents=True, exist_ok=True)
        driver.save_screenshot(str(out))
    finally:
        driver.quit()
        server.close()
        source.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog="example:\n  .venv/bin/python tools/screenshot_viewer.py")
    parser.add_argument("--dataset", type=Path, default=None,
                        help="an exported dataset to show (default: generate 4 episodes in a temporary folder)")
    parser.add_argument("--out", type=Path, default=REPO / "docs/images/viewer.png",
                        help="where to write the PNG (default: docs/images/viewer.png)")
    parser.add_argument("--image-size", type=int, default=128, help="camera size when generating (default: 128)")
    parser.add_argument("--no-depth", action="store_true",
                        help="generate without the depth camera (default: with it, shown colour-mapped)")
    parser.add_argument("--width", type=int, default=1600, help="window width in pixels (default: 1600)")
    parser.add_argument("--height", type=int, default=1000, help="window height in pixels (default: 1000)")
    parser.add_argument("--episode", type=int, default=1, help="dataset index of the episode shown (default: 1)")
    parser.add_argument("--segment", type=int, default=2, help="segment to seek into (default: 2, the third)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="demoforge-screenshot-") as tmp:
        dataset = args.dataset or generate(Path(tmp), episodes=4, image_size=args.image_size,
                                            depth=not args.no_depth)
        started = time.monotonic()
        photograph(dataset, args.out, args.width, args.height, args.episode, args.segment)
    print(f"wrote {args.out} ({args.out.stat().st_size / 1024:.0f} KiB, window {args.width}x{args.height}) in "
          f"{time.monotonic() - started:.1f} s", flush=True)


if __name__ == "__main__":
    main()
