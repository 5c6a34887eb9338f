"""`generate --keep-failures`: failed attempts committed as episodes of their own, counted apart from the job's
episodes, exported on request (`export --include`), labelled as failures everywhere a user meets them, replayed
to the same failure, and as crash-safe as any commit."""

from __future__ import annotations

import json
import signal
import sqlite3
import subprocess
import time
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

from demoforge.stages.executor import derive_seed
from helpers import cli_env, demoforge_argv, run_cli

FAIL_EVERY, EPISODES, MAX_ATTEMPTS = 2, 3, 6
ARGS = ("--task", "toy-point", "--episodes", str(EPISODES), "--max-attempts", str(MAX_ATTEMPTS), "--codec", "h264",
        "--option", "steps=12", "--option", "size=16", "--option", f"fail_every={FAIL_EVERY}")


def expected_failures(seed: int = 0) -> list[tuple[int, int]]:
    """(episode, attempt) of every failed attempt the job meets: toy-point fails the attempts whose env seed
    is divisible by fail_every (tests/toy_tasks.py), and the job stops at each episode's first success."""
    out = []
    for episode in range(EPISODES):
        for attempt in range(MAX_ATTEMPTS):
            if derive_seed(seed, episode, attempt) % FAIL_EVERY:
                break
            out.append((episode, attempt))
    return out


def rows(store: Path) -> list[tuple]:
    with sqlite3.connect(store / "catalog.sqlite") as db:
        return db.execute("SELECT episode_index, attempt, state, kept_failure, counted FROM attempts "
                          "ORDER BY episode_index, attempt").fetchall()


def sidecar(dataset: Path) -> list[dict]:
    return [json.loads(line) for line in (dataset / "meta/demoforge_episodes.jsonl").read_text().splitlines()]


def test_failures_are_kept_apart_exported_on_request_and_replay_to_the_same_failure(tmp_path) -> None:
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    from demoforge.storage.sampling import SegmentWindowSampler

    failures = expected_failures()
    assert failures, "the seeds give no failure: choose another fail_every"
    store, episodes, kept, both = (tmp_path / n for n in ("store", "episodes", "failures", "all"))
    done = run_cli("generate", *ARGS, "--keep-failures", "--store", str(store), "--export", str(episodes))
    assert done.returncode == 0, done.stderr
    assert f"{EPISODES}/{EPISODES} episodes committed" in done.stdout, done.stdout
    assert f"failures kept: {len(failures)} in the store (task_incomplete={len(failures)} this run)" in done.stdout
    # exactly the episodes' successes plus every failure met, each failure committed (none discarded)
    catalog = rows(store)
    assert [(e, a) for e, a, state, k, _ in catalog if k] == failures
    assert all(state in ("committed", "exported") for *_, state, _k, _c in catalog)
    assert sorted(e for e, _a, _s, k, _c in catalog if not k) == list(range(EPISODES))

    status = json.loads(run_cli("status", "--store", str(store), "--json").stdout)
    assert status["failures_kept"] == len(failures) and status["failures_kept_by_reason"] == {
        "task_incomplete": len(failures)}
    assert sum(status["attempts_by_state"].values()) == EPISODES  # the job's episodes only
    assert f"failures kept as episodes: {len(failures)}" in run_cli("status", "--store", str(store)).stdout

    # --export took the job's episodes; the failures go where they are asked for
    assert [r["kept_failure"] if "kept_failure" in r else False for r in sidecar(episodes)] == [False] * EPISODES
    only = run_cli("export", "--store", str(store), "--out", str(kept), "--include", "failures")
    assert only.returncode == 0, only.stderr
    assert f"{EPISODES} committed episode(s) not exported: job episodes" in only.stdout, only.stdout
    records = sidecar(kept)
    assert [(r["episode_index"], r["attempt"]) for r in records] == failures
    for r in records:
        assert r["kept_failure"] and not r["success"] and r["terminal_reason"] == "task_incomplete"
        assert r["failed_segment"] == {"segment_id": 1, "name": "retreat"}  # the plan ran out in its last segment
        assert r["failure_reason"] == "task_incomplete"
    frames = pq.read_table(next(kept.glob("data/chunk-*/file-*.parquet"))).to_pandas()
    assert not frames["next.success"].any()
    for _, episode in frames.groupby("episode_index"):
        assert episode["next.done"].tolist() == [False] * (len(episode) - 1) + [True]
    assert LeRobotDataset("demoforge/kept", root=kept, video_backend="pyav").meta.total_episodes == len(failures)

    everything = run_cli("export", "--store", str(store), "--out", str(both), "--include", "all")
    assert everything.returncode == 0, everything.stderr
    assert len(sidecar(both)) == EPISODES + len(failures)
    inspected = json.loads(run_cli("inspect", str(both), "--json").stdout)
    assert inspected["episodes"] == EPISODES
    assert inspected["outcomes"] == {"exported": EPISODES, "kept_failure:task_incomplete": len(failures)}
    selected = run_cli("edit", str(both), "--keep-where", "kept_failure and failed_segment == \"retreat\"",
                       "--out", str(tmp_path / "selected"))
    assert selected.returncode == 0, selected.stderr
    assert len(sidecar(tmp_path / "selected")) == len(failures)

    # the viewer lists each kept failure as one, in the store and in the dataset
    from demoforge.pipeline.viewer.source import open_source

    for path in (store, both):
        viewer = open_source(path)
        try:
            notes = [e.reason for e in viewer.entries() if e.outcome == "task_incomplete"]
        finally:
            getattr(viewer, "close", lambda: None)()
        assert notes == ["kept failure: task_incomplete (failed in segment 'retreat')"] * len(failures), path

    # the sampler draws from the job's episodes unless asked
    index_of = {int(r["dataset_episode_index"]): bool(r.get("kept_failure")) for r in sidecar(both)}
    for include, want in (("episodes", {False}), ("failures", {True}), ("all", {False, True})):
        sampler = SegmentWindowSampler(both, mode="episode", chunk_size=4, num_samples=400, include=include)
        assert {index_of[int(e)] for e in sampler.episode_of_slot} == want, include

    # a kept failure replays, step by step, to the same failure at the same frame
    replay = run_cli("replay", str(kept), "--json")
    assert replay.returncode == 0, replay.stdout + replay.stderr
    report = json.loads(replay.stdout)
    assert [e["verdict"] for e in report["episodes"]] == ["reproduced"] * len(failures)
    assert all(e["outcome"] == f"task_incomplete at frame {e['frames'] - 1}, in segment 'retreat'"
               for e in report["episodes"])

    again = run_cli("generate", *ARGS, "--keep-failures", "--store", str(store))
    assert again.returncode == 0 and "(0 this run" in again.stdout, again.stdout + again.stderr
    assert [(e, a, k) for e, a, _s, k, _c in rows(store)] == [(e, a, k) for e, a, _s, k, _c in catalog]


