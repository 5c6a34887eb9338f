"""Crash tests with real processes: SIGKILL `demoforge generate` at random moments, resume, check invariants."""

from __future__ import annotations

import random
import signal
import subprocess
import time
import tracemalloc
from pathlib import Path

import pytest

import toy_tasks  # noqa: F401
from demoforge.pipeline.job import JobSpec, VideoSettings
from demoforge.pipeline.runner import run_job
from demoforge.pipeline.tasks.registry import TaskEntry
from demoforge.stages.executor import derive_seed
from demoforge.storage.crash_invariants import (
    StoreSnapshot,
    attempt_rows,
    check_committed_kept,
    check_resumed_store,
    identities,
    snapshot,
)
from demoforge.storage.store import open_store
from demoforge.storage.schema import AttemptState
from helpers import cli_env, demoforge_argv, kill_after_start

pytestmark = pytest.mark.slow

EPISODES = 14
ARGS = ("generate", "--task", "toy-point", "--episodes", str(EPISODES), "--codec", "h264",
        "--option", "step_sleep=0.004", "--option", "steps=30")


def catalog_rows(store):
    with open_store(store) as view:
        return view.committed(), view.attempts((AttemptState.STAGING,)), view.summary()


@pytest.mark.campaign  # random kill moments (tools/crash_campaign.py is the long one); the suite's kill tests kill at events
def test_sigkill_at_random_moments_never_loses_or_alters_committed_episodes(tmp_path) -> None:
    """The invariants are storage/crash_invariants.py's, the same ones tools/crash_campaign.py checks."""
    rng = random.Random(1234)
    store = tmp_path / "store"
    # Each delay profile widens one stage's window so kills land mid-episode, mid-encode and mid-commit.
    profiles = ["", "encode:0.01", "commit:0.25", "write:0.005"]
    kills = 0
    interrupted_seen = 0
    before = StoreSnapshot()
    last_kill: dict[Path, StoreSnapshot] = {}  # each store as its last kill left it
    for trial in range(40):
        if kills >= 12:
            break
        profile = profiles[trial % len(profiles)]
        # Kill at a random moment after the process has started working.
        if kill_after_start(demoforge_argv(*ARGS, "--store", str(store)), store, rng.uniform(0.3, 2.5),
                            env=cli_env(DEMOFORGE_STAGE_DELAY=profile)):
            kills += 1
        if any(r.state == AttemptState.STAGING for r in attempt_rows(store) or []):
            interrupted_seen += 1  # this kill left an attempt in flight (staging) for recovery to clean
        after = snapshot(store)
        # Committed episodes never disappear and their bytes never change.
        assert not check_committed_kept(before, after), f"trial {trial}: {check_committed_kept(before, after)}"
        last_kill[store] = after
        before = after
        if after.committed >= EPISODES:
            # The job finished before this kill; start over on a fresh store to keep killing.
            store = tmp_path / f"store{trial}"
            before = StoreSnapshot()
    assert kills >= 10
    # Resume every store to completion and compare with a clean, uninterrupted run.
    clean = tmp_path / "clean"
    run_job(JobSpec(task="toy-point", episodes=EPISODES, video=VideoSettings(codec="h264"),
                    task_options={"step_sleep": 0.004, "steps": 30}), clean)
    reference = identities(attempt_rows(clean))
    assert sorted(reference) == list(range(EPISODES))
    assert [reference[i][1] for i in range(EPISODES)] == [derive_seed(0, i, 0) for i in range(EPISODES)]
    for candidate in sorted(tmp_path.glob("store*")):
        done = subprocess.run(demoforge_argv(*ARGS, "--store", str(candidate)), env=cli_env(),
                              stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr
        violations = check_resumed_store(candidate, target=EPISODES, before=last_kill.get(candidate),
                                         reference=reference)
        assert not violations, violations
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


def test_slow_writer_blocks_the_producer_and_memory_stays_bounded(tmp_path, monkeypatch, register_task) -> None:
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
