"""``demoforge view`` in a real browser: Debian's chromium driven headless by selenium through chromium-driver
(both installed by tools/setup.sh), on a generated fetch-pick-place dataset (AV1, LeRobot's default codec),
served and as a static folder opened from disk; a store with discarded attempts (h264); a depth camera's
colour-mapped preview (store, dataset, static folder, browser); hostile requests; a dataset published anew
while the viewer is open."""

from __future__ import annotations

import contextlib
import dataclasses
import http.client
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

import toy_tasks
from demoforge.pipeline.job import JobSpec, VideoSettings
from demoforge.pipeline.runner import run_job
from demoforge.pipeline.tasks.registry import CameraSpec, TaskEntry, register
from demoforge.stages.contract import RecordedObservation
from demoforge.stages.executor import derive_seed
from demoforge.storage.catalog import Catalog
from demoforge.storage.lerobot.export import export_store
from demoforge.pipeline.viewer.server import ViewerServer
from demoforge.pipeline.viewer.source import open_source
from helpers import REPO, cli_env, demoforge_argv, read_row, run_cli

pytestmark = pytest.mark.slow
CHROMIUM, CHROMEDRIVER = Path("/usr/bin/chromium"), Path("/usr/bin/chromedriver")
FETCH_OPTIONS = ("--option", "image_size=64", "--option", "cycles=1", "--option", "antialias=false")


# ------------------------------------------------------------------------------------------- fixtures
@pytest.fixture(scope="module")
def fetch(tmp_path_factory):
    """3 fetch-pick-place episodes (one pick-and-place cycle, 64x64 camera, AV1), exported."""
    base = tmp_path_factory.mktemp("fetch")
    store, dataset = base / "store", base / "dataset"
    result = run_cli("generate", "--task", "fetch-pick-place", "--episodes", "3", *FETCH_OPTIONS,
                     "--store", str(store), "--export", str(dataset))
    assert result.returncode == 0, result.stderr
    version = dataset.resolve()
    records = [json.loads(line) for line in (version / "meta/demoforge_episodes.jsonl").read_text().splitlines()]
    episodes = pq.read_table(version / "meta/episodes/chunk-000/file-000.parquet").to_pylist()
    fps = json.loads((version / "meta/info.json").read_text())["fps"]
    return {"store": store, "dataset": dataset, "records": records, "episodes": episodes, "fps": fps}


@pytest.fixture(scope="module")
def browser():
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    missing = [str(p) for p in (CHROMIUM, CHROMEDRIVER) if not p.exists()]
    if missing:
        pytest.fail(f"{', '.join(missing)} missing: run tools/setup.sh (installs Debian's chromium, chromium-driver)")
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--window-size=1400,1000", "--mute-audio"):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(str(CHROMEDRIVER)), options=options)
    yield driver
    driver.quit()


class Served:
    url = ""
    stderr = ""


@contextmanager
def served(path: Path, *extra: str, stop: signal.Signals = signal.SIGINT, ignore_sigint: bool = False):
    """``demoforge view PATH --port 0`` as a real process; yields its URL; Ctrl-C (or ``stop``) stops it.
    ``ignore_sigint``: start it with SIGINT ignored, as the child of a process that ignores it is."""
    def preexec() -> None:
        signal.signal(signal.SIGINT, signal.SIG_IGN)

    proc = subprocess.Popen(demoforge_argv("view", str(path), "--port", "0", *extra), env=cli_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL,
                            preexec_fn=preexec if ignore_sigint else None)
    result = Served()
    assert proc.stdout is not None and proc.stderr is not None
    try:
        line = proc.stdout.readline()
        assert "http://" in line, (line, proc.stderr.read() if proc.poll() is not None else "")
        result.url = line[line.index("http://"):].split()[0]
        yield result
    finally:
        proc.send_signal(stop)
        out, result.stderr = proc.communicate(timeout=30)
    assert proc.returncode == 0, result.stderr
    assert out.strip().endswith("stopped"), out


def wait(driver, condition, timeout=20.0, message=""):
    from selenium.webdriver.support.wait import WebDriverWait

    return WebDriverWait(driver, timeout, poll_frequency=0.05).until(condition, message)


def js(driver, script, *args):
    return driver.execute_script(script, *args)


VIDEO_STATE = """const v = document.querySelector('#videos video');
return v && {t: v.currentTime, paused: v.paused, seeking: v.seeking, ready: v.readyState,
             error: v.error && v.error.message,
             current: document.querySelector('#timeline .seg.current')?.dataset.index ?? null,
             row: document.querySelector('#segments tbody tr.current')?.dataset.index ?? null};"""


def settled(driver):
    s = js(driver, VIDEO_STATE)
    assert s is None or s["error"] is None, s
    return s if s and not s["seeking"] and s["ready"] >= 2 else False


def episode_rows(driver):
    return [[td.text for td in tr.find_elements("css selector", "td")]
            for tr in driver.find_elements("css selector", "#episodes tbody tr")]


