"""Zarr staging: each attempt's numeric data and encoded camera streams, written in whole shards.

Layout under ``STORE/staging.zarr`` (staging format 3)::

    episodes/<episode_id>/                   group; attributes demoforge_staging_format = 3, demoforge_stats
    episodes/<episode_id>/state.<feature>    (N, *shape) float32   shards of 1024 frames (16 chunks of 64)
    episodes/<episode_id>/action             (N, A) float32
    episodes/<episode_id>/reward             (N,) float32
    episodes/<episode_id>/annotations        (N, 8) int32          columns = schema.ANNOTATION_KEYS
    episodes/<episode_id>/video.<camera>     (B,) uint8            fragmented MP4 bytes, shards of 1 MiB
                                                                   (16 chunks of 64 KiB)

Zarr v3 sharding: each array stores one file per shard (``c/<i>/0``) plus its ``zarr.json``, so an episode
of up to 1024 frames is ``1 + 2 x arrays`` files whatever its length (11 for ALOHA, was 28), and a long one
adds one file per array per 1024 frames. A shard is written once, whole: the writer buffers a shard's rows
(1024 x row bytes: ~150 KB for ALOHA) and a camera's bytes (at most 1 MiB), so memory stays bounded for any
episode length. (zarr's write path copies a video shard twice more, for its checksum and the shard's
assembly, so three shards' worth is what an attempt's peak memory grows by as it gets longer: 1 MiB shards,
not the 4 MiB of earlier stores, which are read as they are, a reader taking each array's shard size from
its metadata.) Inside a shard, chunks keep ``chunk_frames`` rows so a reader can decode a few frames without
the whole shard, and a video tail pads to 64 KiB, not to the 1 MiB chunk of format 1 (a 20-frame toy episode
took 1.1 MB on disk, now ~70 KB).

Arrays are created with a fixed, very large shape and written shard by shard, so no write ever rewrites
``zarr.json`` (zarr's ``append`` writes the new shape before the data: after a crash the shape can run ahead
of the data). The durable lengths (frames, video bytes) live in the catalog row written at commit; readers
slice with them and never trust an array's shape. Every chunk carries a crc32c checksum (last codec) and so
does every shard's index, so a flipped byte or a truncated shard fails loudly on read.

Format 3 is format 2 plus the episode's feature statistics (``demoforge_stats``: LeRobot's min, max, mean,
std, count and quantiles of every array and camera, ``storage/episode_stats.py``), written at the attempt's
end and covered by its content hash, so export reads them instead of decoding video. An attempt is created
in format 2 and becomes format 3 when its statistics are written (one atomic rewrite of its ``zarr.json``). Formats 1 (no format
attribute: ``state/<feature>``, ``video/<camera>``, unsharded 64-frame and 1 MiB chunks) and 2 are still read,
so older stores keep working (their episodes' statistics are computed when they are exported); new episodes
in them are written in format 3. A store whose catalog records a newer format than this code knows is
refused (:class:`StagingFormatError`).
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import json
import os
import re
import shutil
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import zarr
import zarr.api.asynchronous
from zarr.codecs import BytesCodec, Crc32cCodec, ZstdCodec
from zarr.core.array_spec import ArrayConfigParams
from zarr.core.sync import sync as zarr_sync

from demoforge.storage.durable import FsyncPool, fsync_dir, fsync_file
from demoforge.storage.episode_stats import EpisodeStats
from demoforge.storage.errors import ReadOnlyError
from demoforge.storage.paths import EPISODES_DIR, STAGING_DIR
from demoforge.storage.lerobot_stats import json_digest
from demoforge.storage.schema import ANNOTATION_KEYS
from demoforge.storage.schema import CameraSpec, Fingerprint
from demoforge.storage.write_errors import writing

MAX_FRAMES = 1 << 31  # the nominal shape; only written chunks exist on disk
MAX_VIDEO_BYTES = 1 << 46
STAGING_FORMAT = 3  # what this code writes; it reads 1 to 3
READS_FORMATS = (1, 2, 3)
FORMAT_ATTRIBUTE = "demoforge_staging_format"
STATS_ATTRIBUTE = "demoforge_stats"  # format 3: the episode's feature statistics
SHARD_CHUNKS = 16  # chunks of ``chunk_frames`` rows per shard: 1024 frames, one shard for most episodes
VIDEO_CHUNK_BYTES = 1 << 16  # 64 KiB: the most a video tail is padded
VIDEO_SHARD_BYTES = 1 << 20  # 1 MiB per camera: the writer's buffer, and the file size of a long stream
EPISODE_ID = re.compile(r"ep[0-9]{8,}-a[0-9]{2,}")  # stages.records.AttemptKey.episode_id


class StagingCorruptError(Exception):
    """A staged chunk failed its checksum, is missing, or disagrees with the catalog's counts."""


