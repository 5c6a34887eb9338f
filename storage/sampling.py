"""Segment-aware training sampling: chunks of consecutive frames inside an episode, a segment, or across a
segment boundary — offline over an exported LeRobot dataset, online over a live staging store.

A *window* of chunk size ``C`` starting at frame ``s`` is the frames ``[s, s + C)`` of one episode. A frame
is *usable* when it was recorded (``annotation.valid == 1``) and belongs to a segment (``segment_id >= 0``);
a window is *fully valid* when all its ``C`` frames are usable. The three modes:

``episode``
    every fully valid window (all ``C`` frames in one episode).
``segment``
    a fully valid window whose ``C`` frames all carry the same ``segment_id`` (one skill).
``boundary``
    a fully valid window that is **not** inside one segment: its first and last frames belong to different
    segments, so it contains at least one segment end (``segment_end == 1``) that is not its last frame,
    followed by the next segment's first frame (a transition). Needs ``C >= 2``. Every fully valid window
    is exactly one of ``segment`` or ``boundary``. With ``C - 2`` smaller than every segment's length a
    boundary window crosses exactly one boundary; a window can only span three or more segments when a
    segment between them is at most ``C - 2`` frames long.

Weighting (``weighting=``): ``"episode"`` (the original's) picks an episode uniformly among those with at
least one eligible window, then a window uniformly among that episode's eligible windows; ``"window"`` picks
uniformly among all eligible windows of the store (long episodes are drawn more often).

The index: each mode's eligible window starts of one episode form a few disjoint integer intervals, found
from the episode's segment spans in O(#segments) (spans themselves come from per-frame annotations in one
O(#frames) vectorised pass). The index keeps the intervals of all episodes in append-only arrays (capacity
doubling, so appending episodes is amortised O(1) per interval) with exclusive cumulative window counts.
Drawing a window is then one or two uniform integers and one ``searchsorted``: O(log #intervals) per draw,
independent of the number of frames — in practice constant (``tools/bench_sampling.py``,
``docs/performance.md``).

Offline: :class:`SegmentWindowSampler` is a ``torch.utils.data.Sampler[int]`` over an exported dataset
yielding the dataset index of each window's first frame; give ``LeRobotDataset`` ``delta_timestamps`` of
``[i / fps for i in range(C)]`` (:meth:`SegmentWindowSampler.delta_timestamps`) and every item is exactly the
window (no padding: windows never leave their episode).

Online: :class:`OnlineWindowSampler` tails a store's catalog while a ``generate`` job writes: it sees an
episode only once its commit transaction is durable (never staging, discarded or quarantined ones), reads
the catalog through its own read-only SQLite connection in short read transactions (WAL: readers never
block the writer; it never touches ``writer.lock``) and reads only catalog rows it has not settled yet.

Errors: :class:`NoEligibleWindowError` (a ``ValueError``) when no window is eligible; its message names the
mode, the chunk size, and the longest segment and fully valid run found.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
import urllib.parse
from collections import OrderedDict
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from torch.utils.data import Sampler

from demoforge.pipeline.contract import ANNOTATION_KEYS

MODES = ("episode", "segment", "boundary")
WEIGHTINGS = ("episode", "window")
_BLOCK = 4096  # draws generated per numpy call by the offline sampler (fixed: part of the reproducible stream)


class NoEligibleWindowError(ValueError):
    """No window of the requested mode and chunk size exists (yet)."""


def _check_mode(mode: str, chunk_size: int, weighting: str = "episode") -> None:
    if mode not in MODES:
        raise ValueError(f"unknown sampling mode {mode!r}; choose one of {', '.join(MODES)}")
    if weighting not in WEIGHTINGS:
        raise ValueError(f"unknown weighting {weighting!r}; choose one of {', '.join(WEIGHTINGS)}")
    if int(chunk_size) != chunk_size or chunk_size < 1:
        raise ValueError(f"chunk_size must be a positive integer, got {chunk_size!r}")
    if mode == "boundary" and chunk_size < 2:
        raise ValueError("mode 'boundary' needs chunk_size >= 2 (a window must hold the frames on both sides "
                         f"of a boundary), got {chunk_size}")


# ----------------------------------------------------------------------------------- segment spans
def segments_from_frames(valid: np.ndarray, segment_id: np.ndarray, episode: np.ndarray | None = None,
                         position: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Maximal runs of usable frames with one segment id, in one vectorised O(#frames) pass.

    Inputs are per-frame arrays in frame order: ``valid`` (0/1), ``segment_id`` (-1 = none), optionally
    ``episode`` (a frame whose episode differs from the previous one starts a new run) and ``position`` (the
    frames' global indices; a gap also starts a new run; default ``arange``). Returns ``(start, end, first)``:
    start and exclusive end positions of each segment span, and the array index of its first frame.
    """
    valid = np.asarray(valid)
    seg = np.asarray(segment_id)
    n = len(seg)
    if n == 0:
        empty = np.zeros(0, dtype=np.int64)
        return empty, empty, empty
    ok = (valid != 0) & (seg >= 0)
    change = np.ones(n, dtype=bool)  # frame i differs from frame i-1 in anything that splits a segment
    change[1:] = (seg[1:] != seg[:-1]) | ~ok[:-1]
    if episode is not None:
        ep = np.asarray(episode)
        change[1:] |= ep[1:] != ep[:-1]
    pos = np.arange(n, dtype=np.int64) if position is None else np.asarray(position, dtype=np.int64)
    if position is not None:
        change[1:] |= pos[1:] != pos[:-1] + 1
    first = np.flatnonzero(change & ok)
    # a span ends before the next frame that starts a run or is unusable
    stop = np.flatnonzero(np.append(change[1:] | ~ok[1:], True) & ok)
    return pos[first], pos[stop] + 1, first


