"""Segment-aware training sampling (storage/sampling/__init__.py): the window index against the frame-by-frame
definition, uniformity, the offline sampler through LeRobotDataset and a DataLoader, the online sampler on
a live store written by a real ``demoforge generate`` process."""

from __future__ import annotations

import shutil
import signal
import subprocess
import time

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import toy_tasks  # noqa: F401
from demoforge.pipeline.job import JobSpec, VideoSettings
from demoforge.pipeline.runner import run_job
from demoforge.storage.catalog import Catalog
from demoforge.storage.lerobot.export import export_store
from demoforge.storage.store import open_store
from demoforge.storage.sampling import (MODES, NoEligibleWindowError, OnlineWindowSampler, SegmentWindowSampler,
                                        WindowIndex, segments_from_frames, window_is_eligible)
from demoforge.storage.schema import AttemptState
from helpers import cli_env, demoforge_argv

STEPS = 24  # toy-point: two segments of 12 frames
EPISODES = 4


# ------------------------------------------------------------------------------ synthetic episodes
@st.composite
def episode_frames(draw):
    """Per-frame (valid, segment_id) of one episode: segments of 1..9 frames, non-decreasing ids, with
    occasional unrecorded frames (valid 0, id -1) and occasional empty episodes."""
    parts = draw(st.lists(st.tuples(st.sampled_from(["next", "next", "next", "gap"]), st.integers(1, 9)),
                          max_size=6))
    valid, seg, sid = [], [], 0
    for kind, n in parts:
        if kind == "gap":
            valid += [0] * n
            seg += [-1] * n
        else:
            valid += [1] * n
            seg += [sid] * n
            sid += 1
    return np.array(valid, np.int64), np.array(seg, np.int64)


def build_index(episodes, mode, chunk, splits=()):
    """Index the episodes, adding them in batches cut at ``splits`` (incremental extension)."""
    index = WindowIndex(mode, chunk)
    bounds = [0, *sorted(set(s for s in splits if 0 < s < len(episodes))), len(episodes)]
    offset = 0
    offsets = []
    for lo, hi in zip(bounds, bounds[1:]):
        batch = episodes[lo:hi]
        valid = np.concatenate([v for v, _ in batch]) if batch else np.zeros(0, np.int64)
        seg = np.concatenate([s for _, s in batch]) if batch else np.zeros(0, np.int64)
        ep = np.concatenate([np.full(len(v), lo + i) for i, (v, _) in enumerate(batch)]) if batch else seg
        for v, _ in batch:
            offsets.append(offset)
            offset += len(v)
        pos = np.arange(len(valid)) + (offsets[lo] if batch else 0)
        start, end, first = segments_from_frames(valid, seg, episode=ep, position=pos)
        index.extend(start, end, ep[first], hi - lo)
    return index, offsets


def brute_force(episodes, offsets, mode, chunk):
    return {(e, offsets[e] + s) for e, (valid, seg) in enumerate(episodes) for s in range(len(seg) - chunk + 1)
            if window_is_eligible(mode, valid[s:s + chunk], seg[s:s + chunk])}


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(episodes=st.lists(episode_frames(), max_size=8), chunk=st.integers(1, 10),
       mode=st.sampled_from(MODES), splits=st.lists(st.integers(0, 8), max_size=3), seed=st.integers(0, 2**32))
