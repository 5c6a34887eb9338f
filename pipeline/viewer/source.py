"""What the viewer shows, read from a demoforge store or an exported LeRobot v3.0 dataset.

The only module of the viewer that knows how stores and datasets are laid out: the server and the static
site see :class:`ViewerSource` and nothing else, so this file alone follows a change of the storage read side.

A dataset is pinned at open: ``OUT`` (a link to ``OUT.versions/vNNNNNN``) is resolved once and every file of
that version is held open (:class:`~demoforge.pipeline.viewer.files.PinnedTree`), so a new export while the page
is open changes nothing it shows. A store is read as a snapshot of its catalog at open (a writer may run on);
committed episodes are immutable, their camera streams are remuxed to mp4 on demand.

Depth cameras (lossless 12-bit HEVC, which browsers do not play) are shown as colour-mapped H.264 previews
(``depth_preview``), generated from one episode's frames on demand, for stores and datasets alike, and kept in
memory: nothing is ever written into the store or dataset.
"""

from __future__ import annotations

import json
import os
import re
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from demoforge.storage.lerobot import format as dataset_files
from demoforge.storage.paths import CATALOG_FILE
from demoforge.pipeline.viewer.files import PinnedTree, ViewerError
from demoforge.pipeline.viewer.marks import RejectionMarks

if TYPE_CHECKING:
    from demoforge.storage.schema import DepthVideoIdentity
    from demoforge.storage.staging import StagedEpisode
    from demoforge.pipeline.viewer.depth_preview import DepthPreview

CAMERA_PREFIX = "observation.images."
# The dataset's files as path parts (PinnedTree keys); their names live in storage/lerobot/format.py.
SIDECAR, INFO, MARKER = (tuple(p.split("/")) for p in (dataset_files.SIDECAR, dataset_files.INFO, dataset_files.MARKER))
CURVE_DTYPES = ("float32", "float64")
DEPTH_CACHE = 16  # a dataset's depth previews kept in memory
EPISODE_KEY = re.compile(r"[0-9]{1,12}|ep[0-9]{8,}-a[0-9]{2,}")


@dataclass(frozen=True)
class VideoRef:
    """One camera of one episode: a file the page loads, and where the episode lies in it (seconds)."""

    camera: str
    url: str  # relative to the page: "files/<path in the dataset>" or "media/<episode key>/<camera>.mp4"
    from_s: float
    to_s: float
    kind: str = "rgb"  # "depth": a colour-mapped preview, near_m (yellow) to far_m (dark blue)
    near_m: float | None = None
    far_m: float | None = None


@dataclass(frozen=True)
class EpisodeEntry:
    """A row of the episode list."""

    key: str  # the dataset index, or a store attempt's episode id
    dataset_index: int | None
    episode_index: int | None  # the job's episode index (staging)
    attempt: int | None
    seed: int | None
    length: int
    outcome: str  # "success", a terminal reason ("failure", "error", ...), "quarantined", "in progress", "unknown"
    state: str  # "exported" for datasets; the catalog state for stores
    segments: tuple[str, ...]
    playable: bool  # has frames to show (discarded attempts' frames are deleted at discard)
    reason: str | None = None  # why an attempt was discarded or quarantined


@dataclass(frozen=True)
class Curve:
    """A numeric feature over an episode: ``values[frame][dim]`` (None where not finite)."""

    name: str
    values: list[list[float | None]]