def _intervals(mode: str, c: int, start: np.ndarray, end: np.ndarray, slot: np.ndarray
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray, int, int]:
    """Eligible window starts of one mode as disjoint inclusive intervals ``[lo, hi]`` with their slot.

    ``start``/``end``/``slot``: segment spans sorted by slot then start (spans of one slot never overlap).
    O(#segments), vectorised. Also returns the longest segment and the longest fully valid run.
    """
    start = np.asarray(start, dtype=np.int64)
    end = np.asarray(end, dtype=np.int64)
    slot = np.asarray(slot, dtype=np.int64)
    empty = np.zeros(0, dtype=np.int64)
    if len(start) == 0:
        return empty, empty, empty, 0, 0
    # chains of touching segments of one episode = runs of usable frames
    new_chain = np.ones(len(start), dtype=bool)
    new_chain[1:] = (slot[1:] != slot[:-1]) | (start[1:] != end[:-1])
    chain = np.cumsum(new_chain) - 1
    heads = np.flatnonzero(new_chain)
    tails = np.append(heads[1:] - 1, len(start) - 1)
    run_lo, run_hi, run_slot = start[heads], end[tails], slot[heads]
    longest_segment = int((end - start).max())
    longest_run = int((run_hi - run_lo).max())
    if mode == "episode":
        lo, hi, s = run_lo, run_hi - c, run_slot
    elif mode == "segment":
        lo, hi, s = start, end - c, slot
    else:  # boundary: windows holding the boundary before segment i, i not first in its chain, merged
        inner = np.flatnonzero(~new_chain)
        b, ch = start[inner], chain[inner]
        lo = np.maximum(run_lo[ch], b - c + 1)
        hi = np.minimum(b - 1, run_hi[ch] - c)
        keep = lo <= hi
        lo, hi, ch = lo[keep], hi[keep], ch[keep]
        if len(lo):
            # within a chain both lo and hi are non-decreasing in b: merge overlapping/touching neighbours
            brk = np.ones(len(lo), dtype=bool)
            brk[1:] = (ch[1:] != ch[:-1]) | (lo[1:] > hi[:-1] + 1)
            g_head = np.flatnonzero(brk)
            g_tail = np.append(g_head[1:] - 1, len(lo) - 1)
            lo, hi, ch = lo[g_head], hi[g_tail], ch[g_head]
        s = run_slot[ch]
        return lo, hi, s, longest_segment, longest_run
    keep = lo <= hi
    return lo[keep], hi[keep], s[keep], longest_segment, longest_run