def test_index_holds_exactly_the_defined_windows_and_samples_only_them(episodes, chunk, mode, splits, seed):
    if mode == "boundary" and chunk < 2:
        with pytest.raises(ValueError, match="chunk_size >= 2"):
            WindowIndex(mode, chunk)
        return
    index, offsets = build_index(episodes, mode, chunk, splits)
    expected = brute_force(episodes, offsets, mode, chunk)
    windows = list(index.windows())
    assert len(windows) == len(set(windows)) == index.total_windows
    assert set(windows) == expected
    # Built in one go or extended batch by batch: the same index, the same draws.
    whole, _ = build_index(episodes, mode, chunk)
    assert list(whole.windows()) == windows
    if not expected:
        with pytest.raises(NoEligibleWindowError):
            index.sample(np.random.default_rng(seed), 1)
        return
    frames = {e: ep for e, ep in enumerate(episodes)}
    for weighting in ("episode", "window"):
        slots, starts = index.sample(np.random.default_rng(seed), 200, weighting)
        s2, p2 = whole.sample(np.random.default_rng(seed), 200, weighting)
        assert np.array_equal(slots, s2) and np.array_equal(starts, p2)
        for e, p in zip(slots.tolist(), starts.tolist()):
            valid, seg = frames[e]
            local = p - offsets[e]
            # in one episode, every frame valid, and the mode's segment structure
            assert 0 <= local and local + chunk <= len(seg)
            v, s = valid[local:local + chunk], seg[local:local + chunk]
            assert np.all(v == 1) and np.all(s >= 0)
            if mode == "segment":
                assert len(set(s.tolist())) == 1
            elif mode == "boundary":
                # frames of >= 2 segments: a segment ends inside the window (not on its last frame) and the
                # next one starts on the following frame
                ends = np.flatnonzero(s[1:] != s[:-1])
                assert len(ends) >= 1 and np.all(s[ends + 1] == s[ends] + 1)


@settings(max_examples=60, deadline=None)
@given(episodes=st.lists(episode_frames(), max_size=8), chunk=st.integers(2, 10))
def test_every_valid_window_is_a_segment_window_or_a_boundary_window(episodes, chunk):
    counts = {m: build_index(episodes, m, chunk)[0] for m in MODES}
    assert counts["episode"].total_windows == counts["segment"].total_windows + counts["boundary"].total_windows
    assert not set(counts["segment"].windows()) & set(counts["boundary"].windows())


def chisquare_p(observed, expected):
    """p-value of Pearson's chi-square goodness-of-fit statistic (dof = categories - 1)."""
    from scipy.special import chdtrc

    observed, expected = np.asarray(observed, float), np.asarray(expected, float)
    return float(chdtrc(len(observed) - 1, np.sum((observed - expected) ** 2 / expected)))


def _varied_episodes(seed=7, n=40):
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        lengths = rng.integers(3, 40, size=rng.integers(1, 5))
        out.append((np.ones(lengths.sum(), np.int64), np.repeat(np.arange(len(lengths)), lengths)))
    return out


@pytest.mark.parametrize("mode,chunk", [("episode", 8), ("segment", 4), ("boundary", 6)])
def test_sampling_is_uniform_in_the_chosen_sense(mode, chunk):
    """Chi-square goodness of fit, fixed seeds, rejection threshold p < 0.001. Each weighting's counts fit
    its own distribution and are rejected (p < 1e-6) under the other's: the test can tell them apart."""
    episodes = _varied_episodes()
    index, _ = build_index(episodes, mode, chunk)
    windows = list(index.windows())
    position = {w: k for k, w in enumerate(windows)}
    per_episode = index.episode_windows()
    p_window = np.full(len(windows), 1 / len(windows))
    p_episode = np.array([1 / len(per_episode) / per_episode[e] for e, _ in windows])
    assert len(set(per_episode.values())) > 1  # episodes differ, so the two weightings differ
    n = 40 * len(windows)
    for weighting, p_own, p_other in (("window", p_window, p_episode), ("episode", p_episode, p_window)):
        slots, starts = index.sample(np.random.default_rng(12345), n, weighting)
        counts = np.bincount([position[w] for w in zip(slots.tolist(), starts.tolist())], minlength=len(windows))
        assert chisquare_p(counts, n * p_own) > 1e-3, weighting
        assert chisquare_p(counts, n * p_other) < 1e-6, weighting