# ------------------------------------------------------------------------------------ the page checks
def check_dataset_page(driver, url: str, fetch: dict) -> None:
    """The list matches the sidecar; clicking the third segment seeks to its first frame; playing moves the
    highlight on; the keyboard steps by frame and by segment; the filters filter."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    driver.get_log("browser")  # start from an empty console
    driver.get(url)
    records, fps = fetch["records"], fetch["fps"]
    wait(driver, lambda d: len(episode_rows(d)) == len(records), message="episode list")
    assert episode_rows(driver) == [[str(r["dataset_episode_index"]), str(r["episode_index"]), str(r["length"]),
                                     "success", str(r["seed"]), str(r["attempt"]), str(len(r["segments"])), ""]
                                    for r in records]

    # Episode 1 starts mid-file: LeRobot concatenates episodes, so the seek target includes its offset.
    index = 1
    record = records[index]
    offset = fetch["episodes"][index]["videos/observation.images.front/from_timestamp"]
    assert offset > 0
    driver.find_elements(By.CSS_SELECTOR, "#episodes tbody tr")[index].click()
    spans = wait(driver, lambda d: d.find_elements(By.CSS_SELECTOR, "#timeline .seg") or False)
    assert [s.text for s in spans] == [s["name"] for s in record["segments"]]
    assert len(driver.find_elements(By.CSS_SELECTOR, "#segments tbody tr")) == len(record["segments"])
    assert len(driver.find_elements(By.CSS_SELECTOR, "#curves canvas")) >= 2  # action and state at least
    wait(driver, settled, message="first frame")

    third = record["segments"][2]
    spans[2].click()
    state = wait(driver, lambda d: (s := settled(d)) and s["current"] == "2" and s)
    assert abs(state["t"] - (offset + third["start_step"] / fps)) <= 0.5 / fps, (state, third, offset)
    assert state["paused"] and state["row"] == "2"
    assert driver.find_element(By.ID, "current-segment").text == third["name"]

    body = driver.find_element(By.TAG_NAME, "body")
    body.send_keys(Keys.SPACE)  # play: the highlight moves on to the fourth segment by itself
    moved = wait(driver, lambda d: (s := js(d, VIDEO_STATE))["current"] not in ("2", None) and s, timeout=15,
                 message="highlight did not move while playing")
    assert not moved["paused"] and int(moved["current"]) >= 3 and moved["row"] == moved["current"], moved
    assert moved["t"] >= offset + third["end_step"] / fps - 0.5 / fps
    body.send_keys(Keys.SPACE)
    wait(driver, lambda d: (s := settled(d)) and s["paused"], message="pause")

    spans[3].click()  # (playback may have run on into the fifth segment before the pause landed)
    wait(driver, lambda d: (s := settled(d)) and s["current"] == "3")
    body.send_keys("]")  # next segment
    fifth = record["segments"][4]
    state = wait(driver, lambda d: (s := settled(d)) and s["current"] == "4" and s)
    assert abs(state["t"] - (offset + fifth["start_step"] / fps)) <= 0.5 / fps
    body.send_keys(Keys.ARROW_RIGHT)  # one frame on
    state = wait(driver, lambda d: (s := settled(d)) and abs(s["t"] - state["t"] - 1 / fps) < 0.5 / fps and s)
    body.send_keys("[")  # back to this segment's start ...
    state = wait(driver, lambda d: (s := settled(d)) and abs(s["t"] - (offset + fifth["start_step"] / fps)) < 0.5 / fps
                 and s)
    assert state["current"] == "4"
    body.send_keys("[")  # ... and from there to the segment before
    state = wait(driver, lambda d: (s := settled(d)) and s["current"] == "3" and s)
    assert abs(state["t"] - (offset + record["segments"][3]["start_step"] / fps)) <= 0.5 / fps

    # Playing to the end stops on the episode's last frame, not in the next episode further down the file.
    length = record["length"]
    js(driver, "DemoforgeViewer.seekFrame(arguments[0]);", length - 8)
    wait(driver, lambda d: (s := settled(d)) and abs(s["t"] - (offset + (length - 8) / fps)) < 0.5 / fps)
    body.send_keys(Keys.SPACE)
    wait(driver, lambda d: not js(d, VIDEO_STATE)["paused"], message="play near the end")
    state = wait(driver, lambda d: (s := settled(d)) and s["paused"] and s, timeout=10, message="stop at the end")
    assert abs(state["t"] - (offset + (length - 1) / fps)) <= 0.5 / fps, \
        (state, offset, length, js(driver, "const s = DemoforgeViewer.state; return [s.key, s.length, s.frame];"))
    assert state["current"] == str(len(record["segments"]) - 1)

    # Filters: by outcome, by segment name.
    segment_filter = driver.find_element(By.ID, "filter-segment")
    segment_filter.send_keys("no-such-segment")
    wait(driver, lambda d: len(episode_rows(d)) == 0)
    segment_filter.clear()
    segment_filter.send_keys(record["segments"][2]["name"])
    wait(driver, lambda d: len(episode_rows(d)) == len(records))
    segment_filter.clear()
    driver.find_element(By.CSS_SELECTOR, "#filter-outcome option[value='success']").click()
    wait(driver, lambda d: len(episode_rows(d)) == len(records))
    # Nothing failed on the way: no script error, no resource refused (a CSP violation would show here).
    assert [e for e in driver.get_log("browser") if e["level"] == "SEVERE"] == []


# ----------------------------------------------------------------------------------------------- tests
def test_served_dataset_in_browser(fetch, browser):
    with served(fetch["dataset"]) as server:
        assert server.url.startswith("http://127.0.0.1:")
        check_dataset_page(browser, server.url, fetch)


def test_static_folder_opens_from_disk(fetch, browser, tmp_path):
    out = tmp_path / "site"
    result = run_cli("view", str(fetch["dataset"]), "--html", str(out))
    assert result.returncode == 0, result.stderr
    assert "index.html" in result.stdout
    assert (out / "files/videos/observation.images.front/chunk-000/file-000.mp4").read_bytes() == \
        (fetch["dataset"] / "videos/observation.images.front/chunk-000/file-000.mp4").read_bytes()
    check_dataset_page(browser, (out / "index.html").as_uri(), fetch)
    # Writing again replaces the folder; a foreign non-empty folder is refused.
    assert run_cli("view", str(fetch["dataset"]), "--html", str(out)).returncode == 0
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    refused = run_cli("view", str(fetch["dataset"]), "--html", str(foreign))
    assert refused.returncode == 2 and "refusing" in refused.stderr and (foreign / "notes.txt").exists()
    for inside in (fetch["dataset"] / "site", fetch["dataset"].resolve() / "site", fetch["dataset"].resolve().parent):
        refused = run_cli("view", str(fetch["dataset"]), "--html", str(inside))
        assert refused.returncode == 2 and "inside the dataset" in refused.stderr, refused.stderr
    assert not (fetch["dataset"] / "site").exists()


def test_reject_button_marks_episodes_beside_the_dataset(fetch, browser, tmp_path):
    """The page's reject button writes the dataset's rejected list (beside it; the dataset is untouched) and
    the list shows it; `demoforge edit --delete-rejected` then deletes those episodes (tests/test_edit.py)."""
    from selenium.webdriver.common.by import By

    from demoforge.storage.lerobot.rejected import read_rejections, rejected_list_path

    dataset = tmp_path / "dataset"
    shutil.copytree(f"{fetch['dataset']}.versions", tmp_path / "dataset.versions", symlinks=True)
    os.symlink(os.readlink(fetch["dataset"]), dataset)
    before = sorted((p.name, p.stat().st_size) for p in dataset.resolve().rglob("*"))
    source = open_source(dataset)
    server = ViewerServer(source, "127.0.0.1", 0).start()
    try:
        browser.get_log("browser")
        browser.get(server.url + "#episode=1")
        button = wait(browser, lambda d: (b := d.find_element(By.ID, "reject")).is_displayed() and b.is_enabled()
                      and b, message="reject button")
        assert button.text == "reject" and button.is_enabled()
        button.click()
        wait(browser, lambda d: d.find_element(By.ID, "reject").text == "un-reject", message="marked")
        rows = browser.find_elements(By.CSS_SELECTOR, "#episodes tbody tr")
        assert "rejected" in rows[1].get_attribute("class") and episode_rows(browser)[1][-1] == "rejected"
        assert "1 rejected" in browser.find_element(By.ID, "rejected-line").text
        (entry,) = read_rejections(rejected_list_path(dataset))
        assert (entry.dataset_index, entry.episode_id) == (1, fetch["records"][1]["staging_episode_id"])
        browser.find_element(By.ID, "reject").click()  # and back
        wait(browser, lambda d: d.find_element(By.ID, "reject").text == "reject", message="unmarked")
        assert read_rejections(rejected_list_path(dataset)) == []
        assert [e for e in browser.get_log("browser") if e["level"] == "SEVERE"] == []
    finally:
        server.close()
        source.close()
    assert sorted((p.name, p.stat().st_size) for p in dataset.resolve().rglob("*")) == before
    # A static folder shows the list but cannot change it: the button is disabled.
    site = tmp_path / "site"
    from demoforge.pipeline.viewer.static_site import write_site

    with contextlib.closing(open_source(dataset)) as opened:
        write_site(opened, site)
    browser.get((site / "index.html").as_uri() + "#episode=0")
    button = wait(browser, lambda d: (b := d.find_element(By.ID, "reject")).is_displayed() and b)
    assert not button.is_enabled()


@pytest.fixture(scope="module")
def toy_store(tmp_path_factory):
    """A toy-point store encoded with h264 in which some attempts fail (discarded with a reason)."""
    store = tmp_path_factory.mktemp("toy") / "store"
    spec = JobSpec(task="toy-point", episodes=3, task_options={"steps": 40, "size": 32, "fail_every": 2},
                   seed=0, max_attempts=6, video=VideoSettings(codec="h264"))
    run_job(spec, store)
    catalog = Catalog(store)
    try:
        rows = catalog.attempts()
    finally:
        catalog.close()
    assert {"committed", "discarded"} <= {r.state for r in rows}, [r.state for r in rows]
    return store, rows


def test_served_store_shows_discarded_attempts_and_plays_h264(toy_store, browser, tmp_path):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    store, rows = toy_store
    with served(store) as server:
        browser.get(server.url)
        wait(browser, lambda d: len(episode_rows(d)) == len(rows))
        keys = [tr.get_attribute("data-key") for tr in browser.find_elements(By.CSS_SELECTOR, "#episodes tbody tr")]
        assert keys == [r.episode_id for r in rows]
        discarded = next(r for r in rows if r.state == "discarded")
        outcomes = [cells[3] for cells in episode_rows(browser)]
        assert outcomes == ["success" if r.state == "committed" else r.terminal_reason for r in rows]

        browser.find_elements(By.CSS_SELECTOR, "#episodes tbody tr")[rows.index(discarded)].click()
        notice = wait(browser, lambda d: d.find_element(By.ID, "notice").text or False)
        assert discarded.reason in notice and "discarded" in notice
        assert not browser.find_elements(By.CSS_SELECTOR, "#videos video")

        committed = next(r for r in rows if r.state == "committed")
        browser.find_elements(By.CSS_SELECTOR, "#episodes tbody tr")[rows.index(committed)].click()
        wait(browser, lambda d: len(d.find_elements(By.CSS_SELECTOR, "#timeline .seg")) == 2)
        wait(browser, settled, message="h264 video")
        fps = 10
        second = committed.record["segments"][1]
        browser.find_elements(By.CSS_SELECTOR, "#timeline .seg")[1].click()
        state = wait(browser, lambda d: (s := settled(d)) and s["current"] == "1" and s)
        assert abs(state["t"] - second["start_step"] / fps) <= 0.5 / fps
        browser.find_element(By.TAG_NAME, "body").send_keys("[")
        wait(browser, lambda d: (s := settled(d)) and s["current"] == "0")
        browser.find_element(By.TAG_NAME, "body").send_keys(Keys.SPACE)
        moved = wait(browser, lambda d: (s := js(d, VIDEO_STATE))["current"] == "1" and s, timeout=15)
        assert not moved["paused"]

    # The static folder of a store: remuxed streams written as files, played from disk.
    site = tmp_path / "store-site"
    result = run_cli("view", str(store), "--html", str(site))
    assert result.returncode == 0, result.stderr
    assert sorted(p.name for p in (site / "media").iterdir()) == sorted(r.episode_id for r in rows
                                                                         if r.state == "committed")
    browser.get((site / "index.html").as_uri() + "#episode=" + committed.episode_id)
    wait(browser, lambda d: len(d.find_elements(By.CSS_SELECTOR, "#timeline .seg")) == 2)
    wait(browser, settled, message="remuxed h264 from disk")
    browser.find_elements(By.CSS_SELECTOR, "#timeline .seg")[1].click()
    state = wait(browser, lambda d: (s := settled(d)) and s["current"] == "1" and s)
    assert abs(state["t"] - second["start_step"] / fps) <= 0.5 / fps


class ExplodingPointEnv(toy_tasks.CameraPointEnv):
    """toy-point whose env raises on the fifth step of episode 0's first attempt (the retry commits)."""

    def step(self, action):
        if self._seed == derive_seed(0, 0, 0) and self.t == 4:
            raise RuntimeError("gripper servo 3 overheated at step 5")
        return super().step(action)


