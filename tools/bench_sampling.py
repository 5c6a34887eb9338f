"""Index build time and per-batch sampling time of storage/sampling/__init__.py against recomputing every window.

    .venv/bin/python tools/bench_sampling.py [--episodes 1000 10000 100000] [--frames 300] [--chunk 16]
                                             [--mode segment] [--batch 64] [--json]

Synthetic in-memory episodes of ``--frames`` frames, each split into 1-5 segments of random lengths (the last
segment takes the rest; a few segments are shorter than the chunk, so not every window is eligible).

Ours: the window index (``WindowIndex``) built once, from segment spans (what the online sampler and the
catalog give: O(#segments)) and from per-frame annotation arrays (what the offline sampler reads from the
data parquet: O(#frames)); appending one episode to the built index; drawing one batch (``--batch`` windows,
weighting "episode"), and that per-batch time over the first (smallest) size's ("vs first row": flat means
sampling cost does not grow with the index; tests/test_sampling.py asserts the index, not this timing).

Baseline, as the original engine did it: on every batch, walk the whole buffer, recompute every episode's
eligible windows from its per-frame segment ids, then choose an eligible episode uniformly and a window
uniformly in it. "vectorised" is the same recomputation done in one numpy pass over all frames (the best
case of that approach). Baseline batches are timed fewer times at large sizes (the count is printed).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import numpy as np

from demoforge.storage.sampling import WindowIndex, segments_from_frames


def synthetic(n: int, frames: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[np.ndarray]]:
    """Segment spans (start, end, slot) of ``n`` episodes and each episode's per-frame segment ids."""
    rng = np.random.default_rng(seed)
    k = rng.integers(1, 6, size=n)                       # segments per episode
    cuts = np.sort(rng.integers(1, frames, size=(n, 4)), axis=1)
    starts, ends, slots, ids = [], [], [], []
    for e in range(n):
        bounds = np.unique(np.concatenate(([0], cuts[e, :k[e] - 1], [frames])))
        lo, hi = bounds[:-1] + e * frames, bounds[1:] + e * frames
        starts.append(lo)
        ends.append(hi)
        slots.append(np.full(len(lo), e))
        ids.append(np.repeat(np.arange(len(lo), dtype=np.int32), np.diff(bounds)))
    return np.concatenate(starts), np.concatenate(ends), np.concatenate(slots), ids


def eligible_starts(seg: np.ndarray, mode: str, c: int) -> np.ndarray:
    """The original's per-episode recomputation (ids are non-decreasing: a window is inside one segment iff
    its first and last frames share the id)."""
    if len(seg) < c:
        return np.zeros(0, dtype=np.int64)
    same = seg[:len(seg) - c + 1] == seg[c - 1:]
    if mode == "episode":
        return np.arange(len(same))
    return np.flatnonzero(same if mode == "segment" else ~same)


def baseline_batch(episodes: list[np.ndarray], mode: str, c: int, batch: int, rng: np.random.Generator):
    windows = [(e, w) for e, seg in enumerate(episodes) if len(w := eligible_starts(seg, mode, c))]
    picks = rng.integers(0, len(windows), size=batch)
    return [(windows[i][0], int(windows[i][1][rng.integers(0, len(windows[i][1]))])) for i in picks]


def vectorised_batch(seg: np.ndarray, episode: np.ndarray, mode: str, c: int, batch: int,
                     rng: np.random.Generator):
    first, last = seg[:len(seg) - c + 1], seg[c - 1:]
    inside = episode[:len(seg) - c + 1] == episode[c - 1:]
    same = first == last
    ok = inside & (same if mode == "segment" else ~same if mode == "boundary" else True)
    starts = np.flatnonzero(ok)
    eps = episode[starts]
    heads = np.flatnonzero(np.append(True, eps[1:] != eps[:-1]))
    counts = np.diff(np.append(heads, len(starts)))
    e = rng.integers(0, len(heads), size=batch)
    return starts[heads[e] + rng.integers(0, counts[e])]