def test_a_kill_while_failures_are_committed_leaves_each_whole_or_absent(tmp_path) -> None:
    """Killed while its commits are slowed (the window between a failure's data being durable and its row
    flipping), then resumed: every kept failure verifies, none is kept twice, and the resumed job ends with
    exactly the failures an uninterrupted job keeps."""
    from demoforge.storage.store import open_store

    store = tmp_path / "store"
    argv = demoforge_argv("generate", *ARGS, "--keep-failures", "--store", str(store))
    marks = tmp_path / "commit-windows"  # each commit writes its episode id here as its window opens
    proc = subprocess.Popen(argv, env=cli_env(DEMOFORGE_STAGE_DELAY="commit:0.4", DEMOFORGE_WINDOW_MARKS=str(marks)),
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    episode, attempt = expected_failures()[0]
    first_failure = f"ep{episode:08d}-a{attempt:02d}"
    while first_failure not in (marks.read_text().split() if marks.exists() else []):  # durable, not yet flipped
        assert proc.poll() is None and time.monotonic() < deadline, "the first failure's commit never began"
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=60)
    at_kill = {(e, a) for e, a, state, k, _c in rows(store) if k}
    assert at_kill <= set(expected_failures()) and (episode, attempt) not in at_kill  # killed inside its window
    done = run_cli("generate", *ARGS, "--keep-failures", "--store", str(store))
    assert done.returncode == 0, done.stderr
    final = rows(store)
    assert [(e, a) for e, a, _s, k, _c in final if k] == expected_failures()
    with open_store(store) as view:
        assert view.verify().ok
        assert not view.attempts(("staging",))


def _staging_or_done(store: Path) -> list[tuple]:
    try:
        return rows(store)
    except sqlite3.OperationalError:  # the schema is being written
        return []


def test_keeping_failures_is_fixed_for_the_life_of_a_store_and_bad_include_is_refused(tmp_path) -> None:
    plain, keeping = tmp_path / "plain", tmp_path / "keeping"
    assert run_cli("generate", *ARGS, "--store", str(plain)).returncode == 0
    assert not any(k for *_, k, _c in rows(plain))  # without the flag failures are discarded, as before
    before = rows(plain)
    refused = run_cli("generate", *ARGS, "--keep-failures", "--store", str(plain))
    assert refused.returncode == 2, refused.stderr
    assert "was created without --keep-failures" in refused.stderr and "use a new --store" in refused.stderr
    assert "Traceback" not in refused.stderr and len(refused.stderr.strip().splitlines()) == 1, refused.stderr
    assert rows(plain) == before

    assert run_cli("generate", *ARGS, "--episodes", "1", "--keep-failures", "--store", str(keeping)).returncode == 0
    without = run_cli("generate", *ARGS, "--episodes", "1", "--store", str(keeping))
    assert without.returncode == 2 and "keeps failed attempts" in without.stderr, without.stderr

    bad = run_cli("export", "--store", str(plain), "--out", str(tmp_path / "d"), "--include", "failed")
    assert bad.returncode == 2 and "invalid choice: 'failed'" in bad.stderr, bad.stderr
    assert not (tmp_path / "d").exists()
    assert np.array_equal(np.array(rows(plain), dtype=object), np.array(before, dtype=object))