register(TaskEntry(name="toy-exploding", defaults=toy_tasks.DEFAULTS,
                   describe=lambda o: dataclasses.replace(toy_tasks.describe(o), name="toy-exploding"),
                   make_env=lambda o: ExplodingPointEnv(dict(o))))


def test_store_shows_the_error_text_of_a_failed_attempt(tmp_path, browser):
    from selenium.webdriver.common.by import By

    store = tmp_path / "store"
    run_job(JobSpec(task="toy-exploding", episodes=1, task_options={"steps": 12, "size": 32},
                    video=VideoSettings(codec="h264")), store)
    source = open_source(store)
    server = ViewerServer(source, "127.0.0.1", 0).start()
    try:
        entry, retry = source.entries()
        assert entry.state == "discarded" and entry.outcome == "error" and not entry.playable
        assert retry.state == "committed" and retry.playable
        browser.get(f"{server.url}#episode={entry.key}")
        text = wait(browser, lambda d: d.find_element(By.ID, "error-text").text or False)
        record = source.episode(entry.key).record
        assert text == f"{record['error_type']}: {record['error']}"
        assert "RuntimeError: gripper servo 3 overheated" in text
        assert browser.find_element(By.ID, "error-box").is_displayed()
        assert f"discarded because: {entry.reason}" in browser.find_element(By.ID, "notice").text
        assert entry.reason is not None and "gripper servo 3 overheated" in entry.reason
        assert [c.text for c in browser.find_elements(By.CSS_SELECTOR, "#episodes tbody td")][3] == "error"
    finally:
        server.close()
        source.close()