@dataclass(frozen=True)
class EpisodeView:
    entry: EpisodeEntry
    record: Mapping[str, Any]  # the episode record: segments, instruction, error texts, timings
    curves: tuple[Curve, ...] = ()
    videos: tuple[VideoRef, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {"entry": asdict(self.entry), "record": dict(self.record),
                "curves": [asdict(c) for c in self.curves], "videos": [asdict(v) for v in self.videos]}


@dataclass(frozen=True)
class SourceSummary:
    kind: str  # "dataset" or "store"
    name: str
    location: str
    version: str | None
    fps: int
    cameras: tuple[str, ...]
    task: str | None
    notes: tuple[str, ...] = field(default_factory=tuple)


class ViewerSource(Protocol):
    summary: SourceSummary
    rejections: RejectionMarks | None  # a dataset's rejected list (None: a store, nothing to reject)

    @property
    def files(self) -> PinnedTree | None:
        """The pinned files served under files/ (datasets), or None (stores)."""

    def entries(self) -> list[EpisodeEntry]: ...

    def episode(self, key: str) -> EpisodeView:
        """Raises KeyError for a key not in :meth:`entries`."""

    def media(self, parts: tuple[str, ...]) -> bytes | None:
        """A generated file under media/ (a store's remuxed camera streams, depth previews), or None."""

    def media_of(self, key: str) -> list[tuple[str, ...]]:
        """The media/ names an episode's page loads (for the static site)."""

    def close(self) -> None: ...


def open_source(path: Path | str) -> ViewerSource:
    path = Path(path)
    if not path.exists():
        raise ViewerError(f"{path} does not exist")
    if (path / CATALOG_FILE).is_file():
        return ViewedStore(path)
    if (path / dataset_files.INFO).is_file():
        return ViewedDataset(path)
    raise ViewerError(f"{path} is neither a demoforge store ({CATALOG_FILE}) nor a LeRobot dataset "
                      f"({dataset_files.INFO})")


def _finite_rows(array: np.ndarray) -> list[list[float | None]]:
    array = np.asarray(array, dtype=np.float64).reshape(len(array), -1)
    rounded = np.round(array, 6)
    ok = np.isfinite(rounded)
    if ok.all():
        return rounded.tolist()
    return [[float(v) if good else None for v, good in zip(row, oks)] for row, oks in zip(rounded, ok)]


def _curve_order(name: str) -> tuple[int, str]:
    return (0 if name == "action" else 1 if name.startswith("observation.") else 2, name)


class _MediaCache:
    """The last few generated media files, by URL parts. Generation runs one at a time (one episode's frames
    in memory at once, however many requests arrive), and a file another request just made is not made again."""

    def __init__(self, size: int) -> None:
        self._size = size
        self._items: OrderedDict[tuple[str, ...], Any] = OrderedDict()
        self._lock = threading.Lock()
        self._making = threading.Lock()

    def _get(self, parts: tuple[str, ...]) -> Any:
        with self._lock:
            if parts in self._items:
                self._items.move_to_end(parts)
                return self._items[parts]
        return None

    def get_or_make(self, parts: tuple[str, ...], make: Callable[[], Any]) -> Any:
        found = self._get(parts)
        if found is not None:
            return found
        with self._making:
            found = self._get(parts)
            if found is not None:
                return found
            made = make()
        with self._lock:
            self._items[parts] = made
            while len(self._items) > self._size:
                self._items.popitem(last=False)
        return made


def _depth_preview(codes: Callable[[], list[np.ndarray]], identity: DepthVideoIdentity, fps: int, length: int,
                   what: str, check: str) -> DepthPreview:
    """The preview of one episode's depth camera; ``what`` names it in errors ("episode 3, camera front"),
    ``check`` is the command that checks the files it comes from."""
    import av

    from demoforge.pipeline.viewer.depth_preview import encode_preview

    try:
        frames = codes()
    except (av.error.FFmpegError, OSError, ValueError) as exc:
        raise ViewerError(f"{what}: cannot decode the depth video ({type(exc).__name__}: {exc}); nothing was "
                          f"written; `{check}` checks its files") from None
    if len(frames) != length:
        raise ViewerError(f"{what}: the depth video has {len(frames)} frame(s) for this episode, the episode has "
                          f"{length}; nothing was written; `{check}` checks its files")
    try:
        return encode_preview(np.stack(frames), identity, fps)
    except (av.error.FFmpegError, ValueError) as exc:
        raise ViewerError(f"{what}: cannot encode the depth preview: {type(exc).__name__}: {exc}") from None


# ---------------------------------------------------------------------------------------------- dataset
class ViewedDataset:
    """A LeRobot v3.0 dataset; segments come from demoforge's sidecar when there is one."""

    rejections: RejectionMarks | None  # the rejected list beside the dataset

    def __init__(self, path: Path) -> None:
        version_dir = Path(os.path.realpath(path))  # OUT -> OUT.versions/vNNNNNN, resolved once
        try:
            self.files = PinnedTree(version_dir)
        except OSError as exc:
            raise ViewerError(f"cannot read {path}: {exc.strerror or exc}") from None
        try:
            self._load(path, version_dir)
        except (ValueError, KeyError, TypeError, AttributeError, OSError) as exc:  # pyarrow's errors are ValueErrors
            self.files.close()
            raise ViewerError(f"{path} cannot be read as a LeRobot dataset: {type(exc).__name__}: {exc}") from None
        except BaseException:
            self.files.close()
            raise

    def _load(self, path: Path, version_dir: Path) -> None:
        import pyarrow.parquet as pq

        from demoforge.storage.lerobot.format import depth_identity_of_info

        if self.files.get(INFO) is None:
            raise ViewerError(f"{path}: meta/info.json is not a regular file")
        info = json.loads(self.files.read(INFO))
        self.fps = int(info["fps"])
        features: Mapping[str, Mapping[str, Any]] = info["features"]
        self._video_path = str(info.get("video_path") or "")
        self._data_path = str(info["data_path"])
        self.video_keys = [k for k, f in features.items() if f.get("dtype") == "video"]
        self._depth = {k: identity for k in self.video_keys
                       if (identity := depth_identity_of_info(features[k].get("info") or {})) is not None}
        self._media = _MediaCache(DEPTH_CACHE)
        self.curve_keys = sorted((k for k, f in features.items()
                                  if f.get("dtype") in CURVE_DTYPES and k != "timestamp"), key=_curve_order)
        marker = json.loads(self.files.read(MARKER)) if self.files.get(MARKER) else {}
        version = f"v{int(marker['version']):06d}" if "version" in marker else None
        if version is None and re.fullmatch(r"v[0-9]+", version_dir.name):
            version = version_dir.name
        episode_files = sorted(p for p in self.files_under(("meta", "episodes")) if p[-1].endswith(".parquet"))
        if not episode_files:
            raise ViewerError(f"{path}: no meta/episodes/*.parquet")
        rows: list[dict[str, Any]] = []
        for parts in episode_files:
            table = pq.ParquetFile(self.files.reader(parts))
            columns = [c for c in table.schema_arrow.names if not c.startswith("stats/")]
            rows += table.read(columns=columns).to_pylist()
        self._episodes = {int(r["episode_index"]): r for r in rows}
        self._records: dict[int, dict[str, Any]] = {}
        if self.files.get(SIDECAR) is not None:
            for line in self.files.read(SIDECAR).decode().splitlines():
                if line.strip():
                    record = json.loads(line)
                    self._records[int(record["dataset_episode_index"])] = record
        task = (marker.get("schema") or {}).get("task")
        notes = () if self._records else ("no demoforge sidecar: episodes have no segments",)
        self.summary = SourceSummary("dataset", path.name, str(path), version, self.fps,
                                     tuple(k.removeprefix(CAMERA_PREFIX) for k in self.video_keys), task, notes)
        self._entries = [self._entry(i) for i in sorted(self._episodes)]
        self._by_key = {e.key: e for e in self._entries}
        self.rejections = RejectionMarks(path, version, {
            str(i): (self._records.get(i, {}).get("store_id"), self._records.get(i, {}).get("staging_episode_id"))
            for i in self._episodes})

    def files_under(self, prefix: tuple[str, ...]) -> list[tuple[str, ...]]:
        return [p for p in self.files.paths() if p[:len(prefix)] == prefix]

    def _entry(self, index: int) -> EpisodeEntry:
        row, record = self._episodes[index], self._records.get(index, {})
        if not record:  # a LeRobot dataset demoforge did not write: no outcome recorded
            outcome = "unknown"
        else:
            outcome = "success" if record.get("success") else str(record.get("terminal_reason") or "failure")
        return EpisodeEntry(key=str(index), dataset_index=index, episode_index=record.get("episode_index"),
                            attempt=record.get("attempt"), seed=record.get("seed"), length=int(row["length"]),
                            outcome=outcome, state="exported",
                            segments=tuple(str(s["name"]) for s in record.get("segments", [])), playable=True,
                            reason=_kept_failure_note(record))

    def entries(self) -> list[EpisodeEntry]:
        return list(self._entries)

    def episode(self, key: str) -> EpisodeView:
        if not EPISODE_KEY.fullmatch(key) or not key.isdigit() or int(key) not in self._episodes:
            raise KeyError(key)
        index = int(key)
        row = self._episodes[index]
        videos = []
        for vkey in self.video_keys:
            chunk, file = row.get(f"videos/{vkey}/chunk_index"), row.get(f"videos/{vkey}/file_index")
            if chunk is None or file is None:
                continue
            rel = self._video_path.format(video_key=vkey, chunk_index=int(chunk), file_index=int(file))
            if self.files.get(tuple(rel.split("/"))) is None:
                continue  # only files pinned at open are ever served
            camera = vkey.removeprefix(CAMERA_PREFIX)
            if vkey in self._depth:
                preview = self._depth_preview(index, vkey)
                videos.append(VideoRef(camera, f"media/{key}/{camera}.mp4", 0.0, preview.frames / self.fps,
                                       "depth", preview.near_m, preview.far_m))
                continue
            videos.append(VideoRef(camera, "files/" + rel, float(row[f"videos/{vkey}/from_timestamp"]),
                                   float(row[f"videos/{vkey}/to_timestamp"])))
        return EpisodeView(self._by_key[key], self._records.get(index, {}), self._curves(index, row), tuple(videos))

    def _curves(self, index: int, row: Mapping[str, Any]) -> tuple[Curve, ...]:
        import pyarrow.compute as pc
        import pyarrow.parquet as pq
        import pyarrow.types as pt

        rel = self._data_path.format(chunk_index=int(row["data/chunk_index"]), file_index=int(row["data/file_index"]))
        parts = tuple(rel.split("/"))
        if self.files.get(parts) is None or not self.curve_keys:
            return ()
        parquet = pq.ParquetFile(self.files.reader(parts))
        names = parquet.schema_arrow.names
        groups = _row_groups_holding(parquet, names.index("episode_index"), index)
        table = parquet.read_row_groups(groups, columns=[*self.curve_keys, "episode_index", "frame_index"])
        table = table.filter(pc.equal(table["episode_index"], index)).sort_by("frame_index")
        curves = []
        for key in self.curve_keys:
            column = table[key].combine_chunks()
            if pt.is_fixed_size_list(column.type) or pt.is_list(column.type):
                values = column.flatten().to_numpy(zero_copy_only=False).reshape(len(column), -1)
            else:
                values = column.to_numpy(zero_copy_only=False).reshape(len(column), -1)
            curves.append(Curve(key, _finite_rows(values)))
        return tuple(curves)

    def _depth_preview(self, index: int, vkey: str) -> DepthPreview:
        """Decodes only this episode's span of the camera's shared file (LeRobot concatenates episodes)."""
        from demoforge.storage.video import decode_span

        row, identity = self._episodes[index], self._depth[vkey]
        rel = self._video_path.format(video_key=vkey, chunk_index=int(row[f"videos/{vkey}/chunk_index"]),
                                      file_index=int(row[f"videos/{vkey}/file_index"]))
        start, end = float(row[f"videos/{vkey}/from_timestamp"]), float(row[f"videos/{vkey}/to_timestamp"])
        camera = vkey.removeprefix(CAMERA_PREFIX)

        def codes() -> list[np.ndarray]:
            return decode_span(self.files.reader(tuple(rel.split("/"))), start, end, self.fps, identity.pix_fmt)

        return self._media.get_or_make((str(index), f"{camera}.mp4"), lambda: _depth_preview(
            codes, identity, self.fps, int(row["length"]), f"episode {index}, camera {camera}",
            f"demoforge verify {self.summary.location}"))

    def media(self, parts: tuple[str, ...]) -> bytes | None:
        if len(parts) != 2 or parts not in self.media_of(parts[0]):
            return None
        vkey = CAMERA_PREFIX + parts[1].removesuffix(".mp4")
        return self._depth_preview(int(parts[0]), vkey).mp4

    def media_of(self, key: str) -> list[tuple[str, ...]]:
        if not key.isdigit() or int(key) not in self._episodes or str(int(key)) != key:
            return []
        row = self._episodes[int(key)]
        return [(key, f"{vkey.removeprefix(CAMERA_PREFIX)}.mp4") for vkey in self._depth
                if row.get(f"videos/{vkey}/chunk_index") is not None]

    def close(self) -> None:
        self.files.close()


def _row_groups_holding(parquet: Any, column: int, value: int) -> list[int]:
    """Row groups whose min/max statistics of ``column`` admit ``value`` (all of them without statistics)."""
    groups = []
    for i in range(parquet.metadata.num_row_groups):
        stats = parquet.metadata.row_group(i).column(column).statistics
        if stats is None or not stats.has_min_max or stats.min <= value <= stats.max:
            groups.append(i)
    return groups


# ------------------------------------------------------------------------------------------------ store
class ViewedStore:
    """A job store: every attempt in the catalog (committed, exported, discarded, quarantined, in progress)."""

    files: PinnedTree | None = None  # a store serves no files, only remuxed streams and depth previews
    rejections: RejectionMarks | None = None  # episodes are rejected in datasets (``demoforge edit`` applies it)
    CACHE = 16  # remuxed camera streams and depth previews kept in memory

    def __init__(self, path: Path) -> None:
        from demoforge.storage.errors import StoreError
        from demoforge.storage.store import open_store

        try:
            with open_store(path) as store:  # read-only: a viewer never writes a store
                rows = store.attempts()
                fingerprint, self._staging = store.require_job()
        except StoreError as exc:
            raise ViewerError(str(exc)) from None
        self.fps = int(fingerprint.fps)
        self.cameras = tuple(c.name for c in fingerprint.cameras)
        self._depth_cameras = {c.name for c in fingerprint.cameras if c.is_depth}
        self._depth_identity = fingerprint.depth_video
        self._rows = {r.episode_id: r for r in rows if EPISODE_KEY.fullmatch(r.episode_id)}
        self._entries = [self._entry(r) for r in self._rows.values()]
        self.summary = SourceSummary("store", path.name, str(path), None, self.fps, self.cameras,
                                     fingerprint.task, ("a snapshot of the catalog when the viewer started",))
        self._media = _MediaCache(self.CACHE)

    @staticmethod
    def _entry(row: Any) -> EpisodeEntry:
        record = row.record or {}
        outcome = {"quarantined": "quarantined", "staging": "in progress"}.get(row.state) or \
            ("success" if record.get("success") else str(row.terminal_reason or "discarded"))
        return EpisodeEntry(key=row.episode_id, dataset_index=row.dataset_index, episode_index=row.episode_index,
                            attempt=row.attempt, seed=row.seed, length=int(row.frames or record.get("length") or 0),
                            outcome=outcome, state=row.state,
                            segments=tuple(str(s["name"]) for s in record.get("segments", [])),
                            playable=row.state in ("committed", "exported") and bool(row.frames),
                            reason=row.reason or _kept_failure_note(record))

    def entries(self) -> list[EpisodeEntry]:
        return list(self._entries)

    def _read(self, episode_id: str) -> StagedEpisode:
        from demoforge.storage.staging import StagingCorruptError

        row = self._rows[episode_id]
        try:
            return self._staging.read_episode(episode_id, int(row.frames or 0), row.video_bytes)
        except StagingCorruptError as exc:
            raise ViewerError(f"{exc}; `demoforge verify --store {self.summary.location}` checks and quarantines "
                              "corrupt episodes") from None

    def episode(self, key: str) -> EpisodeView:
        row = self._rows[key]  # KeyError for anything not in the snapshot
        entry = self._entry(row)
        record = dict(row.record or {})
        if not entry.playable:
            return EpisodeView(entry, record)
        staged = self._read(key)
        curves = [Curve("action", _finite_rows(staged.action))]
        curves += [Curve(name, _finite_rows(values)) for name, values in staged.state.items()]
        curves.append(Curve("next.reward", _finite_rows(staged.reward)))
        duration = entry.length / self.fps
        videos = []
        for camera in self.cameras:
            if camera in self._depth_cameras:
                preview = self._depth_preview(key, camera, staged)
                videos.append(VideoRef(camera, f"media/{key}/{camera}.mp4", 0.0, duration, "depth",
                                       preview.near_m, preview.far_m))
            else:
                videos.append(VideoRef(camera, f"media/{key}/{camera}.mp4", 0.0, duration))
        return EpisodeView(entry, record, tuple(sorted(curves, key=lambda c: _curve_order(c.name))), tuple(videos))

    def _depth_preview(self, key: str, camera: str, staged: StagedEpisode | None = None) -> DepthPreview:
        from demoforge.storage.depth import iter_codes

        identity = self._depth_identity
        if identity is None:
            raise ViewerError(f"the store's job fingerprint has depth camera {camera!r} but no depth settings")

        def codes() -> list[np.ndarray]:
            return list(iter_codes((staged or self._read(key)).video[camera], identity.pix_fmt))

        return self._media.get_or_make((key, f"{camera}.mp4"), lambda: _depth_preview(
            codes, identity, self.fps, self._entry(self._rows[key]).length, f"attempt {key}, camera {camera}",
            f"demoforge verify --store {self.summary.location}"))

    def media_of(self, key: str) -> list[tuple[str, ...]]:
        entry = self._entry(self._rows[key])
        return [(key, f"{camera}.mp4") for camera in self.cameras] if entry.playable else []

    def media(self, parts: tuple[str, ...]) -> bytes | None:
        from demoforge.pipeline.viewer.remux import remux_to_mp4

        if len(parts) != 2 or parts[0] not in self._rows or parts not in self.media_of(parts[0]):
            return None
        camera = parts[1].removesuffix(".mp4")
        if camera in self._depth_cameras:
            return self._depth_preview(parts[0], camera).mp4
        return self._media.get_or_make(parts, lambda: remux_to_mp4(self._read(parts[0]).video[camera]))

    def close(self) -> None:
        pass


def page_index(source: ViewerSource) -> dict[str, Any]:
    """The page's first payload: what was opened and the episode list."""
    summary = {k: v for k, v in asdict(source.summary).items() if k != "location"}  # no local paths in pages
    return {"source": summary, "episodes": [asdict(e) for e in source.entries()]}


def each_episode(source: ViewerSource, progress: Callable[[int, int], None] | None = None,
                 keys: Sequence[str] | None = None):
    keys = list(keys) if keys is not None else [e.key for e in source.entries()]
    for i, key in enumerate(keys):
        yield key, source.episode(key)
        if progress is not None:
            progress(i + 1, len(keys))


def _kept_failure_note(record: Mapping[str, Any]) -> str | None:
    """What the episode list says of a failed attempt kept as data (generate --keep-failures)."""
    if not record.get("kept_failure"):
        return None
    segment = (record.get("failed_segment") or {}).get("name")
    return "kept failure: " + str(record.get("failure_reason") or record.get("terminal_reason")) + \
        (f" (failed in segment {segment!r})" if segment else "")
