"""Crash tests with real processes: SIGKILL `demoforge generate` at random moments, resume, check invariants."""

from __future__ import annotations

import random
import signal
import subprocess
import time
import tracemalloc

import pytest

import toy_tasks  # noqa: F401
from demoforge.pipeline.executor import derive_seed
from demoforge.pipeline.job import JobSpec, VideoSettings
from demoforge.pipeline.runner import run_job
from demoforge.pipeline.tasks.registry import TaskEntry
from demoforge.storage.catalog import Catalog
from helpers import cli_env, committed_files, demoforge_argv

pytestmark = pytest.mark.slow

EPISODES = 14
ARGS = ("generate", "--task", "toy-point", "--episodes", str(EPISODES), "--codec", "h264",
        "--option", "step_sleep=0.004", "--option", "steps=30")


def catalog_rows(store):
    catalog = Catalog(store)
    try:
        return catalog.committed(), catalog.attempts(("staging",)), catalog.summary()
    finally:
        catalog.close()


def test_sigkill_at_random_moments_never_loses_or_alters_committed_episodes(tmp_path):
    rng = random.Random(1234)
    store = tmp_path / "store"
    # Each delay profile widens one stage's window so kills land mid-episode, mid-encode and mid-commit.
    profiles = ["", "encode:0.01", "commit:0.25", "write:0.005"]
    kills = 0
    interrupted_seen = 0
    before: dict[str, dict[str, bytes]] = {}
    for trial in range(40):
        if kills >= 12:
            break
        profile = profiles[trial % len(profiles)]
        proc = subprocess.Popen(demoforge_argv(*ARGS, "--store", str(store)),
                                env=cli_env(DEMOFORGE_STAGE_DELAY=profile), stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        # Kill at a random moment after the process has started working (start-up time varies with load).
        deadline = time.monotonic() + 120
        while not (store / "catalog.sqlite").exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(rng.uniform(0.3, 2.5))
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
            kills += 1
        proc.communicate(timeout=60)
        if (store / "catalog.sqlite").exists() and catalog_rows(store)[1]:
            interrupted_seen += 1  # this kill left an attempt in flight (staging) for recovery to clean
        after = committed_files(store)
        # Committed episodes never disappear and their bytes never change.
        for episode_id, files in before.items():
            assert after.get(episode_id) == files, f"trial {trial}: committed {episode_id} lost or altered"
        before = after
        if len(after) >= EPISODES:
            # The job finished before this kill; start over on a fresh store to keep killing.
            store = tmp_path / f"store{trial}"
            before = {}
    assert kills >= 10
    # Resume every store to completion and compare with a clean, uninterrupted run.
    clean = tmp_path / "clean"
    run_job(JobSpec(task="toy-point", episodes=EPISODES, video=VideoSettings(codec="h264"),
                    task_options={"step_sleep": 0.004, "steps": 30}), clean)
    clean_rows, _, _ = catalog_rows(clean)
    expected = [(r.episode_index, r.attempt, r.seed, r.frames, r.content_hash) for r in clean_rows]
    for candidate in sorted(tmp_path.glob("store*")):
        done = subprocess.run(demoforge_argv(*ARGS, "--store", str(candidate)), env=cli_env(),
                              stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr
        rows, staging_rows, summary = catalog_rows(candidate)
        assert not staging_rows
        assert [(r.episode_index, r.attempt, r.seed, r.frames, r.content_hash) for r in rows] == expected
        assert [r.seed for r in rows] == [derive_seed(0, i, 0) for i in range(EPISODES)]
        leftovers = {p.name for p in (candidate / "staging.zarr" / "episodes").iterdir() if p.is_dir()}
        assert leftovers == {r.episode_id for r in rows}
        assert not list(candidate.rglob("*.partial"))
        verify = subprocess.run(demoforge_argv("verify", "--store", str(candidate)), env=cli_env(),
                                capture_output=True, text=True, timeout=300)
        assert verify.returncode == 0, verify.stdout
    assert interrupted_seen >= 6  # most kills landed while attempts were in flight


def test_sigint_stops_cleanly_keeping_committed_episodes(tmp_path):
    store = tmp_path / "store"
    proc = subprocess.Popen(demoforge_argv(*ARGS, "--store", str(store)), env=cli_env(),
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        time.sleep(0.2)
        if (store / "catalog.sqlite").exists() and len(catalog_rows(store)[0]) >= 2:
            break
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert "stopped:" in out and "re-run the same command to resume" in out
    rows, staging_rows, summary = catalog_rows(store)
    assert 2 <= len(rows) < EPISODES and not staging_rows
    assert set(summary["discarded_by_reason"]) <= {"interrupted"}


def test_slow_writer_blocks_the_producer_and_memory_stays_bounded(tmp_path, monkeypatch, register_task):
    """A writer slower than the env: every frame still arrives, the env waits for the writer and memory is
    bounded by the queues."""
    size, steps, episodes, queue, write_delay = 256, 300, 2, 16, 0.01
    monkeypatch.setenv("DEMOFORGE_STAGE_DELAY", f"write:{write_delay}")
    frame_bytes = size * size * 3
    stepped_at: list[float] = []

    class TimedEnv(toy_tasks.CameraPointEnv):
        def step(self, action):
            stepped_at.append(time.monotonic())
            return super().step(action)

    register_task(TaskEntry(name="toy-timed", defaults=toy_tasks.DEFAULTS, describe=toy_tasks.describe,
                            make_env=lambda o: TimedEnv(dict(o))))
    spec = JobSpec(task="toy-timed", episodes=episodes, video=VideoSettings(codec="h264", crf=35),
                   task_options={"size": size, "steps": steps}, queue_frames=queue)
    tracemalloc.start()
    try:
        report = run_job(spec, tmp_path / "store")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    produced = steps * episodes
    assert report.frames_this_run == produced == len(stepped_at)  # nothing dropped
    rows, _, _ = catalog_rows(tmp_path / "store")
    assert [r.frames for r in rows] == [steps] * episodes
    # Held at once: at most the queues' frames plus encoder buffers. Bound: 3 queues x 16 frames + 64 frames
    # of slack (2 x 300 frames of 196 KiB = 118 MiB went through).
    ahead = 3 * queue + 64
    bound = ahead * frame_bytes
    assert peak < bound, f"peak traced memory {peak / 2**20:.1f} MiB exceeds {bound / 2**20:.1f} MiB"
    # The env was paced by the writer: it can run at most `ahead` frames in front of it, so its steps span at
    # least the writer's delay over the other frames. (Load only stretches this; an env that was not held
    # back steps all 600 frames in about half that.)
    assert stepped_at[-1] - stepped_at[0] >= (produced - ahead) * write_delay