def test_dataset_not_written_by_demoforge_has_no_segments_but_plays(fetch, tmp_path):
    """A LeRobot dataset without demoforge's sidecar: episodes, videos and curves, no segments, no outcome."""
    root = tmp_path / "foreign"
    shutil.copytree(fetch["dataset"].resolve(), root)
    (root / "meta/demoforge_episodes.jsonl").unlink()
    (root / "meta/demoforge.json").unlink()
    source = open_source(root)
    try:
        entries = source.entries()
        assert [(e.dataset_index, e.length, e.outcome, e.segments) for e in entries] == \
            [(i, r["length"], "unknown", ()) for i, r in enumerate(fetch["records"])]
        assert source.summary.version is None and "no demoforge sidecar" in source.summary.notes[0]
        view = source.episode("1")
        assert view.videos[0].from_s == fetch["episodes"][1]["videos/observation.images.front/from_timestamp"]
        action = next(c for c in view.curves if c.name == "action")
        frames = pq.read_table(root / "data/chunk-000/file-000.parquet", columns=["action", "episode_index"])
        expected = [a for a, e in zip(frames["action"].to_pylist(), frames["episode_index"].to_pylist()) if e == 1]
        assert len(action.values) == fetch["records"][1]["length"] == len(expected)
        assert action.values == [[round(v, 6) for v in row] for row in expected]
    finally:
        source.close()


class TwoCameraPointEnv(toy_tasks.CameraPointEnv):
    """toy-point with a second camera showing the first one's picture inverted."""

    def demo_record(self, observation):
        recorded = super().demo_record(observation)
        return RecordedObservation(state=recorded.state, images={**recorded.images,
                                                                 "wrist": 255 - recorded.images["cam"]})


def _two_camera_info(options):
    info = toy_tasks.describe(options)
    return dataclasses.replace(info, name="toy-two-cameras",
                               cameras=(*info.cameras, CameraSpec("wrist", options["size"], options["size"])))


register(TaskEntry(name="toy-two-cameras", defaults=toy_tasks.DEFAULTS, describe=_two_camera_info,
                   make_env=lambda o: TwoCameraPointEnv(dict(o))))