class _Grow:
    """An append-only int64 array with capacity doubling (amortised O(1) per appended element)."""

    __slots__ = ("_buf", "n")

    def __init__(self) -> None:
        self._buf = np.zeros(16, dtype=np.int64)
        self.n = 0

    def extend(self, values: np.ndarray) -> None:
        k = len(values)
        if self.n + k > len(self._buf):
            buf = np.zeros(max(2 * len(self._buf), self.n + k), dtype=np.int64)
            buf[:self.n] = self._buf[:self.n]
            self._buf = buf
        self._buf[self.n:self.n + k] = values
        self.n += k

    @property
    def view(self) -> np.ndarray:
        return self._buf[:self.n]


class WindowIndex:
    """The eligible windows of one mode and chunk size over a growing set of episodes.

    Episodes get consecutive *slots* (0, 1, ...) in the order they are added; frame positions are global
    (each episode occupies its own range; the caller maps positions back). Build and extension cost
    O(#segments) per added episode; :meth:`sample` costs O(n log #intervals), independent of the frame count.
    """

    def __init__(self, mode: str, chunk_size: int) -> None:
        _check_mode(mode, chunk_size)
        self.mode, self.chunk_size = mode, int(chunk_size)
        self._iv_lo = _Grow()       # first eligible start of each interval (global position)
        self._iv_before = _Grow()   # windows in all earlier intervals (strictly increasing)
        self._iv_slot = _Grow()
        self._ep_slot = _Grow()     # eligible episodes: slot, windows before it, its window count
        self._ep_before = _Grow()
        self._ep_count = _Grow()
        self.total_windows = 0
        self.episodes = 0            # slots used (eligible or not)
        self.longest_segment = 0
        self.longest_run = 0

    @property
    def eligible_episodes(self) -> int:
        return self._ep_slot.n

    def extend(self, start: np.ndarray, end: np.ndarray, slot: np.ndarray, episodes: int) -> None:
        """Add ``episodes`` new slots (numbered from :attr:`episodes` on) with their segment spans.

        Spans must be sorted by slot then start, and slots must lie in the new range.
        """
        slot = np.asarray(slot, dtype=np.int64)
        if len(slot) and (slot.min() < self.episodes or slot.max() >= self.episodes + episodes
                          or np.any(np.diff(slot) < 0)):
            raise ValueError("segment spans must belong to the new slots, in slot order")
        lo, hi, s, longest_segment, longest_run = _intervals(self.mode, self.chunk_size, start, end, slot)
        self.episodes += int(episodes)
        self.longest_segment = max(self.longest_segment, longest_segment)
        self.longest_run = max(self.longest_run, longest_run)
        if not len(lo):
            return
        count = hi - lo + 1
        before = self.total_windows + np.concatenate(([0], np.cumsum(count)[:-1]))
        self._iv_lo.extend(lo)
        self._iv_before.extend(before)
        self._iv_slot.extend(s)
        # per episode: intervals of one slot are contiguous
        head = np.flatnonzero(np.append(True, s[1:] != s[:-1]))
        ep_count = np.add.reduceat(count, head)
        self._ep_slot.extend(s[head])
        self._ep_before.extend(before[head])
        self._ep_count.extend(ep_count)
        self.total_windows += int(count.sum())

    def describe_empty(self, what: str = "") -> str:
        return (f"no eligible window for mode={self.mode!r} with chunk_size={self.chunk_size}: the longest "
                f"segment found has {self.longest_segment} frames and the longest fully valid run "
                f"{self.longest_run} frames, over {self.episodes} episode(s){what}"
                + ("; boundary windows need two touching segments in one episode" if self.mode == "boundary"
                   else ""))

    def sample(self, rng: np.random.Generator, n: int, weighting: str = "episode"
               ) -> tuple[np.ndarray, np.ndarray]:
        """Draw ``n`` windows: ``(slots, starts)`` with global start positions. O(n log #intervals)."""
        if weighting not in WEIGHTINGS:
            raise ValueError(f"unknown weighting {weighting!r}; choose one of {', '.join(WEIGHTINGS)}")
        if self.total_windows == 0:
            raise NoEligibleWindowError(self.describe_empty())
        if weighting == "window":
            u = rng.integers(0, self.total_windows, size=n, dtype=np.int64)
        else:
            e = rng.integers(0, self._ep_slot.n, size=n, dtype=np.int64)
            u = self._ep_before.view[e] + rng.integers(0, self._ep_count.view[e], dtype=np.int64)
        before = self._iv_before.view
        i = np.searchsorted(before, u, side="right") - 1
        return self._iv_slot.view[i], self._iv_lo.view[i] + (u - before[i])

    def windows(self) -> Iterator[tuple[int, int]]:
        """Every eligible ``(slot, start)`` in index order (O(#windows): introspection and tests only)."""
        before = np.append(self._iv_before.view, self.total_windows)
        for k in range(self._iv_lo.n):
            lo, slot = int(self._iv_lo.view[k]), int(self._iv_slot.view[k])
            for offset in range(int(before[k + 1] - before[k])):
                yield slot, lo + offset

    def episode_windows(self) -> dict[int, int]:
        """Eligible window count of every eligible episode slot."""
        return dict(zip(self._ep_slot.view.tolist(), self._ep_count.view.tolist()))