class StagingFormatError(RuntimeError):
    """The staging data was written in a format this code does not read (a newer demoforge)."""


def array_path(name: str, staging_format: int) -> str:
    """Where a logical array (``state/<f>``, ``action``, ``video/<camera>``, ...) lives in an episode group:
    format 1 nests ``state`` and ``video`` groups; format 2 flattens them (two fewer ``zarr.json`` files)."""
    return name if staging_format == 1 else name.replace("/", ".", 1)


def staged_episode_path(store_dir: Path, episode_id: str) -> Path:
    """The folder of one staged attempt. Ids come from the catalog; a tampered row must never turn a delete
    or a read into one outside the store."""
    if not isinstance(episode_id, str) or not EPISODE_ID.fullmatch(episode_id):
        raise StagingCorruptError(f"unsafe episode id {episode_id!r} in the catalog (expected epNNNNNNNN-aNN)")
    return Path(store_dir) / STAGING_DIR / EPISODES_DIR / episode_id


def staged_episode_ids(store_dir: Path) -> list[str]:
    """Every staged attempt folder on disk, whatever its catalog state (recovery and audits)."""
    base = Path(store_dir) / STAGING_DIR / EPISODES_DIR
    return sorted(p.name for p in base.iterdir() if p.is_dir()) if base.exists() else []


@dataclass(frozen=True)
class StagingLayout:
    """The features of one job's episodes: what arrays each staged episode has."""

    state_shapes: Mapping[str, tuple[int, ...]]
    action_shape: tuple[int, ...]
    cameras: tuple[CameraSpec, ...]
    chunk_frames: int = 64

    @classmethod
    def from_fingerprint(cls, fingerprint: Fingerprint) -> StagingLayout:
        return cls(state_shapes=fingerprint.state_shapes, action_shape=fingerprint.action_shape,
                   cameras=fingerprint.cameras, chunk_frames=fingerprint.chunk_frames)

    @property
    def camera_names(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.cameras)


# zarr skips writing a chunk whose values all equal the fill value; a committed chunk of all-zero rewards
# must still exist on disk, or it could not be told apart from a lost one.
_WRITE_EVERY_CHUNK: ArrayConfigParams = {"write_empty_chunks": True}


def _numeric_codecs() -> dict:
    return {"compressors": [ZstdCodec(level=3), Crc32cCodec()], "serializer": BytesCodec()}


class _ChunkBuffer:
    """Accumulates rows in memory and hands them out one whole chunk at a time for writing."""

    def __init__(self, name: str, chunk_rows: int, row_shape: tuple[int, ...], dtype: np.dtype) -> None:
        self.name = name
        self.array: zarr.Array | None = None  # set by EpisodeWriter.create()
        self.chunk = chunk_rows
        self.buf = np.zeros((chunk_rows, *row_shape), dtype=dtype)
        self.fill = 0
        self.written = 0  # rows handed out for writing (on disk once their write ran)
        self.hash = hashlib.blake2b(digest_size=16)

    def add(self, row: np.ndarray) -> bool:
        """Buffer one row; True when the chunk is full and should be flushed."""
        self.buf[self.fill] = row
        self.fill += 1
        return self.fill == self.chunk

    def take(self) -> _Part | None:
        """Detach the buffered rows (a copy) as the next part to write."""
        if not self.fill:
            return None
        part = _Part(self, self.written, self.buf[:self.fill].copy())
        self.written += self.fill
        self.fill = 0
        return part

    def write(self, start: int, data: np.ndarray) -> None:
        assert self.array is not None, "EpisodeWriter.create() must run before any write"
        self.array[start:start + len(data)] = data
        self.hash.update(data)  # its buffer, not a copy