def test_cameras_play_side_by_side_in_sync(tmp_path, browser):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    store, dataset = tmp_path / "store", tmp_path / "dataset"
    run_job(JobSpec(task="toy-two-cameras", episodes=2, task_options={"steps": 40, "size": 32}, seed=3,
                    video=VideoSettings(codec="h264")), store)
    export_store(store, dataset)
    fps = 10
    both = "return [...document.querySelectorAll('#videos video')].map(v => [v.currentTime, v.paused, v.seeking]);"
    with served(dataset) as server:
        browser.get(server.url + "#episode=1")
        wait(browser, lambda d: len(d.find_elements(By.CSS_SELECTOR, "#videos video")) == 2)
        assert [c.text for c in browser.find_elements(By.CSS_SELECTOR, "#videos figcaption")] == ["cam", "wrist"]
        wait(browser, settled)
        browser.find_elements(By.CSS_SELECTOR, "#timeline .seg")[1].click()
        wait(browser, lambda d: not any(v[2] for v in js(d, both)))
        (t0, _, _), (t1, _, _) = js(browser, both)
        assert t0 == t1 and abs(t0 - (4.0 + 20 / fps)) < 0.5 / fps  # episode 1 starts 40 frames into the files
        browser.find_elements(By.CSS_SELECTOR, "#timeline .seg")[0].click()
        browser.find_element(By.TAG_NAME, "body").send_keys(Keys.SPACE)
        gaps = []
        deadline = time.monotonic() + 2.5
        while time.monotonic() < deadline:
            (t0, p0, _), (t1, p1, _) = js(browser, both)
            assert not p0 and not p1
            gaps.append(abs(t0 - t1))
            time.sleep(0.1)
        assert max(gaps) <= 1.5 / fps, gaps  # the second camera follows the first within a frame and a half
        browser.find_element(By.TAG_NAME, "body").send_keys(Keys.SPACE)
        wait(browser, lambda d: (v := js(d, both)) and all(x[1] and not x[2] for x in v) and v[0][0] == v[1][0])


# ---------------------------------------------------------------------------------------------- depth
@pytest.fixture(scope="module")
def depth_fetch(tmp_path_factory):
    """2 fetch-pick-place episodes with a depth camera (lossless 12-bit HEVC, which Chromium does not play),
    exported; the staged depth codes of each episode, read straight from the store, are the reference."""
    from demoforge.storage import depth as depth_video
    from demoforge.storage.store import open_store

    base = tmp_path_factory.mktemp("depth")
    store, dataset = base / "store", base / "dataset"
    result = run_cli("generate", "--task", "fetch-pick-place", "--episodes", "2", *FETCH_OPTIONS,
                     "--option", "depth=true", "--store", str(store), "--export", str(dataset))
    assert result.returncode == 0, result.stderr
    codes, ids = {}, {}
    with open_store(store) as view:
        fingerprint, staging = view.require_job()
        for row in view.committed():
            staged = read_row(staging, row)
            codes[row.dataset_index] = np.stack(list(depth_video.iter_codes(staged.video["front_depth"])))
            ids[row.dataset_index] = row.episode_id
    version = dataset.resolve()
    episodes = pq.read_table(version / "meta/episodes/chunk-000/file-000.parquet").to_pylist()
    records = [json.loads(line) for line in (version / "meta/demoforge_episodes.jsonl").read_text().splitlines()]
    return {"store": store, "dataset": dataset, "codes": codes, "ids": ids, "identity": fingerprint.depth_video,
            "fps": fingerprint.fps, "episodes": episodes, "records": records}


def tree_state(root: Path) -> dict[str, tuple[int, int]]:
    """Every entry under ``root`` (following the dataset's OUT link once): size and modification time. SQLite's
    shared-memory index (``-shm``) is left out: every reader of a WAL catalog maps and touches it."""
    root = root.resolve()
    return {str(p.relative_to(root.parent)): (p.lstat().st_size, p.lstat().st_mtime_ns)
            for p in [root, *root.rglob("*")] if not p.name.endswith("-shm")}


def episode_payload(port: int, key: str) -> dict:
    status, _headers, body = request(port, f"/data/episode-{key}.js")
    assert status == 200
    return json.loads(body.decode().split(", ", 1)[1].rsplit(");", 1)[0])