def window_is_eligible(mode: str, valid: np.ndarray, segment_id: np.ndarray) -> bool:
    """The definition, frame by frame, for one window's annotations (the reference the index is tested on)."""
    valid, seg = np.asarray(valid), np.asarray(segment_id)
    if not (np.all(valid == 1) and np.all(seg >= 0)):
        return False
    if mode == "episode":
        return True
    same = bool(np.all(seg == seg[0]))
    return same if mode == "segment" else not same


def chunk_delta_timestamps(keys: Iterable[str], chunk_size: int, fps: float) -> dict[str, list[float]]:
    """``delta_timestamps`` for LeRobotDataset that load frames ``t .. t + chunk_size - 1`` of each key."""
    return {key: [i / fps for i in range(chunk_size)] for key in keys}


# -------------------------------------------------------------------------------------------- offline
class SegmentWindowSampler(Sampler[int]):
    """A ``torch.utils.data.Sampler[int]`` over an exported dataset (demoforge's LeRobot v3.0 export).

    Yields ``num_samples`` dataset indices, each the first frame of an eligible window; load the whole
    window with ``LeRobotDataset(..., delta_timestamps=sampler.delta_timestamps("action", ...))``.

    - ``mode``: ``"episode"``, ``"segment"`` or ``"boundary"`` (see the module docstring for the exact
      definitions); ``chunk_size``: frames per window; ``weighting``: ``"episode"`` (uniform over eligible
      episodes, then over that episode's windows) or ``"window"`` (uniform over all eligible windows).
    - Reproducible: the draws of an epoch are a pure function of ``(seed, epoch)`` (numpy's PCG64 seeded
      with ``SeedSequence([seed, epoch])``). As LeRobot's ``EpisodeAwareSampler``: each ``__iter__``
      advances the epoch; :meth:`set_epoch` positions it (use one of the two mechanisms).
    - Worker-safe: a DataLoader iterates its sampler in the main process and hands indices to workers, so
      ``num_workers > 0`` yields the same items in the same order as ``num_workers = 0``. The sampler holds
      only numpy arrays (it pickles for spawn-started workers too).
    - ``episodes``: restrict to these dataset episode indices; ``absolute_to_relative_idx``: LeRobotDataset's
      mapping for an episode-filtered dataset (yielded indices are then relative). :meth:`from_dataset`
      fills both from a loaded ``LeRobotDataset``.

    The index is built once from the data parquet's ``index``, ``episode_index``, ``annotation.valid`` and
    ``annotation.segment_id`` columns (only those columns are read): O(#frames). A dataset without
    annotation columns (not written by demoforge) supports ``mode="episode"`` only.
    """

    def __init__(self, root: str | Path, *, mode: str = "episode", chunk_size: int, num_samples: int | None = None,
                 weighting: str = "episode", seed: int = 0, episodes: Sequence[int] | None = None,
                 absolute_to_relative_idx: Mapping[int, int] | None = None) -> None:
        super().__init__()
        _check_mode(mode, chunk_size, weighting)
        self.root = Path(root).resolve()  # pin the published version (an export swaps the link)
        self.mode, self.chunk_size, self.weighting, self.seed = mode, int(chunk_size), weighting, int(seed)
        info = json.loads((self.root / "meta" / "info.json").read_text())
        self.fps = info["fps"]
        self.index = WindowIndex(mode, chunk_size)
        self.episode_of_slot = self._build(episodes)
        self._to_relative = dict(absolute_to_relative_idx) if absolute_to_relative_idx is not None else None
        if self.index.total_windows == 0:
            raise NoEligibleWindowError(self.index.describe_empty(f" of {self.root}"))
        self.num_samples = int(num_samples) if num_samples is not None else self.index.total_windows
        if self.num_samples < 1:
            raise ValueError(f"num_samples must be >= 1, got {num_samples}")
        self._epoch = 0

    @classmethod
    def from_dataset(cls, dataset: Any, **kwargs: Any) -> SegmentWindowSampler:
        """A sampler for a loaded ``LeRobotDataset``: same root, same episodes, same index mapping.

        Restricted to the episodes the dataset object holds, so a newer export published after the dataset
        was loaded never yields an index the dataset lacks.
        """
        episodes = dataset.episodes if dataset.episodes is not None else range(dataset.meta.total_episodes)
        return cls(dataset.root, episodes=list(episodes),
                   absolute_to_relative_idx=dataset.absolute_to_relative_idx, **kwargs)

    def _build(self, episodes: Sequence[int] | None) -> np.ndarray:
        import pyarrow as pa
        import pyarrow.compute as pc
        import pyarrow.parquet as pq

        files = sorted((self.root / "data").glob("*/*.parquet"))
        if not files:
            raise NoEligibleWindowError(f"{self.root} holds no data files; nothing to sample")
        names = set(pq.read_schema(files[0]).names)
        annotated = {"annotation.valid", "annotation.segment_id"} <= names
        if not annotated and self.mode != "episode":
            raise ValueError(f"{self.root} has no annotation.segment_id column (not a demoforge export): only "
                             "mode 'episode' is possible")
        columns = ["index", "episode_index"] + (["annotation.valid", "annotation.segment_id"] if annotated else [])
        table = pa.concat_tables([pq.read_table(f, columns=columns) for f in files])
        if episodes is not None:
            table = table.filter(pc.is_in(table["episode_index"], pa.array(sorted(set(episodes)), pa.int64())))
        index = table["index"].to_numpy()
        order = np.argsort(index, kind="stable")
        index = index[order]
        ep = table["episode_index"].to_numpy()[order]
        if annotated:
            valid = table["annotation.valid"].to_numpy()[order]
            seg = table["annotation.segment_id"].to_numpy()[order]
        else:
            valid, seg = np.ones(len(index), np.int64), np.zeros(len(index), np.int64)
        start, end, first = segments_from_frames(valid, seg, episode=ep, position=index)
        # slots: the dataset's episodes in index order (a slot per episode with frames)
        heads = np.flatnonzero(np.append(True, ep[1:] != ep[:-1])) if len(ep) else np.zeros(0, np.int64)
        episode_of_slot = ep[heads]
        slot_of_frame = np.cumsum(np.append(True, ep[1:] != ep[:-1])) - 1 if len(ep) else ep
        self.index.extend(start, end, slot_of_frame[first], len(heads))
        return episode_of_slot

    # -- torch Sampler protocol
    def __len__(self) -> int:
        return self.num_samples

    def set_epoch(self, epoch: int) -> None:
        self._epoch = int(epoch)

    @property
    def epoch(self) -> int:
        return self._epoch

    def __iter__(self) -> Iterator[int]:
        epoch = self._epoch
        self._epoch += 1  # eagerly, as LeRobot's EpisodeAwareSampler
        return self._iter_epoch(epoch)

    def _iter_epoch(self, epoch: int) -> Iterator[int]:
        rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence([self.seed, epoch])))
        left = self.num_samples
        while left:
            n = min(left, _BLOCK)
            _slots, starts = self.index.sample(rng, n, self.weighting)
            if self._to_relative is not None:
                yield from (self._to_relative[s] for s in starts.tolist())
            else:
                yield from starts.tolist()
            left -= n

    # -- helpers
    def sample_windows(self, n: int, rng: np.random.Generator | int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """``n`` draws outside torch: (dataset episode index, absolute start index) arrays."""
        rng = rng if isinstance(rng, np.random.Generator) else np.random.default_rng(rng)
        slots, starts = self.index.sample(rng, n, self.weighting)
        return self.episode_of_slot[slots], starts

    def delta_timestamps(self, *keys: str) -> dict[str, list[float]]:
        """``delta_timestamps`` loading this sampler's whole window for each key."""
        return chunk_delta_timestamps(keys, self.chunk_size, self.fps)

    @property
    def total_windows(self) -> int:
        return self.index.total_windows


# --------------------------------------------------------------------------------------------- online
@dataclass(frozen=True)
class Window:
    """One sampled window of a staged episode: frames ``[start, start + chunk_size)``."""

    episode_id: str
    start: int


@dataclass
class _Episode:
    episode_id: str
    frames: int
    video_bytes: dict[str, int]
    offset: int            # global position of its frame 0 in the index
    spans: np.ndarray      # (k, 2) local segment spans


class OnlineWindowSampler:
    """Samples windows from a live store while a ``generate`` job (or daemon) writes it.

    - :meth:`refresh` reads the catalog rows it has not settled yet — rows with a larger id than any seen,
      plus the few it saw in ``staging`` (in flight) — in one short read transaction on a read-only
      connection, and adds the newly committed episodes to the index (O(#segments) each). Cost: O(new rows +
      in-flight attempts) whatever the store size; nothing at all when the database did not change
      (``PRAGMA data_version``). Episodes quarantined later (``demoforge verify``) are dropped (that rebuild is
      O(#episodes), and rare). Discarded and staging attempts never enter.
    - :meth:`sample` draws windows (``weighting`` as offline): O(batch log #intervals), store-size
      independent; seeded (``seed``) and reproducible for the same sequence of refreshes.
    - :meth:`read_windows` loads the windows' numbers (and, on request, decoded camera frames) from staging
      (``StagingStore.read_episode``: checksums verified), keeping the numbers of the last ``cache_episodes``
      episodes and the decoded frames of the last ``video_cache_episodes`` in memory.

    Never blocks the writer: no lock file, a read-only SQLite connection (WAL readers do not block writers
    and read transactions here last a few milliseconds), and staged files are read only after their commit.
    ``refresh_interval_s``: :meth:`sample` refreshes by itself when the last refresh is older than that
    (``None``: only explicit :meth:`refresh`). Thread-safe (one lock); use one sampler per process.
    """

    def __init__(self, store_dir: str | Path, *, mode: str = "episode", chunk_size: int,
                 weighting: str = "episode", seed: int = 0, refresh_interval_s: float | None = 1.0,
                 cache_episodes: int = 256, video_cache_episodes: int = 4) -> None:
        _check_mode(mode, chunk_size, weighting)
        self.store_dir = Path(store_dir)
        self.mode, self.chunk_size, self.weighting = mode, int(chunk_size), weighting
        self.rng = np.random.default_rng(seed)
        self.refresh_interval_s = refresh_interval_s
        self.cache_episodes = int(cache_episodes)
        self.video_cache_episodes = int(video_cache_episodes)
        self.index = WindowIndex(mode, chunk_size)
        self._episodes: list[_Episode] = []         # by slot
        self._slot_of: dict[str, int] = {}
        self._max_id = 0
        self._pending: set[int] = set()             # row ids seen in 'staging'
        self._quarantined = 0
        self._data_version: int | None = None
        self._db: sqlite3.Connection | None = None
        self._last_refresh = float("-inf")
        self._lock = threading.RLock()
        self._cache: OrderedDict[str, dict[str, np.ndarray]] = OrderedDict()        # numbers, per episode
        self._video_cache: OrderedDict[str, dict[str, np.ndarray]] = OrderedDict()  # decoded frames
        self._staging = None
        self._frames = 0

    # -- catalog tailing
    def _connect(self) -> sqlite3.Connection | None:
        if self._db is None:
            path = self.store_dir / "catalog.sqlite"
            if not path.exists():
                return None
            uri = f"file:{urllib.parse.quote(str(path.resolve()))}?mode=ro"
            self._db = sqlite3.connect(uri, uri=True, isolation_level=None, check_same_thread=False, timeout=10)
            self._db.execute("PRAGMA query_only = 1")
        return self._db

    def refresh(self) -> int:
        """Add episodes committed since the last call; returns how many were added."""
        with self._lock:
            self._last_refresh = time.monotonic()
            db = self._connect()
            if db is None:
                return 0
            version = db.execute("PRAGMA data_version").fetchone()[0]
            if version == self._data_version:
                return 0
            try:
                db.execute("BEGIN")
                try:
                    cols = "id, episode_id, state, frames, video_bytes, record"
                    rows = db.execute(f"SELECT {cols} FROM attempts WHERE id > ? ORDER BY id",
                                      (self._max_id,)).fetchall()
                    pending = sorted(self._pending)
                    for k in range(0, len(pending), 500):
                        part = pending[k:k + 500]
                        rows += db.execute(f"SELECT {cols} FROM attempts WHERE id IN ({','.join('?' * len(part))})",
                                           part).fetchall()
                    quarantined = db.execute("SELECT COUNT(*) FROM attempts WHERE state = 'quarantined'").fetchone()[0]
                    gone: set[str] = set()
                    if quarantined != self._quarantined:
                        gone = {r[0] for r in db.execute(
                            "SELECT episode_id FROM attempts WHERE state = 'quarantined'")} & set(self._slot_of)
                finally:
                    db.execute("COMMIT")
            except sqlite3.OperationalError as exc:
                if "no such table" in str(exc):  # the writer created the file but not the schema yet
                    return 0
                raise
            self._data_version = version
            self._quarantined = quarantined
            new: list[tuple[Any, ...]] = []
            for row_id, episode_id, state, frames, video_bytes, record in rows:
                self._max_id = max(self._max_id, row_id)
                if state == "staging":
                    self._pending.add(row_id)
                    continue
                self._pending.discard(row_id)
                if state in ("committed", "exported") and episode_id not in self._slot_of and episode_id not in gone:
                    new.append((episode_id, frames, video_bytes, record))
            if gone:
                self._drop(gone)
            self._add(new)
            return len(new)

    def _add(self, rows: Sequence[tuple[Any, ...]]) -> None:
        starts, ends, slots = [], [], []
        first_slot = len(self._episodes)
        for episode_id, frames, video_bytes, record in rows:
            record = json.loads(record) if isinstance(record, str) else (record or {})
            spans = np.array(sorted((int(s["start_step"]), int(s["end_step"])) for s in record.get("segments", [])
                                    if 0 <= s["start_step"] < s["end_step"] <= frames),
                             dtype=np.int64).reshape(-1, 2)
            slot = len(self._episodes)
            self._episodes.append(_Episode(episode_id, int(frames), json.loads(video_bytes) if
                                           isinstance(video_bytes, str) else dict(video_bytes or {}),
                                           self._frames, spans))
            self._slot_of[episode_id] = slot
            starts.append(spans[:, 0] + self._frames)
            ends.append(spans[:, 1] + self._frames)
            slots.append(np.full(len(spans), slot, dtype=np.int64))
            self._frames += int(frames)
        if rows:
            self.index.extend(np.concatenate(starts), np.concatenate(ends), np.concatenate(slots),
                              len(self._episodes) - first_slot)

    def _drop(self, gone: set[str]) -> None:
        """Rebuild without the quarantined episodes (rare; O(#episodes))."""
        keep = [e for e in self._episodes if e.episode_id not in gone]
        for episode_id in gone:
            self._cache.pop(episode_id, None)
            self._video_cache.pop(episode_id, None)
        self.index = WindowIndex(self.mode, self.chunk_size)
        self._episodes, self._slot_of, self._frames = [], {}, 0
        self._add([(e.episode_id, e.frames, e.video_bytes,
                    {"segments": [{"start_step": int(a), "end_step": int(b)} for a, b in e.spans]}) for e in keep])

    def wait(self, *, min_windows: int = 1, timeout_s: float = 60.0, poll_s: float = 0.2) -> int:
        """Refresh until at least ``min_windows`` windows are eligible; returns the count (TimeoutError)."""
        deadline = time.monotonic() + timeout_s
        while True:
            self.refresh()
            if self.index.total_windows >= min_windows:
                return self.index.total_windows
            if time.monotonic() >= deadline:
                raise TimeoutError(f"{self.index.total_windows} eligible window(s) after {timeout_s} s; "
                                   + self.index.describe_empty(f" committed in {self.store_dir}"))
            time.sleep(poll_s)

    # -- drawing
    def sample(self, batch_size: int) -> list[Window]:
        """``batch_size`` windows of committed episodes (NoEligibleWindowError when none is eligible yet)."""
        with self._lock:
            if self.refresh_interval_s is not None and \
                    time.monotonic() - self._last_refresh >= self.refresh_interval_s:
                self.refresh()
            if self.index.total_windows == 0:
                raise NoEligibleWindowError(self.index.describe_empty(f" committed in {self.store_dir} so far"))
            slots, starts = self.index.sample(self.rng, batch_size, self.weighting)
            eps = self._episodes
            return [Window(eps[s].episode_id, int(p - eps[s].offset)) for s, p in zip(slots.tolist(), starts.tolist())]

    @property
    def episode_ids(self) -> list[str]:
        """Episodes in the index (committed or exported, not quarantined), in the order they were seen."""
        with self._lock:
            return [e.episode_id for e in self._episodes]

    @property
    def total_windows(self) -> int:
        return self.index.total_windows

    # -- reading frames
    def _staged(self, episode_id: str):
        from demoforge.storage.staging import StagingStore
        from demoforge.storage.store import layout_from_fingerprint

        if self._staging is None:
            row = self._db.execute("SELECT value FROM meta WHERE key = 'fingerprint'").fetchone()
            self._staging = StagingStore(self.store_dir, layout_from_fingerprint(json.loads(row[0])))
        ep = self._episodes[self._slot_of[episode_id]]
        return self._staging.read_episode(episode_id, ep.frames, ep.video_bytes)

    def _numbers(self, episode_id: str) -> dict[str, np.ndarray]:
        cached = self._cache.get(episode_id)
        if cached is not None:
            self._cache.move_to_end(episode_id)
            return cached
        staged = self._staged(episode_id)
        data = {**staged.state, "action": staged.action, "next.reward": staged.reward,
                **{f"annotation.{k}": staged.annotations[:, i].astype(np.int64) for i, k in enumerate(ANNOTATION_KEYS)}}
        self._cache[episode_id] = data
        while len(self._cache) > self.cache_episodes:
            self._cache.popitem(last=False)
        return data

    def _images(self, episode_id: str) -> dict[str, np.ndarray]:
        cached = self._video_cache.get(episode_id)
        if cached is not None:
            self._video_cache.move_to_end(episode_id)
            return cached
        from demoforge.storage.lerobot_export import camera_key

        data = {camera_key(c): _decode(b) for c, b in self._staged(episode_id).video.items()}
        self._video_cache[episode_id] = data
        while len(self._video_cache) > self.video_cache_episodes:
            self._video_cache.popitem(last=False)
        return data

    def read_windows(self, windows: Sequence[Window], *, video: bool = False) -> dict[str, Any]:
        """Stack the windows' frames: ``{feature: array (B, chunk_size, ...)}`` with the export's feature
        names (state features, ``action``, ``next.reward``, ``annotation.<key>``; with ``video=True`` also
        ``observation.images.<camera>`` as uint8 (B, C, H, W, 3)), plus ``episode_id`` and ``start``.
        Checks that every returned frame is valid (a disagreement with the catalog raises)."""
        with self._lock:
            out: dict[str, list[np.ndarray]] = {}
            c = self.chunk_size
            for w in windows:
                data = self._numbers(w.episode_id)
                if video:
                    data = {**data, **self._images(w.episode_id)}
                for key, values in data.items():
                    out.setdefault(key, []).append(values[w.start:w.start + c])
            result: dict[str, Any] = {k: np.stack(v) for k, v in out.items()}
            if windows:
                ok = result["annotation.valid"].shape[1] == c and np.all(result["annotation.valid"] == 1)
                if not ok:
                    raise RuntimeError("staged frames disagree with the catalog record: a window holds an invalid "
                                       "or missing frame")
            result["episode_id"] = [w.episode_id for w in windows]
            result["start"] = np.array([w.start for w in windows], dtype=np.int64)
            return result

    def close(self) -> None:
        with self._lock:
            if self._db is not None:
                self._db.close()
                self._db = None
            self._cache.clear()
            self._video_cache.clear()

    def __enter__(self) -> OnlineWindowSampler:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _decode(data: bytes) -> np.ndarray:
    import io

    import av

    with av.open(io.BytesIO(data)) as container:
        frames = [f.to_ndarray(format="rgb24") for f in container.decode(container.streams.video[0])]
    return np.stack(frames) if frames else np.zeros((0, 0, 0, 3), np.uint8)
