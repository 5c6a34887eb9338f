"""Soak test: run the daemon for a while and record RSS, frames/s and queue depths over time.

    .venv/bin/python tools/soak.py --duration 1200 --interval 10 [--task fetch-pick-place] [--out soak.csv]

Prints a table per interval and a verdict: RSS flat (mean of the last quarter within 5% of the second
quarter) and no throughput decay (last quarter's frames/s at least 90% of the second quarter's).
Exit status 1 when either check fails.

    .venv/bin/python tools/soak.py --duration 600 --compare-exports-off --export-every 5 ...

also runs a second daemon with exports off, side by side, and prints the ratio of their RSS (exports run
in a child process, so the exporting daemon's own RSS should stay within 10% of the other's).
"""

from __future__ import annotations

import argparse
import csv
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def scrape(port: int) -> dict[str, float]:
    from demoforge.pipeline.metrics import scrape as scrape_metrics

    return scrape_metrics(f"http://127.0.0.1:{port}/metrics")


def write_job(folder: Path, task: str, options: str, codec: str, port: int, export_every: int) -> Path:
    job = folder / "job.toml"
    export = "" if export_every <= 0 else f"""
[export]
dir = "dataset"
every_episodes = {export_every}
every_seconds = 300"""
    job.write_text(f"""
[job]
task = "{task}"
episodes = "unbounded"
options = {{ {options} }}
[video]
codec = "{codec}"
[store]
dir = "store"{export}
[metrics]
address = "127.0.0.1:{port}"
[shutdown]
deadline_seconds = 30
""")
    return job


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--duration", type=float, default=1200, help="seconds the daemon runs (default 1200)")
    parser.add_argument("--interval", type=float, default=10, help="seconds between samples of RSS, frames/s and queue depths (default 10)")
    parser.add_argument("--task", default="fetch-pick-place", help="the daemon's task (default fetch-pick-place)")
    parser.add_argument("--options", default="cycles = 3, image_size = 224", help="TOML inline-table body")
    parser.add_argument("--codec", default="libsvtav1", help="the cameras' codec (default libsvtav1)")
    parser.add_argument("--export-every", type=int, default=25,
                        help="the daemon exports every N committed episodes; 0: never (default 25)")
    parser.add_argument("--out", type=Path, default=None, help="CSV of the samples")
    parser.add_argument("--keep", action="store_true", help="keep the store and dataset")
    parser.add_argument("--compare-exports-off", action="store_true",
                        help="also run a daemon with exports off, side by side, and compare RSS (default: off)")
    args = parser.parse_args()
    baseline = start_baseline(args) if args.compare_exports_off else None
    try:
        code = soak(args, baseline)
    finally:
        if baseline is not None:
            stop(baseline[0])
    return code


def start_baseline(args: argparse.Namespace) -> tuple[subprocess.Popen, Path, list[float]]:
    folder = Path(tempfile.mkdtemp(prefix="demoforge-soak-noexport-"))
    job = write_job(folder, args.task, args.options, args.codec, free_port(), 0)
    env = dict(os.environ, MUJOCO_GL=os.environ.get("MUJOCO_GL", "egl"), HF_HUB_OFFLINE="1")
    log = open(folder / "daemon.log", "w")
    proc = subprocess.Popen([sys.executable, "-m", "demoforge.pipeline.cli", "daemon", "--config", str(job),
                             "--json-logs"], env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=log)
    return proc, folder, []


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            proc.kill()