def test_extending_one_episode_at_a_time_builds_the_same_index_as_one_batch():
    """What the online sampler relies on as episodes commit one by one: appending each episode's segments to
    the index gives the index one batch would, and the same draws. (Costs: per-append time and per-batch time
    against index size are printed by tools/bench_sampling.py, not asserted: timings flake on a loaded
    machine.)"""
    n, length, chunk = 2000, 150, 16
    start = np.arange(2 * n) * length
    end, slot = start + length, np.repeat(np.arange(n), 2)
    incremental = WindowIndex("segment", chunk)
    for k in range(n):
        incremental.extend(start[2 * k:2 * k + 2], end[2 * k:2 * k + 2], slot[2 * k:2 * k + 2], 1)
    whole = WindowIndex("segment", chunk)
    whole.extend(start, end, slot, n)
    assert incremental.total_windows == whole.total_windows == n * 2 * (length - chunk + 1)
    assert incremental.episode_windows() == whole.episode_windows()
    assert list(incremental.windows()) == list(whole.windows())
    for weighting in ("episode", "window"):
        a = incremental.sample(np.random.default_rng(3), 256, weighting)
        b = whole.sample(np.random.default_rng(3), 256, weighting)
        assert all(np.array_equal(x, y) for x, y in zip(a, b))


# ------------------------------------------------------------------------------ a real exported dataset
@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    base = tmp_path_factory.mktemp("sampling")
    store, out = base / "store", base / "dataset"
    run_job(JobSpec(task="toy-point", episodes=EPISODES, task_options={"steps": STEPS, "size": 16},
                    video=VideoSettings(codec="h264")), store)
    export_store(store, out)
    return store, out


def _load(root, **kw):
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    return LeRobotDataset("local/sampling", root=root, video_backend="pyav", **kw)


def _collate(items):
    keys = [k for k in items[0] if k.startswith(("annotation.", "episode_index", "index"))]
    return {k: torch.stack([item[k] for item in items]) for k in keys}