class _ByteStream:
    """An append-only byte stream stored as a 1-D uint8 array in whole chunks."""

    def __init__(self, name: str, shard_bytes: int) -> None:
        self.name = name
        self.shard = shard_bytes
        self.array: zarr.Array | None = None  # set by EpisodeWriter.create()
        self.pending = bytearray()
        self.written = 0  # bytes handed out for writing
        self.hash = hashlib.blake2b(digest_size=16)

    def add(self, data: bytes) -> bool:
        self.pending += data
        return len(self.pending) >= self.shard

    def take(self, final: bool) -> _Part | None:
        """Detach whole shards (every pending byte when ``final``) as the next part to write."""
        whole = len(self.pending) if final else len(self.pending) // self.shard * self.shard
        if not whole:
            return None
        # No copy of the detached bytes: the buffer itself becomes the part, and a new one starts with the rest
        # (less than a packet while recording). Every copy of a shard is held per attempt being written.
        detached, self.pending = self.pending, bytearray(memoryview(self.pending)[whole:])
        part = _Part(self, self.written, np.frombuffer(detached, dtype=np.uint8, count=whole))
        self.written += whole
        return part

    def write(self, start: int, data: np.ndarray) -> None:
        assert self.array is not None, "EpisodeWriter.create() must run before any write"
        self.array[start:start + len(data)] = data
        self.hash.update(data)  # its buffer, not a copy


@dataclass(frozen=True, eq=False)
class _Part:
    """Rows or bytes detached from a buffer, to be written at ``start`` of its array."""

    target: _ChunkBuffer | _ByteStream
    start: int
    data: np.ndarray


@dataclass(frozen=True, eq=False)
class ChunkWrites:
    """Whole chunks detached from an :class:`EpisodeWriter`'s buffers; :meth:`EpisodeWriter.write` writes
    them. Parts of one writer must be written in the order they were taken (each array's digest is a running
    hash of its data)."""

    parts: tuple[_Part, ...]

    def __bool__(self) -> bool:
        return bool(self.parts)