def timed(fn, repeats: int) -> float:
    """Median seconds of ``repeats`` calls."""
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def bench(n: int, frames: int, mode: str, c: int, batch: int) -> dict:
    start, end, slot, ids = synthetic(n, frames)
    rng = np.random.default_rng(1)

    t = time.perf_counter()
    index = WindowIndex(mode, c)
    index.extend(start, end, slot, n)
    build_spans = time.perf_counter() - t

    seg = np.concatenate(ids)
    episode = np.repeat(np.arange(n), frames)
    valid = np.ones(len(seg), dtype=np.int8)
    t = time.perf_counter()
    s, e, first = segments_from_frames(valid, seg, episode=episode)
    from_frames = WindowIndex(mode, c)
    from_frames.extend(s, e, episode[first], n)
    build_frames = time.perf_counter() - t
    assert from_frames.total_windows == index.total_windows

    appends = 1000
    t = time.perf_counter()
    for k in range(appends):
        o = (n + k) * frames
        index.extend(np.array([o, o + frames // 2]), np.array([o + frames // 2, o + frames]),
                     np.array([n + k, n + k]), 1)
    append = (time.perf_counter() - t) / appends

    ours = timed(lambda: index.sample(rng, batch, "episode"), 2000)
    ours_window = timed(lambda: index.sample(rng, batch, "window"), 2000)
    reps = max(3, min(20, 50_000 // n))
    base = timed(lambda: baseline_batch(ids, mode, c, batch, rng), reps)
    vec = timed(lambda: vectorised_batch(seg, episode, mode, c, batch, rng), reps)
    return {"episodes": n, "frames": n * frames, "windows": index.total_windows,
            "build_from_spans_s": build_spans, "build_from_frames_s": build_frames, "append_one_episode_s": append,
            "ours_batch_s": ours, "ours_batch_window_weighting_s": ours_window,
            "baseline_batch_s": base, "vectorised_recompute_batch_s": vec, "baseline_repeats": reps,
            "speedup_vs_baseline": base / ours, "speedup_vs_vectorised": vec / ours}


def fmt(seconds: float) -> str:
    if seconds >= 1:
        return f"{seconds:.2f} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.1f} ms"
    return f"{seconds * 1e6:.0f} µs"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--episodes", type=int, nargs="+", default=[1000, 10_000, 100_000],
                        help="index sizes to measure, one row each (default 1000 10000 100000)")
    parser.add_argument("--frames", type=int, default=300, help="frames per synthetic episode (default 300)")
    parser.add_argument("--chunk", type=int, default=16, help="window length in frames (default 16)")
    parser.add_argument("--mode", default="segment", choices=["episode", "segment", "boundary"],
                        help="which windows are eligible, as the samplers' modes (default segment)")
    parser.add_argument("--batch", type=int, default=64, help="windows drawn per batch (default 64)")
    parser.add_argument("--json", action="store_true", help="print the rows as JSON instead of a table (default off)")
    args = parser.parse_args()
    load_before = os.getloadavg()
    rows = [bench(n, args.frames, args.mode, args.chunk, args.batch) for n in args.episodes]
    for r in rows:  # how per-batch cost grows with the index (it should stay flat: a search, not a rebuild)
        r["ours_batch_vs_first_row"] = r["ours_batch_s"] / rows[0]["ours_batch_s"]
    load = "load average {:.1f}/{:.1f}/{:.1f} before, {:.1f}/{:.1f}/{:.1f} after".format(*load_before, *os.getloadavg())
    if args.json:
        print(json.dumps({"load": load, "rows": rows}, indent=2))
        return
    print(f"mode {args.mode}, chunk {args.chunk}, batch {args.batch}, {args.frames} frames per episode, "
          f"weighting episode (median per batch); {load}")
    print("| episodes | frames | index build (spans) | index build (frames) | append 1 episode | ours per batch "
          "| vs first row | baseline per batch | vectorised recompute per batch | speed-up vs baseline | vs vectorised |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['episodes']:,} | {r['frames']:,} | {fmt(r['build_from_spans_s'])} | "
              f"{fmt(r['build_from_frames_s'])} | {fmt(r['append_one_episode_s'])} | {fmt(r['ours_batch_s'])} | "
              f"{r['ours_batch_vs_first_row']:.2f}x | "
              f"{fmt(r['baseline_batch_s'])} ({r['baseline_repeats']}x) | {fmt(r['vectorised_recompute_batch_s'])} | "
              f"{r['speedup_vs_baseline']:,.0f}x | {r['speedup_vs_vectorised']:,.0f}x |")


if __name__ == "__main__":
    main()