def soak(args: argparse.Namespace, baseline: tuple[subprocess.Popen, Path, list[float]] | None) -> int:

    folder = Path(tempfile.mkdtemp(prefix="demoforge-soak-"))
    port = free_port()
    job = write_job(folder, args.task, args.options, args.codec, port, args.export_every)
    env = dict(os.environ, MUJOCO_GL=os.environ.get("MUJOCO_GL", "egl"), HF_HUB_OFFLINE="1")
    log = open(folder / "daemon.log", "w")
    proc = subprocess.Popen([sys.executable, "-m", "demoforge.pipeline.cli", "daemon", "--config", str(job),
                             "--json-logs"], env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=log)
    samples: list[dict[str, float]] = []
    started = time.monotonic()
    last_frames, last_t = 0.0, started
    print(f"{'t (s)':>7}{'RSS MB':>9}{'frames/s':>10}{'episodes':>10}{'queues (enc>wr, wr>commit)':>26}")
    try:
        while time.monotonic() - started < args.duration:
            time.sleep(args.interval)
            if proc.poll() is not None:
                print(f"daemon exited early with {proc.returncode}; see {folder / 'daemon.log'}")
                return 1
            try:
                m = scrape(port)
            except OSError:
                continue
            now = time.monotonic()
            frames = m.get("demoforge_frames_total", 0.0)
            sample = {"t": now - started, "rss_mb": rss_mb(proc.pid), "fps": (frames - last_frames) / (now - last_t),
                      "episodes": m.get("demoforge_episodes_committed_total", 0.0),
                      "q_encode_write": m.get('demoforge_queue_depth{queue="encode->write"}', 0.0),
                      "q_write_commit": m.get('demoforge_queue_depth{queue="write->commit"}', 0.0)}
            last_frames, last_t = frames, now
            if baseline is not None and baseline[0].poll() is None:
                baseline[2].append(rss_mb(baseline[0].pid))
            samples.append(sample)
            print(f"{sample['t']:>7.0f}{sample['rss_mb']:>9.1f}{sample['fps']:>10.1f}{sample['episodes']:>10.0f}"
                  f"{sample['q_encode_write']:>14.0f}{sample['q_write_commit']:>12.0f}",
                  flush=True)
    finally:
        stop(proc)
        log.close()
    if args.out:
        with open(args.out, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(samples[0]))
            writer.writeheader()
            writer.writerows(samples)
    n = len(samples)
    if n < 8:
        print("too few samples for a verdict")
        return 1
    q2 = samples[n // 4: n // 2]
    q4 = samples[3 * n // 4:]
    rss2, rss4 = statistics.mean(s["rss_mb"] for s in q2), statistics.mean(s["rss_mb"] for s in q4)
    fps2, fps4 = statistics.mean(s["fps"] for s in q2), statistics.mean(s["fps"] for s in q4)
    rss_ok = abs(rss4 - rss2) <= 0.05 * rss2
    fps_ok = fps4 >= 0.9 * fps2
    print(f"\nsecond quarter: RSS {rss2:.1f} MB, {fps2:.1f} frames/s; last quarter: RSS {rss4:.1f} MB, "
          f"{fps4:.1f} frames/s")
    print(f"RSS flat (within 5%): {'yes' if rss_ok else 'NO'} ({(rss4 / rss2 - 1) * 100:+.1f}%); "
          f"throughput kept (>= 90%): {'yes' if fps_ok else 'NO'} ({(fps4 / fps2 - 1) * 100:+.1f}%); "
          f"episodes committed: {samples[-1]['episodes']:.0f}; exit code of the daemon: {proc.returncode}")
    compare_ok = True
    if baseline is not None and baseline[2]:
        base = baseline[2]
        rss_all = [s["rss_mb"] for s in samples]
        ratio_mean = statistics.mean(rss_all) / statistics.mean(base)
        ratio_peak = max(rss_all) / max(base)
        compare_ok = ratio_peak <= 1.10
        print(f"daemon RSS with exports every {args.export_every} episodes vs exports off: mean "
              f"{statistics.mean(rss_all):.1f} vs {statistics.mean(base):.1f} MB ({(ratio_mean - 1) * 100:+.1f}%), "
              f"peak {max(rss_all):.1f} vs {max(base):.1f} MB ({(ratio_peak - 1) * 100:+.1f}%); within 10%: "
              f"{'yes' if compare_ok else 'NO'}")
        import json as _json
        exports = sum(1 for line in (folder / "daemon.log").read_text().splitlines()
                      if line.startswith("{") and _json.loads(line).get("event") == "export")
        print(f"exports during the soak: {exports}")
    if args.keep:
        print(f"kept {folder}")
    else:
        import shutil
        shutil.rmtree(folder, ignore_errors=True)
    return 0 if rss_ok and fps_ok and compare_ok and proc.returncode == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