class EpisodeWriter:
    """Stages one attempt. Not thread-safe: one stage owns it.

    Two halves, so I/O never holds up buffering: :meth:`add_frame` / :meth:`add_video` / :meth:`take_full` /
    :meth:`take_all` only touch memory, while :meth:`create` (the arrays) and :meth:`write` (detached
    chunks) do the blocking I/O and may run in one worker thread, in the order they were issued.
    """

    def __init__(self, root: zarr.Group, path: Path, episode_id: str, layout: StagingLayout) -> None:
        self.path = path
        self.episode_id = episode_id
        self.layout = layout
        self._root = root
        shard = layout.chunk_frames * SHARD_CHUNKS  # buffers hold a whole shard: every write is a whole shard
        self._numeric: dict[str, _ChunkBuffer] = {}
        self._shapes: dict[str, tuple[tuple[int, ...], str]] = {}

        def numeric(name: str, shape: tuple[int, ...], dtype: str) -> None:
            self._numeric[name] = _ChunkBuffer(name, shard, shape, np.dtype(dtype))
            self._shapes[name] = (shape, dtype)

        for feature, shape in layout.state_shapes.items():
            numeric(f"state/{feature}", tuple(shape), "float32")
        numeric("action", tuple(layout.action_shape), "float32")
        numeric("reward", (), "float32")
        numeric("annotations", (len(ANNOTATION_KEYS),), "int32")
        self._video: dict[str, _ByteStream] = {camera: _ByteStream(f"video/{camera}", VIDEO_SHARD_BYTES)
                                               for camera in layout.camera_names}
        self.frames = 0
        self.created = False
        self._group: zarr.Group | None = None
        self._stats_digest: str | None = None

    def create(self) -> None:
        """Create the attempt's arrays (blocking I/O); before any :meth:`write`."""
        if self.path.exists():
            raise FileExistsError(f"staged data for {self.episode_id} already exists at {self.path}")
        with writing(f"the staging folder of episode {self.episode_id}", self.path):
            # Format 2 until write_stats() adds the statistics (one rewrite of the group's zarr.json, atomic).
            group = self._root.create_group(f"{EPISODES_DIR}/{self.episode_id}", attributes={FORMAT_ATTRIBUTE: 2})
            self._group = group
            c = self.layout.chunk_frames
            for name, buf in self._numeric.items():
                shape, dtype = self._shapes[name]
                buf.array = group.create_array(array_path(name, STAGING_FORMAT), shape=(MAX_FRAMES, *shape),
                                               chunks=(c, *shape), shards=(buf.chunk, *shape), dtype=dtype,
                                               fill_value=0, config=_WRITE_EVERY_CHUNK, **_numeric_codecs())
            for stream in self._video.values():
                stream.array = group.create_array(array_path(stream.name, STAGING_FORMAT), shape=(MAX_VIDEO_BYTES,),
                                                  chunks=(VIDEO_CHUNK_BYTES,), shards=(stream.shard,), dtype="uint8",
                                                  fill_value=0, compressors=[Crc32cCodec()], serializer=BytesCodec(),
                                                  config=_WRITE_EVERY_CHUNK)
        self.created = True

    def add_frame(self, state: Mapping[str, np.ndarray], action: np.ndarray, reward: float,
                  annotations: tuple[int, ...]) -> bool:
        """Buffer one frame's numbers; True when whole chunks are ready for :meth:`take_full`."""
        if set(state) != set(self.layout.state_shapes):
            raise ValueError(f"frame state keys {sorted(state)} differ from the job's "
                             f"{sorted(self.layout.state_shapes)}")
        full = False
        for feature, value in state.items():
            full |= self._numeric[f"state/{feature}"].add(value)
        full |= self._numeric["action"].add(action)
        full |= self._numeric["reward"].add(np.asarray(reward, dtype=np.float32))
        full |= self._numeric["annotations"].add(np.asarray(annotations, dtype=np.int32))
        self.frames += 1
        return full

    def add_video(self, camera: str, data: bytes) -> bool:
        """Buffer encoded bytes of one camera; True when a whole chunk is ready."""
        return self._video[camera].add(data) if data else False

    def take_full(self) -> ChunkWrites:
        """Detach every whole chunk from the buffers (memory only)."""
        parts = [buf.take() for buf in self._numeric.values() if buf.fill == buf.chunk]
        parts += [stream.take(final=False) for stream in self._video.values()]
        return ChunkWrites(tuple(p for p in parts if p is not None))

    def take_all(self) -> ChunkWrites:
        """Detach everything buffered, partial tail chunks included (the attempt's last writes)."""
        parts = [buf.take() for buf in self._numeric.values()]
        parts += [stream.take(final=True) for stream in self._video.values()]
        return ChunkWrites(tuple(p for p in parts if p is not None))

    def write(self, writes: ChunkWrites) -> None:
        """Write detached shards (blocking I/O: call it from a worker thread, after :meth:`create`)."""
        with writing(f"staged data of episode {self.episode_id}", self.path):
            for part in writes.parts:
                part.target.write(part.start, part.data)

    def flush_full(self) -> None:
        """Write every whole chunk now (blocking I/O)."""
        self.write(self.take_full())

    def flush_all(self) -> dict[str, int]:
        """Write the partial tail chunks now; returns the byte length of each camera stream."""
        self.write(self.take_all())
        return self.video_bytes()

    def video_bytes(self) -> dict[str, int]:
        """The byte length of each camera stream handed out for writing."""
        return {camera: stream.written for camera, stream in self._video.items()}

    def write_stats(self, cameras: Mapping[str, Mapping[str, np.ndarray]]) -> None:
        """Store the episode's feature statistics with it (blocking I/O, after its last :meth:`write`): those of
        the numeric arrays computed from what was staged (read back), ``cameras``' from their encoders."""
        assert self._group is not None, "EpisodeWriter.create() must run before write_stats()"
        missing = sorted(set(self.layout.camera_names) - set(cameras))
        if missing:
            raise ValueError(f"episode {self.episode_id}: no frame statistics for camera(s) {missing}")
        with writing(f"the statistics of episode {self.episode_id}", self.path):
            staged = {name: np.asarray(buf.array[:self.frames]) for name, buf in self._numeric.items()
                      if buf.array is not None}
            stats = EpisodeStats.compute({f: staged[f"state/{f}"] for f in self.layout.state_shapes},
                                         staged["action"], staged["reward"], staged["annotations"],
                                         {c: dict(cameras[c]) for c in self.layout.camera_names})
            record = stats.to_json()
            self._group.update_attributes({FORMAT_ATTRIBUTE: STAGING_FORMAT, STATS_ATTRIBUTE: record})
        self._stats_digest = json_digest(record)

    def content_hash(self) -> str:
        """A digest of everything written, per array, and of the statistics; :meth:`StagedEpisode.content_hash`
        recomputes it."""
        digests = {name: buf.hash.hexdigest() for name, buf in self._numeric.items()}
        digests |= {f"video/{camera}": stream.hash.hexdigest() for camera, stream in self._video.items()}
        if self._stats_digest is not None:
            digests["stats"] = self._stats_digest
        return combine_digests(digests)

    def buffered_bytes(self) -> int:
        return sum(b.buf.nbytes for b in self._numeric.values()) + sum(len(s.pending) for s in self._video.values())


