"""The window index behind both samplers: which chunks of ``C`` consecutive frames are eligible, and
drawing them in time independent of the number of frames.

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

Weighting (``weighting=``): ``"episode"`` picks an episode uniformly among those with at least one eligible
window, then a window uniformly among that episode's eligible windows; ``"window"`` picks uniformly among all
eligible windows (long episodes are drawn more often).

The index: each mode's eligible window starts of one episode form a few disjoint integer intervals, found
from the episode's segment spans in O(#segments) (spans themselves come from per-frame annotations in one
O(#frames) vectorised pass). The index keeps the intervals of all episodes in append-only arrays (capacity
doubling, so appending episodes is amortised O(1) per interval) with exclusive cumulative window counts.
Drawing a window is then one or two uniform integers and one ``searchsorted``: O(log #intervals) per draw,
independent of the number of frames — in practice constant (``tools/bench_sampling.py``,
``docs/performance.md``).

Errors: :class:`NoEligibleWindowError` (a ``ValueError``) when no window is eligible; its message names the
mode, the chunk size, and the longest segment and fully valid run found. No torch here.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import numpy as np

MODES = ("episode", "segment", "boundary")
WEIGHTINGS = ("episode", "window")


class NoEligibleWindowError(ValueError):
    """No window of the requested mode and chunk size exists (yet)."""


def check_mode(mode: str, chunk_size: int, weighting: str = "episode") -> None:
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
        check_mode(mode, chunk_size)
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
