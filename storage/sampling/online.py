"""Online sampling: segment-aware windows from a live store while a ``generate`` job (or daemon) writes it.

:class:`OnlineWindowSampler` tails a store's catalog: it sees an episode only once its commit transaction is
durable (never staging, discarded or quarantined ones), reads the catalog through ``open_store`` (mode ``"r"``) (a
read-only SQLite connection, in short read transactions; WAL: readers never block the writer; it never
touches ``writer.lock``) and reads only catalog rows it has not settled yet. Window semantics:
``storage/sampling/window_index.py``. Importing this module does not import torch.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from demoforge.storage import depth as depth_video
from demoforge.storage.catalog import AttemptRow
from demoforge.storage.paths import CATALOG_FILE
from demoforge.storage.lerobot.format import annotation_key, camera_key
from demoforge.storage.store import Store, open_store
from demoforge.storage.sampling.window_index import NoEligibleWindowError, WindowIndex, check_mode
from demoforge.storage.schema import ANNOTATION_KEYS
from demoforge.storage.schema import READABLE_STATES, AttemptState, check_include, included
from demoforge.storage.staging import StagedEpisode
from demoforge.storage.video import decode_frames


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
    spans: np.ndarray      # (k, 3) local segment spans, by start: start, end (exclusive), segment id


def _spans(frames: int, record: Mapping[str, Any] | None) -> np.ndarray:
    segments = (record or {}).get("segments", [])
    return np.array(sorted((int(s["start_step"]), int(s["end_step"]), int(s.get("segment_id", i)))
                           for i, s in enumerate(segments) if 0 <= s["start_step"] < s["end_step"] <= frames),
                    dtype=np.int64).reshape(-1, 3)


class OnlineWindowSampler:
    """Samples windows from a live store while a ``generate`` job (or daemon) writes it.

    - :meth:`refresh` reads the catalog rows it has not settled yet — rows appended after any seen, plus
      the few it saw in ``staging`` (in flight) — in one short read transaction on a read-only connection,
      and adds the newly committed episodes to the index (O(#segments) each). Cost: O(new rows + in-flight
      attempts) whatever the store size; nothing at all when the database did not change (SQLite's
      ``data_version``). Episodes quarantined later (``demoforge verify``) are dropped (that rebuild is
      O(#episodes), and rare). Discarded and staging attempts never enter; failures kept as data
      (``generate --keep-failures``) enter only with ``include="failures"`` or ``"all"``.
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
                 cache_episodes: int = 256, video_cache_episodes: int = 4, include: str = "episodes") -> None:
        check_mode(mode, chunk_size, weighting)
        self.include = check_include(include)
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
        self._pruned = 0  # rows of the catalog's pruned table last seen
        self._data_version: int | None = None
        self._store: Store | None = None
        self._last_refresh = float("-inf")
        self._lock = threading.RLock()
        self._cache: OrderedDict[str, dict[str, np.ndarray]] = OrderedDict()        # numbers, per episode
        self._video_cache: OrderedDict[str, dict[str, np.ndarray]] = OrderedDict()  # decoded frames
        self._frames = 0

    # -- catalog tailing
    @property
    def store(self) -> Store | None:
        """The store opened for reading (None until its catalog exists)."""
        if self._store is None and (self.store_dir / CATALOG_FILE).exists():
            self._store = open_store(self.store_dir)
        return self._store

    def refresh(self) -> int:
        """Add episodes committed since the last call; returns how many were added."""
        with self._lock:
            self._last_refresh = time.monotonic()
            store = self.store
            if store is None:
                return 0
            version = store.data_version()
            if version == self._data_version:
                return 0
            changes = store.attempt_changes(after_row=self._max_id, pending=self._pending,
                                            quarantined_seen=self._quarantined, pruned_seen=self._pruned)
            rows, quarantined, pruned_count = changes.rows, changes.quarantined, changes.pruned
            gone: set[str] = set(changes.quarantined_ids or ()) & set(self._slot_of)
            pruned: set[str] = set(changes.pruned_ids or ())  # staged data deleted after export (demoforge prune)
            gone |= pruned & set(self._slot_of)
            self._data_version = version
            self._quarantined = quarantined
            self._pruned = pruned_count
            new: list[AttemptRow] = []
            for row in rows:
                self._max_id = max(self._max_id, row.row_id)
                if row.state == AttemptState.STAGING:
                    self._pending.add(row.row_id)
                    continue
                self._pending.discard(row.row_id)
                if (row.state in READABLE_STATES and row.episode_id not in self._slot_of and row.episode_id not in gone
                        and row.episode_id not in pruned and included(self.include, row.kept_failure)):
                    new.append(row)
            if gone:
                self._drop(gone)
            self._add([(r.episode_id, int(r.frames or 0), dict(r.video_bytes), _spans(int(r.frames or 0), r.record))
                       for r in new])
            return len(new)

    def _add(self, rows: Sequence[tuple[str, int, dict[str, int], np.ndarray]]) -> None:
        starts, ends, slots = [], [], []
        first_slot = len(self._episodes)
        for episode_id, frames, video_bytes, spans in rows:
            slot = len(self._episodes)
            self._episodes.append(_Episode(episode_id, frames, video_bytes, self._frames, spans))
            self._slot_of[episode_id] = slot
            starts.append(spans[:, 0] + self._frames)
            ends.append(spans[:, 1] + self._frames)
            slots.append(np.full(len(spans), slot, dtype=np.int64))
            self._frames += frames
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
        self._add([(e.episode_id, e.frames, e.video_bytes, e.spans) for e in keep])

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

    def labels(self, windows: Sequence[Window]) -> dict[str, np.ndarray]:
        """The labels of ``windows`` (what :meth:`sample` returns), each of shape (len(windows), chunk_size), as
        ``SegmentWindowSampler.labels`` gives them: ``segment_id``; ``episode_progress``, 0 at an episode's
        first frame and 1 at its last; ``segment_progress``, the same within the frame's segment (1 for a
        one-frame segment). From the catalog's records: no staged data is read."""
        c = self.chunk_size
        out: dict[str, np.ndarray] = {"segment_id": np.zeros((len(windows), c), np.int64),
                                      "episode_progress": np.zeros((len(windows), c), np.float32),
                                      "segment_progress": np.zeros((len(windows), c), np.float32)}
        with self._lock:
            for i, w in enumerate(windows):
                ep = self._episodes[self._slot_of[w.episode_id]]
                t = np.minimum(w.start + np.arange(c), ep.frames - 1)
                spans = ep.spans if len(ep.spans) else np.array([[0, ep.frames, 0]], np.int64)
                k = np.maximum(np.searchsorted(spans[:, 0], t, side="right") - 1, 0)
                start, length = spans[k, 0], spans[k, 1] - spans[k, 0]
                out["segment_id"][i] = spans[k, 2]
                out["episode_progress"][i] = t / (ep.frames - 1) if ep.frames > 1 else 1.0
                out["segment_progress"][i] = np.where(length > 1, (t - start) / np.maximum(length - 1, 1), 1.0)
        return out

    @property
    def episode_ids(self) -> list[str]:
        """Episodes in the index (committed or exported, not quarantined), in the order they were seen."""
        with self._lock:
            return [e.episode_id for e in self._episodes]

    @property
    def total_windows(self) -> int:
        return self.index.total_windows

    # -- reading frames
    def _staged(self, episode_id: str) -> StagedEpisode:
        store = self.store
        staging = store.staging if store is not None else None
        if staging is None:  # an episode in the index means a job is bound: cannot happen
            raise RuntimeError(f"{self.store_dir} has no job fingerprint")
        ep = self._episodes[self._slot_of[episode_id]]
        return staging.read_episode(episode_id, ep.frames, ep.video_bytes)

    def _numbers(self, episode_id: str) -> dict[str, np.ndarray]:
        cached = self._cache.get(episode_id)
        if cached is not None:
            self._cache.move_to_end(episode_id)
            return cached
        staged = self._staged(episode_id)
        data = {**staged.state, "action": staged.action, "next.reward": staged.reward,
                **{annotation_key(k): staged.annotations[:, i].astype(np.int64) for i, k in enumerate(ANNOTATION_KEYS)}}
        self._cache[episode_id] = data
        while len(self._cache) > self.cache_episodes:
            self._cache.popitem(last=False)
        return data

    def _images(self, episode_id: str) -> dict[str, np.ndarray]:
        cached = self._video_cache.get(episode_id)
        if cached is not None:
            self._video_cache.move_to_end(episode_id)
            return cached
        store = self.store
        fingerprint = store.fingerprint if store is not None else None
        depth = {c.name for c in fingerprint.cameras if c.is_depth} if fingerprint is not None else set()
        data = {}
        for camera, stream in self._staged(episode_id).video.items():
            if camera in depth and fingerprint is not None and fingerprint.depth_video is not None:
                # A depth camera: metres (N, H, W) float32, decoded from its 12-bit codes by LeRobot's dequantizer.
                codes = depth_video.decode_codes(stream)
                data[camera_key(camera)] = depth_video.dequantize(np.stack([codes[i] for i in sorted(codes)]),
                                                                  fingerprint.depth_video)
            else:
                data[camera_key(camera)] = decode_frames(stream)
        self._video_cache[episode_id] = data
        while len(self._video_cache) > self.video_cache_episodes:
            self._video_cache.popitem(last=False)
        return data

    def read_windows(self, windows: Sequence[Window], *, video: bool = False) -> dict[str, Any]:
        """Stack the windows' frames: ``{feature: array (B, chunk_size, ...)}`` with the export's feature
        names (state features, ``action``, ``next.reward``, ``annotation.<key>``; with ``video=True`` also
        ``observation.images.<camera>`` as uint8 (B, C, H, W, 3), a depth camera as float32 metres
        (B, C, H, W)), plus ``episode_id`` and ``start``.
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
            if self._store is not None:
                self._store.close()
                self._store = None
            self._cache.clear()
            self._video_cache.clear()

    def __enter__(self) -> OnlineWindowSampler:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