@dataclass(frozen=True)
class StagedEpisode:
    """A committed episode read back: arrays sliced to the catalog's durable counts, and (format 3) its
    statistics record as stored (``storage/episode_stats.py``; None for episodes staged before format 3)."""

    state: dict[str, np.ndarray]
    action: np.ndarray
    reward: np.ndarray
    annotations: np.ndarray
    video: dict[str, bytes]
    stats: Mapping[str, object] | None = None

    def content_hash(self) -> str:
        arrays = {f"state/{k}": v for k, v in self.state.items()}
        arrays |= {"action": self.action, "reward": self.reward, "annotations": self.annotations}
        digests = {name: hashlib.blake2b(np.ascontiguousarray(a).tobytes(), digest_size=16).hexdigest()
                   for name, a in arrays.items()}
        digests |= {f"video/{c}": hashlib.blake2b(data, digest_size=16).hexdigest() for c, data in self.video.items()}
        if self.stats is not None:
            digests["stats"] = json_digest(self.stats)
        return combine_digests(digests)

    def recorded_stats(self) -> EpisodeStats | None:
        """The statistics stored at commit, parsed (None before format 3); StagingCorruptError if unreadable."""
        return self._parsed_stats

    @functools.cached_property
    def _parsed_stats(self) -> EpisodeStats | None:  # parsed once: verify checks it, export then reads it
        if self.stats is None:
            return None
        try:
            return EpisodeStats.from_json(self.stats)
        except ValueError as exc:
            raise StagingCorruptError(f"the stored statistics cannot be read: {exc}") from None


def combine_digests(digests: Mapping[str, str]) -> str:
    joined = "\n".join(f"{name}={digest}" for name, digest in sorted(digests.items()))
    return hashlib.blake2b(joined.encode(), digest_size=16).hexdigest()