def check_depth_preview(data: bytes, codes: np.ndarray, identity, fps: int, near: float, far: float) -> None:
    """H.264 a browser plays, one frame per episode frame at i / fps, and the colours of
    ``colourise(dequantize(codes), near, far)`` (the map ``inspect --plot`` draws) up to codec loss."""
    import av

    from demoforge.storage import depth as depth_video

    with av.open(io.BytesIO(data), mode="r") as container:
        stream = container.streams.video[0]
        assert stream.codec_context.name == "h264" and stream.codec_context.pix_fmt == "yuv420p"
        decoded = [(float((f.pts or 0) * (f.time_base or 0)), f.to_ndarray(format="rgb24"))
                   for f in container.decode(stream)]
    assert len(decoded) == len(codes)
    assert [round(t * fps, 3) for t, _ in decoded] == list(range(len(codes)))
    for i in (0, len(codes) // 2, len(codes) - 1):
        expected = depth_video.colourise(depth_video.dequantize(codes[i], identity), near, far).astype(int)
        got = decoded[i][1].astype(int)
        assert got.shape == expected.shape
        assert np.abs(got - expected).mean() < 6, i  # the whole frame, edges (chroma subsampling) included
        # Pixels inside areas of one colour (4:2:0 blurs colour only across edges), from every part of the range.
        h, w = codes[i].shape
        flat = [(y, x) for y in range(3, h - 3, 3) for x in range(3, w - 3, 3)
                if np.ptp(expected[y - 3:y + 4, x - 3:x + 4].reshape(-1, 3), axis=0).max() <= 2]
        metres = depth_video.dequantize(codes[i], identity)
        assert len({round(float(metres[y, x]), 1) for y, x in flat}) >= 3, "samples cover several distances"
        for y, x in flat:
            assert np.abs(got[y, x] - expected[y, x]).max() <= 10, (i, y, x, got[y, x], expected[y, x])


def test_depth_previews_from_store_and_dataset_are_colour_mapped_h264_and_nothing_is_written(depth_fetch, tmp_path):
    from demoforge.storage import depth as depth_video

    fps, identity = depth_fetch["fps"], depth_fetch["identity"]
    store, dataset = depth_fetch["store"], depth_fetch["dataset"]
    before = {**tree_state(store), **tree_state(dataset)}
    links = {dataset: os.readlink(dataset)}
    ranges = {}
    for path in (store, dataset):
        source = open_source(path)
        server = ViewerServer(source, "127.0.0.1", 0).start()
        try:
            for index, codes in depth_fetch["codes"].items():
                key = depth_fetch["ids"][index] if path == store else str(index)
                videos = episode_payload(server.port, key)["videos"]
                assert [(v["camera"], v["kind"]) for v in videos] == [("front", "rgb"), ("front_depth", "depth")]
                depth = videos[1]
                assert depth["url"] == f"media/{key}/front_depth.mp4" and depth["from_s"] == 0.0
                # One range for the whole episode: its 1st and 90th percentile, pixels with no depth in range
                # (the sky, at depth_max) left out.
                metres = depth_video.dequantize(codes, identity)
                inside = metres[(codes > 0) & (codes < 4095)]
                expected = np.percentile(inside, depth_video.COLOUR_PERCENTILES, method="inverted_cdf")
                assert (depth["near_m"], depth["far_m"]) == pytest.approx(tuple(expected), abs=1e-6)
                assert 0.1 < depth["near_m"] < depth["far_m"] < identity.depth_max
                status, headers, data = request(server.port, "/" + depth["url"])
                assert status == 200 and headers["Content-Type"] == "video/mp4"
                check_depth_preview(data, codes, identity, fps, depth["near_m"], depth["far_m"])
                status, headers, part = request(server.port, "/" + depth["url"], headers={"Range": "bytes=0-99"})
                assert status == 206 and part == data[:100]  # seekable like the other videos
                ranges[(path, index)] = (depth["near_m"], depth["far_m"])
            assert request(server.port, "/media/7/front_depth.mp4")[0] == 404
            assert request(server.port, f"/media/{key}/front_depth.webm")[0] == 404
        finally:
            server.close()
            source.close()
    assert ranges[(store, 1)] == ranges[(dataset, 1)]  # episode 1 lies mid-file in the dataset: its span only

    # The static folder carries the previews as files, like a store's remuxed streams.
    for path in (store, dataset):
        site = tmp_path / f"site-{path.name}"
        result = run_cli("view", str(path), "--html", str(site))
        assert result.returncode == 0, result.stderr
        for index, codes in depth_fetch["codes"].items():
            key = depth_fetch["ids"][index] if path == store else str(index)
            near, far = ranges[(path, index)]
            check_depth_preview((site / f"media/{key}/front_depth.mp4").read_bytes(), codes, identity, fps, near, far)
    # Read-only: not a file added, changed or touched in the store or the dataset.
    assert {**tree_state(store), **tree_state(dataset)} == before
    assert {dataset: os.readlink(dataset)} == links


def test_a_broken_depth_video_is_a_clear_error_not_a_crash(depth_fetch, tmp_path):
    """A dataset whose depth file was cut short: the episode's page request fails (500) while the server lives
    on and its RGB files are still served; ``--html`` stops with a few lines naming the episode and camera."""
    from demoforge.pipeline.viewer.files import ViewerError

    root = tmp_path / "cut"
    shutil.copytree(depth_fetch["dataset"].resolve(), root)
    video = root / "videos/observation.images.front_depth/chunk-000/file-000.mp4"
    data = video.read_bytes()
    video.write_bytes(data[:len(data) // 2])
    source = open_source(root)
    server = ViewerServer(source, "127.0.0.1", 0).start()
    try:
        with pytest.raises(ViewerError, match="episode 1, camera front_depth"):
            source.episode("1")
        assert request(server.port, "/data/episode-1.js")[0] == 500
        assert request(server.port, "/media/1/front_depth.mp4")[0] == 500
        assert request(server.port, "/files/videos/observation.images.front/chunk-000/file-000.mp4")[0] == 200
    finally:
        server.close()
        source.close()
    result = run_cli("view", str(root), "--html", str(tmp_path / "site"))
    assert result.returncode == 2 and "camera front_depth" in result.stderr, result.stderr
    assert "Traceback" not in result.stderr and not (tmp_path / "site").exists()


def test_depth_camera_plays_and_seeks_in_browser(depth_fetch, browser):
    from selenium.webdriver.common.by import By

    from demoforge.storage import depth as depth_video

    fps, index = depth_fetch["fps"], 1
    record, codes = depth_fetch["records"][index], depth_fetch["codes"][index]
    offset = depth_fetch["episodes"][index]["videos/observation.images.front/from_timestamp"]
    assert offset > 0  # the depth preview covers only this episode: it starts at 0, the RGB file does not
    source = open_source(depth_fetch["dataset"])
    try:
        depth = source.episode(str(index)).videos[1]
    finally:
        source.close()
    videos = """return [...document.querySelectorAll('#videos video')].map(v => ({kind: v.dataset.kind,
        t: v.currentTime, ready: v.readyState, seeking: v.seeking, error: v.error && v.error.message,
        duration: v.duration}));"""

    def both_settled(d):
        states = js(d, videos)
        assert all(s["error"] is None for s in states), states
        return len(states) == 2 and all(s["ready"] >= 2 and not s["seeking"] for s in states) and states

    with served(depth_fetch["dataset"]) as server:
        browser.get(f"{server.url}#episode={index}")
        states = wait(browser, both_settled, message="RGB and depth videos load")
        assert [c.text for c in browser.find_elements(By.CSS_SELECTOR, "#videos figcaption")] == \
            ["front", f"front_depth · depth {depth.near_m:.2f}–{depth.far_m:.2f} m"]
        assert [s["kind"] for s in states] == ["rgb", "depth"]
        assert abs(states[1]["duration"] - record["length"] / fps) <= 1 / fps, states
        segment = record["segments"][2]
        browser.find_elements(By.CSS_SELECTOR, "#timeline .seg")[2].click()
        rgb, shown = wait(browser, lambda d: (s := both_settled(d)) and
                          abs(s[1]["t"] - segment["start_step"] / fps) <= 0.5 / fps and s, message="depth seeks")
        assert abs(rgb["t"] - (offset + segment["start_step"] / fps)) <= 0.5 / fps
        # What Chromium shows is the colour map of that frame's depth.
        picture = np.array(js(browser, """const v = document.querySelector('#videos video[data-kind=depth]');
            const c = document.createElement('canvas'); c.width = v.videoWidth; c.height = v.videoHeight;
            const g = c.getContext('2d'); g.drawImage(v, 0, 0);
            return Array.from(g.getImageData(0, 0, c.width, c.height).data);"""), dtype=int)
        h, w = codes.shape[1:]
        picture = picture.reshape(h, w, 4)[..., :3]
        expected = depth_video.colourise(depth_video.dequantize(codes[segment["start_step"]], depth_fetch["identity"]),
                                         depth.near_m, depth.far_m).astype(int)
        assert np.abs(picture - expected).mean() < 10


# ------------------------------------------------------------------------------------------- serving
@pytest.fixture()
def hostile_dataset(fetch, tmp_path):
    """A copy of the dataset with links planted inside that point out, and a secret next to it."""
    root = tmp_path / "dataset"
    shutil.copytree(fetch["dataset"].resolve(), root)
    secret = tmp_path / "secret.txt"
    secret.write_text("SECRET-OUTSIDE")
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "secret.txt").write_text("SECRET-OUTSIDE-DIR")
    os.symlink("../../secret.txt", root / "meta" / "leak.txt")
    os.symlink(secret, root / "meta" / "abs_leak.txt")
    os.symlink("../../outside", root / "videos" / "outside")
    return root, secret


REFUSED, MISSING = 403, 404
HOSTILE = {
    # traversal, plain and encoded
    "/files/../secret.txt": REFUSED, "/files/../../secret.txt": REFUSED, "/files/meta/../../secret.txt": REFUSED,
    "/../secret.txt": REFUSED, "/files/%2e%2e/secret.txt": REFUSED, "/files/%2E%2E/%2e%2e/secret.txt": REFUSED,
    "/files/.%2e/secret.txt": REFUSED, "/files/./meta/info.json": REFUSED, "/files/%C0%AE%C0%AE/secret.txt": REFUSED,
    "/static/../../secret.txt": REFUSED, "/data/episode-../../secret.js": REFUSED, "/media/../secret.txt": REFUSED,
    "/media/x/../../secret.txt": REFUSED,
    # encoded slashes and backslashes, NUL, absolute paths
    "/files/..%2fsecret.txt": REFUSED, "/files/..%2F..%2Fsecret.txt": REFUSED,
    "/files/meta%2f..%2f..%2fsecret.txt": REFUSED, "/static/..%2f..%2fsecret.txt": REFUSED,
    "/data/episode-..%2f..%2fsecret.js": REFUSED, "/files/..\\..\\secret.txt": REFUSED,
    "/files/..%5c..%5csecret.txt": REFUSED, "/files/meta/info.json%00.mp4": REFUSED, "/files//etc/passwd": REFUSED,
    "/files/%2fetc%2fpasswd": REFUSED, "http://127.0.0.1/../secret.txt": REFUSED,
    # symlinks planted inside the dataset, pointing out (relative, absolute, a linked folder)
    "/files/meta/leak.txt": REFUSED, "/files/meta/abs_leak.txt": REFUSED, "/files/videos/outside/secret.txt": REFUSED,
    # names that are simply not files of the opened version
    "/files/%252e%252e/%252e%252e/secret.txt": MISSING, "/secret.txt": MISSING, "/files/meta/late.txt": MISSING,
}


def request(port: int, path: str, method: str = "GET", headers: dict | None = None):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.putrequest(method, path, skip_host="Host" in (headers or {}), skip_accept_encoding=True)
        for k, v in (headers or {}).items():
            conn.putheader(k, v)
        conn.endheaders()
        response = conn.getresponse()
        return response.status, dict(response.getheaders()), response.read()
    finally:
        conn.close()


def test_hostile_requests_are_refused_and_nothing_outside_is_read(hostile_dataset) -> None:
    root, secret = hostile_dataset
    opened: list[str] = []

    def audit(event, args):
        if event == "open" and isinstance(args[0], (str, bytes, os.PathLike)) and recording.is_set():
            opened.append(os.fsdecode(args[0]))

    recording = threading.Event()
    sys.addaudithook(audit)
    source = open_source(root)
    server = ViewerServer(source, "127.0.0.1", 0).start()
    try:
        (root / "meta" / "late.txt").write_text("planted after start")  # not pinned: never served
        recording.set()
        for path, expected in HOSTILE.items():
            status, _headers, body = request(server.port, path)
            assert status == expected, (path, status)
            assert b"SECRET" not in body and b"planted" not in body, path
        assert request(server.port, "/files/meta/info.json")[2] == (root / "meta/info.json").read_bytes()
        status, _headers, _body = request(server.port, "/files/meta/info.json", headers={"Host": "evil.example:80"})
        assert status == 403  # DNS rebinding: a loopback server answers loopback names only
        for method in ("POST", "PUT", "DELETE"):
            assert request(server.port, "/files/meta/info.json", method)[0] == 501  # read-only
        # The one write, the rejected list beside the dataset, answers loopback names only, like every request.
        assert request(server.port, "/api/rejected", "POST", {"Host": "evil.example:80", "Content-Length": "2",
                                                              "Content-Type": "application/json"})[0] == 403
        recording.clear()
    finally:
        server.close()
        source.close()
    outside = [p for p in opened if not any(os.path.realpath(p).startswith(str(base) + os.sep) for base in
                                             (root.resolve(), Path(sys.prefix).resolve(),
                                              Path(sys.base_prefix).resolve(), REPO))]
    assert outside == [] and not any(os.path.realpath(p) == str(secret) for p in opened), outside


def test_range_requests_serve_exact_bytes(fetch):
    source = open_source(fetch["dataset"])
    server = ViewerServer(source, "127.0.0.1", 0).start()
    rel = "videos/observation.images.front/chunk-000/file-000.mp4"
    data = (fetch["dataset"] / rel).read_bytes()
    try:
        status, headers, body = request(server.port, f"/files/{rel}")
        assert status == 200 and body == data and headers["Accept-Ranges"] == "bytes"
        status, headers, body = request(server.port, f"/files/{rel}", headers={"Range": "bytes=100-199"})
        assert status == 206 and body == data[100:200] and headers["Content-Range"] == f"bytes 100-199/{len(data)}"
        status, headers, body = request(server.port, f"/files/{rel}", headers={"Range": "bytes=-50"})
        assert status == 206 and body == data[-50:]
        status, headers, body = request(server.port, f"/files/{rel}", headers={"Range": f"bytes={len(data) - 10}-"})
        assert status == 206 and body == data[-10:]
        status, headers, _ = request(server.port, f"/files/{rel}", headers={"Range": f"bytes={len(data)}-"})
        assert status == 416 and headers["Content-Range"] == f"bytes */{len(data)}"
        status, headers, body = request(server.port, f"/files/{rel}", "HEAD")
        assert status == 200 and body == b"" and int(headers["Content-Length"]) == len(data)
    finally:
        server.close()
        source.close()


def test_open_page_keeps_its_version_while_new_ones_are_published(tmp_path):
    """Two more exports publish v2 and v3 and prune v1; a viewer opened on v1 still serves v1, byte for byte."""
    store, dataset = tmp_path / "store", tmp_path / "dataset"

    def grow(episodes: int) -> None:
        run_job(JobSpec(task="toy-point", episodes=episodes, task_options={"steps": 12, "size": 32},
                        video=VideoSettings(codec="h264")), store)
        export_store(store, dataset)

    grow(2)
    v1 = dataset.resolve()
    rel = "videos/observation.images.cam/chunk-000/file-000.mp4"
    video_v1 = (v1 / rel).read_bytes()
    source = open_source(dataset)
    server = ViewerServer(source, "127.0.0.1", 0).start()
    try:
        grow(3)
        grow(4)
        assert not v1.exists() and dataset.resolve() != v1  # v1 was pruned from disk
        status, _h, body = request(server.port, "/data/index.js")
        index = json.loads(body.decode().split(", ", 1)[1].rsplit(");", 1)[0])
        assert status == 200 and index["source"]["version"] == v1.name and len(index["episodes"]) == 2
        assert request(server.port, f"/files/{rel}")[2] == video_v1
        assert request(server.port, "/data/episode-1.js")[0] == 200
        assert request(server.port, "/data/episode-2.js")[0] == 404  # published later: not in this version
    finally:
        server.close()
        source.close()


def test_cli_errors_warning_and_help(tmp_path, fetch):
    missing = run_cli("view", str(tmp_path / "nothing-here"))
    assert missing.returncode == 2 and "does not exist" in missing.stderr and "Traceback" not in missing.stderr
    neither = run_cli("view", str(tmp_path))
    assert neither.returncode == 2 and "neither a demoforge store" in neither.stderr
    help_text = run_cli("view", "--help").stdout
    assert help_text.rstrip().splitlines()[-1].lstrip().startswith("demoforge view")
    assert "default: 127.0.0.1" in help_text and "default: 8765" in help_text
    with served(fetch["dataset"], "--host", "0.0.0.0") as server:  # listening beyond loopback is said loudly
        assert server.url.startswith("http://0.0.0.0:")
    assert "warning: serving on 0.0.0.0, not loopback" in server.stderr


@pytest.mark.parametrize("stop, ignore_sigint", [(signal.SIGTERM, False), (signal.SIGINT, True)])
def test_sigterm_and_an_inherited_ignored_sigint_stop_the_server(fetch, stop, ignore_sigint):
    """A service manager stops the viewer with SIGTERM; Ctrl-C stops it even when it was started by a process
    that ignores SIGINT (which a child inherits)."""
    with served(fetch["dataset"], stop=stop, ignore_sigint=ignore_sigint) as server:
        status, _headers, body = request(int(server.url.rsplit(":", 1)[1].strip("/")), "/")
        assert status == 200 and body


def test_a_built_wheel_carries_the_page(tmp_path):
    """The page is package data: a wheel built from the repository serves it once installed, off the repo."""
    src = tmp_path / "src"
    shutil.copytree(REPO, src, symlinks=True, ignore=shutil.ignore_patterns(
        ".git", ".venv", "__pycache__", "build", "*.egg-info", ".pytest_cache", ".hypothesis", "runs", "docs"))
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", str(src), "--no-deps", "--no-build-isolation",
                            "-q", "-w", str(tmp_path / "wheel")], capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stderr
    (wheel,) = (tmp_path / "wheel").glob("demoforge-*.whl")
    target = tmp_path / "installed"
    installed = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target),
                                str(wheel)], capture_output=True, text=True, timeout=300)
    assert installed.returncode == 0, installed.stderr
    probe = ("import demoforge.pipeline.viewer.pages as p, sys; assets = p.load_assets(); "
             "print(p.__file__); print(sorted((k, len(v)) for k, v in assets.items()))")
    env = {**cli_env(), "PYTHONPATH": str(target)}
    out = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=120,
                         cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    where, sizes = out.stdout.splitlines()
    assert where.startswith(str(target))
    static = REPO / "pipeline/viewer/static"
    assert sizes == str(sorted((p.name, p.stat().st_size) for p in static.iterdir()))