@pytest.mark.slow
def test_lerobot_dataset_items_are_whole_windows_of_the_mode(exported):
    _store, out = exported
    keys = ("annotation.valid", "annotation.segment_id", "annotation.segment_end", "episode_index")
    longest = 10
    dataset = _load(out, delta_timestamps=SegmentWindowSampler(out, chunk_size=longest).delta_timestamps(*keys))
    for mode, chunk in (("episode", 10), ("segment", 5), ("boundary", 4)):
        # one dataset loads 10 frames per item; a window of `chunk` frames is its first `chunk` frames
        sampler = SegmentWindowSampler.from_dataset(dataset, mode=mode, chunk_size=chunk, num_samples=12, seed=3)
        expected = {"episode": EPISODES * (STEPS - chunk + 1), "segment": EPISODES * 2 * (STEPS // 2 - chunk + 1),
                    "boundary": EPISODES * (chunk - 1)}[mode]
        assert sampler.total_windows == expected and len(sampler) == 12
        batches = list(torch.utils.data.DataLoader(dataset, batch_size=4, sampler=sampler, collate_fn=_collate))
        assert sum(len(b["index"]) for b in batches) == 12
        for batch in batches:
            batch = {k: v[:, :chunk] for k, v in batch.items() if v.dim() == 2}
            for k in keys:
                assert not batch[f"{k}_is_pad"].any()  # the whole window exists: never padded
            assert (batch["episode_index"] == batch["episode_index"][:, :1]).all()  # one episode
            assert (batch["annotation.valid"] == 1).all()
            seg = batch["annotation.segment_id"]
            ends_inside = batch["annotation.segment_end"][:, :-1].sum(dim=1)
            if mode == "segment":
                assert (seg == seg[:, :1]).all() and (ends_inside == 0).all()
            elif mode == "boundary":
                assert (seg[:, 0] != seg[:, -1]).all() and (ends_inside >= 1).all()


def test_windows_come_with_their_segment_and_progress_labels(exported):
    """labels(): each window frame's segment id and its progress through its episode and its segment, read from
    the annotation columns (no sidecar), equal to what those columns say frame by frame."""
    import pyarrow.parquet as pq

    _store, out = exported
    rows = pq.read_table(next(out.glob("data/chunk-*/file-*.parquet"))).to_pandas().set_index("index")
    for mode, chunk in (("episode", 6), ("segment", 3), ("boundary", 4)):
        sampler = SegmentWindowSampler(out, mode=mode, chunk_size=chunk)
        _episodes, starts = sampler.sample_windows(50, rng=2)
        labels = sampler.labels(starts)
        for w, start in enumerate(starts.tolist()):
            frames = rows.loc[start:start + chunk - 1]
            assert labels["segment_id"][w].tolist() == frames["annotation.segment_id"].tolist()
            length = int((rows["episode_index"] == frames["episode_index"].iloc[0]).sum())
            np.testing.assert_allclose(labels["episode_progress"][w],
                                       frames["annotation.episode_step"].to_numpy() / (length - 1), rtol=1e-6)
            assert np.all(np.diff(labels["segment_progress"][w][labels["segment_id"][w] == labels["segment_id"][w][0]])
                          > 0) or chunk == 1
        assert labels["episode_progress"].min() >= 0 and labels["episode_progress"].max() <= 1
    with pytest.raises(ValueError, match="absolute dataset index"):
        sampler.labels([10**9])


@pytest.mark.slow
def test_reproducible_and_the_same_with_dataloader_workers(exported):
    _store, out = exported

    def make(seed=0):
        return SegmentWindowSampler(out, mode="segment", chunk_size=4, num_samples=300, seed=seed)

    a, b = make(), make()
    first = list(a)
    assert first == list(b)                    # same seed, same sequence
    assert list(a) != first                    # __iter__ advanced the epoch
    a.set_epoch(0)
    assert list(a) == first                    # set_epoch repositions
    assert list(make(seed=1)) != first
    dataset = _load(out, delta_timestamps=a.delta_timestamps("annotation.segment_id"))
    seen = {}
    for workers in (0, 2):
        sampler = SegmentWindowSampler.from_dataset(dataset, mode="segment", chunk_size=4, num_samples=8, seed=5)
        # Forked workers, as a training script on Linux gets them. This process has threads of earlier tests,
        # and a fork taken while one of them holds a lock could hang a worker (Python warns of it): the timeout
        # makes that a failure, not a hung suite. (Spawned workers cost 13 s more here: each imports torch.)
        loader = torch.utils.data.DataLoader(dataset, batch_size=4, sampler=sampler, num_workers=workers,
                                             collate_fn=_collate, timeout=120 if workers else 0)
        seen[workers] = torch.cat([batch["index"] for batch in loader]).tolist()
    assert seen[0] == seen[2] == list(SegmentWindowSampler.from_dataset(
        dataset, mode="segment", chunk_size=4, num_samples=8, seed=5))


@pytest.mark.slow
def test_offline_window_weighting_is_uniform_over_the_dataset(exported) -> None:
    _store, out = exported
    sampler = SegmentWindowSampler(out, mode="boundary", chunk_size=5, num_samples=20_000, weighting="window")
    counts: dict[int, int] = {}
    for index in sampler:
        counts[index] = counts.get(index, 0) + 1
    starts = sorted(counts)
    assert len(starts) == sampler.total_windows == EPISODES * 4
    observed = np.array([counts[s] for s in starts])
    assert chisquare_p(observed, np.full(len(observed), observed.mean())) > 1e-3


@pytest.mark.slow
def test_no_eligible_window_is_a_clear_error(exported):
    _store, out = exported
    with pytest.raises(NoEligibleWindowError) as err:
        SegmentWindowSampler(out, mode="segment", chunk_size=STEPS // 2 + 1)
    message = str(err.value)
    assert "mode='segment'" in message and f"chunk_size={STEPS // 2 + 1}" in message
    assert f"longest segment found has {STEPS // 2} frames" in message
    with pytest.raises(NoEligibleWindowError, match=f"mode='episode' with chunk_size={STEPS + 1}"):
        SegmentWindowSampler(out, mode="episode", chunk_size=STEPS + 1)
    with pytest.raises(ValueError, match="chunk_size >= 2"):
        SegmentWindowSampler(out, mode="boundary", chunk_size=1)
    with pytest.raises(ValueError, match="unknown sampling mode"):
        SegmentWindowSampler(out, mode="skill", chunk_size=4)


# ------------------------------------------------------------------------------ online
@pytest.mark.slow
def test_online_sampler_reads_committed_frames_never_blocks_and_drops_quarantined_episodes(exported, tmp_path):
    store = tmp_path / "store"
    shutil.copytree(exported[0], store)
    catalog = Catalog(store)
    committed = [r.episode_id for r in catalog.committed()]
    with OnlineWindowSampler(store, mode="boundary", chunk_size=6, seed=1) as sampler:
        assert sampler.refresh() == EPISODES and sampler.refresh() == 0
        assert sorted(sampler.episode_ids) == sorted(committed)
        batch = sampler.read_windows(sampler.sample(32))
        assert batch["annotation.segment_id"].shape == (32, 6) and batch["action"].shape == (32, 6, 1)
        assert (batch["annotation.valid"] == 1).all()
        assert (batch["annotation.segment_id"][:, 0] != batch["annotation.segment_id"][:, -1]).all()
        assert (batch["annotation.episode_step"] == batch["start"][:, None] + np.arange(6)).all()
        frames = sampler.read_windows(sampler.sample(2), video=True)["observation.images.cam"]
        assert frames.shape == (2, 6, 16, 16, 3) and frames.dtype == np.uint8
        # A reader in the middle of a read transaction (as inside refresh) never blocks the writer (WAL): the
        # write commits at once (a blocked writer would wait for the 30 s busy timeout, then fail).
        assert sampler.store is not None
        reader = Catalog.open_read_only(store)  # a reader as the sampler's own (open_store mode "r")
        with reader.snapshot():
            assert reader.count(AttemptState.QUARANTINED) == 0
            catalog.quarantine(committed[0], "test: corrupt")  # blocked, it would fail: "database is locked" after 30 s
            assert reader.count(AttemptState.QUARANTINED) == 0
        reader.close()
        sampler.refresh()
        assert sorted(sampler.episode_ids) == sorted(committed[1:])
        assert committed[0] not in {w.episode_id for w in sampler.sample(500)}
    catalog.close()


def test_online_sampler_before_the_store_exists(tmp_path):
    sampler = OnlineWindowSampler(tmp_path / "not-yet", mode="segment", chunk_size=4)
    assert sampler.refresh() == 0
    with pytest.raises(NoEligibleWindowError, match=r"mode='segment' with chunk_size=4.* 0 episode\(s\)"):
        sampler.sample(8)
    with pytest.raises(TimeoutError):
        sampler.wait(timeout_s=0.3, poll_s=0.1)


def _catalog_rows(store):
    """(episode_id, state, frames, updated_at) of every attempt, read on a read-only connection."""
    with open_store(store) as view:
        return [(r.episode_id, r.state, r.frames, r.updated_at) for r in view.attempts()]


@pytest.mark.slow
def test_online_sampler_tails_a_live_generate_job(tmp_path) -> None:
    """A real ``demoforge generate`` process writes while an online sampler tails it (every 50 ms: refresh,
    sample 64 windows, read their frames from staging): it sees only committed episodes, each after its
    commit, the set grows while the job runs, and every window read is whole and valid. The writer keeps
    committing meanwhile. (Whether tailing slows the writer is a throughput ratio, measured by
    tools/bench_online_tail.py, not asserted here: a ratio flakes on a loaded machine.)"""
    args = ("--task", "toy-point", "--episodes", "2000", "--codec", "h264", "--option", "steps=30",
            "--option", "size=16", "--option", "fail_every=4")
    store = tmp_path / "store"
    proc = subprocess.Popen(demoforge_argv("generate", *args, "--store", str(store)), env=cli_env(),
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    sampler = OnlineWindowSampler(store, mode="boundary", chunk_size=8, seed=0, refresh_interval_s=None)
    first_seen: dict[str, float] = {}
    sizes: list[int] = []
    try:
        sampler.wait(timeout_s=90, poll_s=0.05)
        deadline = time.time() + 6.0
        while time.time() < deadline and len(sizes) < 400:
            before = len(sampler.episode_ids)
            sampler.refresh()
            windows = sampler.sample(64)
            now = time.time()
            for episode_id in sampler.episode_ids[before:]:
                first_seen[episode_id] = now
            batch = sampler.read_windows(windows)  # committed frames are complete and valid
            assert (batch["annotation.valid"] == 1).all()
            seg = batch["annotation.segment_id"]
            assert (seg[:, 0] != seg[:, -1]).all()
            sizes.append(len(sampler.episode_ids))
            time.sleep(0.05)
        assert proc.poll() is None, "the writer finished before the tailing ended"
    finally:
        proc.send_signal(signal.SIGTERM)
        _out, error = proc.communicate(timeout=60)
        sampler.close()
    assert proc.returncode == 0, error
    rows = _catalog_rows(store)
    state = {episode_id: s for episode_id, s, _f, _t in rows}
    committed_at = {episode_id: t for episode_id, s, _f, t in rows if s == "committed"}
    assert any(s == "discarded" for s in state.values())  # fail_every=4: discarded attempts exist
    # Only committed episodes, each first seen after its commit; the set grew while the job ran.
    assert first_seen and all(state[e] == "committed" for e in first_seen)
    assert all(first_seen[e] >= committed_at[e] for e in first_seen)
    assert sizes == sorted(sizes) and sizes[-1] >= sizes[0] + 5
    # The writer went on committing while it was tailed: episodes committed after tailing began.
    assert max(committed_at.values()) > min(first_seen.values())


@pytest.mark.slow
def test_docs_training_snippets_run(exported) -> None:
    """The loops of docs/sampling.md, on the toy export and its store (8-frame chunks, 2 steps, no worker
    processes: workers are covered by test_reproducible_and_the_same_with_dataloader_workers)."""
    import re
    from pathlib import Path

    store, out = exported
    text = (Path(__file__).resolve().parent.parent / "docs" / "sampling.md").read_text()
    *offline, online = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    assert len(offline) == 4  # one loop per mode, then the labels
    namespace: dict = {"__name__": "docs_sampling"}
    for block in offline:
        block = block.replace('"runs/fetch-dataset", 16, 1000', f"{str(out)!r}, 8, 2")
        block = block.replace("num_workers=2", "num_workers=0")
        exec(compile(block, "docs/sampling.md", "exec"), namespace)
    online = online.replace('"runs/fetch", 16, 1000', f"{str(store)!r}, 8, 2")
    exec(compile(online, "docs/sampling.md", "exec"), {"__name__": "docs_sampling"})


def test_online_windows_come_with_the_labels_the_offline_sampler_gives(exported):
    """OnlineWindowSampler.labels(): from the catalog records alone, the same segment ids and progress as the
    frames' own annotations say (the store's windows, read back with read_windows)."""
    store, _out = exported
    with OnlineWindowSampler(store, mode="segment", chunk_size=3, seed=4) as sampler:
        sampler.refresh()
        windows = sampler.sample(40)
        labels = sampler.labels(windows)
        frames = sampler.read_windows(windows)
        assert sampler.store is not None
        records = {r.episode_id: r for r in sampler.store.committed()}
    assert labels["segment_id"].tolist() == frames["annotation.segment_id"].tolist()
    for w, window in enumerate(windows):
        row = records[window.episode_id]
        assert row.frames is not None and row.record is not None
        np.testing.assert_allclose(labels["episode_progress"][w],
                                   frames["annotation.episode_step"][w] / (row.frames - 1), rtol=1e-6)
        lengths = {s["segment_id"]: s["end_step"] - s["start_step"] for s in row.record["segments"]}
        expected = [step / (lengths[seg] - 1) if lengths[seg] > 1 else 1.0
                    for step, seg in zip(frames["annotation.segment_step"][w], frames["annotation.segment_id"][w])]
        np.testing.assert_allclose(labels["segment_progress"][w], expected, rtol=1e-6)