class StagingStore:
    """The Zarr staging area of one job store. ``read_only``: a reader's view, which creates nothing and
    refuses every write with :class:`ReadOnlyError` (committed episodes are read with their catalog counts)."""

    def __init__(self, store_dir: Path, layout: StagingLayout, *, read_only: bool = False) -> None:
        self.store_dir = Path(store_dir)
        self.path = self.store_dir / STAGING_DIR
        self.layout = layout
        self.read_only = read_only
        self._root: zarr.Group | None = None
        self._fsync = FsyncPool()  # the episodes' commits; closed with the store
        if not read_only:
            self._root = zarr.open_group(str(self.path), mode="a")
            self._root.require_group(EPISODES_DIR)
            self._make_skeleton_durable()

    def _make_skeleton_durable(self) -> None:
        """fsync the staging area's own metadata and folders, up to the store folder: zarr never fsyncs, and
        after a power cut a ``zarr.json`` whose name survived without its bytes (or a ``staging.zarr`` never
        fsynced into the store) would make every committed episode unreadable."""
        episodes = self.path / EPISODES_DIR
        with writing("the staging area (fsync)", self.path):
            for meta in (self.path / "zarr.json", episodes / "zarr.json"):
                if meta.exists():
                    fsync_file(meta)
            fsync_dir(episodes)
            fsync_dir(self.path)
            fsync_dir(self.store_dir)

    def close(self) -> None:
        """Stop the fsync threads (a writer's; nothing else needs closing)."""
        self._fsync.close()

    def _writable(self, operation: str) -> zarr.Group:
        if self._root is None:
            raise ReadOnlyError(operation, f"the staging area {self.path}")
        return self._root

    def episode_path(self, episode_id: str) -> Path:
        return staged_episode_path(self.store_dir, episode_id)

    def open_episode(self, episode_id: str) -> EpisodeWriter:
        """A writer whose arrays exist (blocking I/O)."""
        writer = self.prepare_episode(episode_id)
        writer.create()
        return writer

    def prepare_episode(self, episode_id: str) -> EpisodeWriter:
        """A writer that buffers in memory; its :meth:`EpisodeWriter.create` makes the arrays later."""
        root = self._writable(f"stage episode {episode_id}")
        if self.episode_path(episode_id).exists():
            raise FileExistsError(f"staged data for {episode_id} already exists at {self.episode_path(episode_id)}")
        return EpisodeWriter(root, self.episode_path(episode_id), episode_id, self.layout)

    def delete_episode(self, episode_id: str) -> bool:
        self._writable(f"delete episode {episode_id}")
        path = self.episode_path(episode_id)
        if not path.exists():
            return False
        shutil.rmtree(path)
        fsync_dir(path.parent)
        return True

    def episode_ids(self) -> list[str]:
        return staged_episode_ids(self.store_dir)

    def make_durable(self, episode_id: str) -> None:
        """fsync every file and directory of the episode, then its parents (zarr itself never fsyncs).

        The episode's files and folders are fsynced concurrently: the filesystem folds concurrent fsyncs
        into few journal commits (measured 5-15x faster for an episode's ~50 files than one after another,
        docs/scale-out.md); all of them have returned before this does."""
        self._writable(f"make episode {episode_id} durable")
        path = self.episode_path(episode_id)
        with writing(f"staged data of episode {episode_id} (fsync)", path):
            files: list[Path] = []
            dirs: list[Path] = []
            for dirpath, _dirnames, filenames in os.walk(path):
                files.extend(Path(dirpath) / name for name in filenames)
                dirs.append(Path(dirpath))
            self._fsync.fsync_all(files, dirs)
            fsync_dir(path.parent)
            fsync_dir(self.path)

    def _attributes(self, episode_id: str) -> tuple[int, dict]:
        """The staging format of one staged episode (1 when the group has no format attribute) and its group
        attributes."""
        try:
            attrs = json.loads((self.episode_path(episode_id) / "zarr.json").read_text()).get("attributes", {})
        except (OSError, ValueError) as exc:
            raise StagingCorruptError(f"episode {episode_id}: group metadata cannot be read ({exc})") from exc
        staging_format = attrs.get(FORMAT_ATTRIBUTE, 1)
        if staging_format not in READS_FORMATS:
            raise StagingFormatError(f"episode {episode_id} is in staging format {staging_format!r}; this demoforge "
                                     f"reads formats 1 to {STAGING_FORMAT}: use a newer demoforge")
        return int(staging_format), attrs

    def episode_format(self, episode_id: str) -> int:
        """The staging format of one staged episode (1 when the group has no format attribute)."""
        return self._attributes(episode_id)[0]

    def read_episode(self, episode_id: str, frames: int, video_bytes: Mapping[str, int]) -> StagedEpisode:
        """Read a committed episode back, verifying every chunk's checksum."""
        staging_format, attrs = self._attributes(episode_id)
        stats = attrs.get(STATS_ATTRIBUTE)
        if staging_format >= 3 and not isinstance(stats, dict):
            raise StagingCorruptError(f"episode {episode_id}: its statistics ({STATS_ATTRIBUTE}) are missing")

        numeric = [f"state/{f}" for f in self.layout.state_shapes] + ["action", "reward", "annotations"]
        wanted = {array_path(name, staging_format): frames for name in numeric}
        wanted |= {array_path(f"video/{c}", staging_format): video_bytes[c] for c in self.layout.camera_names}
        try:
            got, layouts = zarr_sync(_read_arrays(self.episode_path(episode_id), wanted))
        except (ValueError, KeyError, FileNotFoundError, OSError) as exc:
            raise StagingCorruptError(f"episode {episode_id}: {type(exc).__name__}: {exc}") from exc
        values = [got[array_path(name, staging_format)] for name in numeric]
        state = dict(zip(self.layout.state_shapes, values[:-3]))
        action, reward, annotations = values[-3:]
        video = {c: got[array_path(f"video/{c}", staging_format)].tobytes() for c in self.layout.camera_names}
        self._check_chunks_exist(episode_id, wanted, layouts)
        return StagedEpisode(state, action, reward, annotations, video, stats if staging_format >= 3 else None)

    def _check_chunks_exist(self, episode_id: str, lengths: Mapping[str, int],
                            layouts: Mapping[str, tuple[int, int]]) -> None:
        """A missing chunk (format 1) or shard (format 2) reads back as the fill value; make that an error for
        committed data. (Within a shard every chunk is listed in the shard's checksummed index.) ``lengths``:
        each array's durable rows (bytes for a video); ``layouts``: its rows per file and its number of
        dimensions, as its metadata says (stores of other formats and versions used other sizes)."""
        base = self.episode_path(episode_id)
        expected: list[Path] = []
        for path, length in lengths.items():
            rows, ndim = layouts[path]
            folder = base / path / "c"
            inner = "/".join(["0"] * (ndim - 1))  # a row's own dimensions are one chunk wide
            expected += [folder / str(i) / inner if inner else folder / str(i) for i in range(-(-length // rows))]
        missing = [str(p.relative_to(base)) for p in expected if not p.exists()]
        if missing:
            raise StagingCorruptError(f"episode {episode_id}: missing chunks {missing[:5]}")

    def iter_partial_files(self) -> Iterator[Path]:
        """Temp files a killed zarr write leaves behind (``*.partial``)."""
        if self.path.exists():
            yield from self.path.rglob("*.partial")


def _async_array(node: object, name: str) -> zarr.AsyncArray[Any]:
    """A staged array read through zarr's async API (a group there would mean a tampered episode)."""
    if not isinstance(node, zarr.AsyncArray):
        raise StagingCorruptError(f"{name} is a {type(node).__name__} in the staged episode, not an array")
    return node


async def _read_arrays(group_path: Path, lengths: Mapping[str, int]
                       ) -> tuple[dict[str, np.ndarray], dict[str, tuple[int, int]]]:
    """The first ``lengths[name]`` rows of each array of a staged episode, all read concurrently in one trip to
    zarr's I/O loop (one sync call per array costs a thread hand-off each, which dominated reading), and each
    array's rows per file (its shard, or its chunk where unsharded) and number of dimensions."""
    group = await zarr.api.asynchronous.open_group(store=str(group_path), mode="r")
    names = list(lengths)
    arrays = await asyncio.gather(*(group.getitem(name) for name in names))
    data = await asyncio.gather(*(_async_array(array, name).getitem(slice(0, lengths[name]))
                                  for name, array in zip(names, arrays)))
    layouts = {name: ((array.shards or array.chunks)[0], array.ndim) for name, array in zip(names, arrays)
               if isinstance(array, zarr.AsyncArray)}
    return {name: np.asarray(values) for name, values in zip(names, data)}, layouts
