"""Recorded episodes, read back for ``demoforge replay`` from a store or from an exported LeRobot dataset.

Everything replay reads from disk goes through :func:`open_episode_source`, so it can be pointed at another
read side without touching the replay engine. A store yields its committed episodes (chunk checksums and
the content hash checked on read); a dataset yields its episodes from the data parquet files and the
demoforge sidecar (seeds, attempts, segments, task options), and camera frames from its mp4 files. A depth
camera's frames are read as their stored 12-bit codes (lossless), never as pictures.
Only pyarrow and PyAV are used for datasets: no torch, no lerobot import.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from demoforge.storage.paths import CATALOG_FILE
from demoforge.storage.lerobot.format import INFO as INFO_FILE
from demoforge.storage.lerobot.format import MARKER, SIDECAR, ExportMarker, camera_key, read_sidecar
from demoforge.storage.schema import ANNOTATION_KEYS
from demoforge.storage.schema import DEPTH, DepthVideoIdentity, FingerprintError
from demoforge.storage.video import decode_frames, decode_span

EPISODES_GLOB = "meta/episodes/chunk-*/file-*.parquet"


class EpisodeSourceError(Exception):
    """The input cannot be read as a store or a demoforge dataset (the whole replay cannot run)."""


class EpisodeReadError(Exception):
    """One episode cannot be read (corrupt chunk, missing file, missing metadata)."""


@dataclass(frozen=True)
class JobSchema:
    """What every episode of the input records: shapes, cameras and video settings."""

    task: str
    fps: int
    state_shapes: Mapping[str, tuple[int, ...]]
    action_shape: tuple[int, ...]
    cameras: tuple[tuple[str, int, int], ...]
    video: Mapping[str, Any]
    task_options: Mapping[str, Any] | None = None  # a store's (one job); a dataset records them per episode
    depth_cameras: tuple[str, ...] = ()  # cameras of kind "depth" (stored as lossless 12-bit codes)
    depth_video: DepthVideoIdentity | None = None  # how their codes were quantized; set when there are any


@dataclass(frozen=True)
class EpisodeRef:
    """One selectable episode. ``number`` is what ``--episodes`` selects: the job's episode index in a store,
    the dataset's episode index in a dataset."""

    number: int
    label: str
    task: str
    seed: int
    attempt: int
    frames: int


@dataclass(frozen=True, eq=False)
class RecordedEpisode:
    """One episode as recorded: the observation before each action, the action, its reward and labels."""

    ref: EpisodeRef
    task_options: Mapping[str, Any] | None  # None when the input does not record them
    record: Mapping[str, Any]  # the episode's result record (segments, success, versions)
    state: Mapping[str, np.ndarray]
    action: np.ndarray
    reward: np.ndarray
    annotations: np.ndarray  # (N, len(ANNOTATION_KEYS)) in schema.ANNOTATION_KEYS order
    videos: Mapping[str, bytes] = field(default_factory=dict)  # store: each camera's staged stream

    @property
    def versions(self) -> Mapping[str, str] | None:
        return self.record.get("versions")


class EpisodeSource:
    """The read side replay uses; :func:`open_episode_source` picks the implementation."""

    kind: str
    path: Path
    schema: JobSchema

    def episodes(self) -> list[EpisodeRef]:
        raise NotImplementedError

    def load(self, ref: EpisodeRef) -> RecordedEpisode:
        raise NotImplementedError

    def header(self, ref: EpisodeRef) -> tuple[Mapping[str, Any], Mapping[str, Any] | None]:
        """The episode's result record and the task options it was generated with, without reading frames."""
        raise NotImplementedError

    def camera_frames(self, episode: RecordedEpisode, camera: str) -> list[np.ndarray]:
        """The stored video of one camera of one episode, decoded to (H, W, 3) uint8 frames."""
        raise NotImplementedError

    def depth_codes(self, episode: RecordedEpisode, camera: str) -> list[np.ndarray]:
        """The stored video of one depth camera of one episode as its 12-bit codes, (H, W) uint16 frames."""
        raise NotImplementedError

    def _depth_pix_fmt(self) -> str:
        return self.schema.depth_video.pix_fmt if self.schema.depth_video is not None else "gray12le"

    def close(self) -> None:
        pass


def open_episode_source(path: Path | str) -> EpisodeSource:
    path = Path(path)
    if (path / CATALOG_FILE).is_file():
        return ReplayStoreSource(path)
    if (path / INFO_FILE).is_file():
        return ReplayDatasetSource(path)
    if not path.exists():
        raise EpisodeSourceError(f"{path} does not exist")
    raise EpisodeSourceError(f"{path} is neither a demoforge store ({CATALOG_FILE}) nor a LeRobot dataset "
                             f"({INFO_FILE})")


# ----------------------------------------------------------------------------------------------- store
class ReplayStoreSource(EpisodeSource):
    """Committed (and exported) episodes of a store, read through the store's read side."""

    kind = "store"

    def __init__(self, path: Path) -> None:
        from demoforge.storage.errors import StoreError
        from demoforge.storage.store import open_store

        self.path = path
        try:
            self._store = open_store(path)
            fingerprint, self._staging = self._store.require_job()
            # Pruned episodes (staged data deleted after export) are replayed from the dataset, not the store.
            pruned = self._store.pruned_ids()
            # The job's episodes, by index; failures kept as data are read from an export (--include failures).
            self._rows = {r.episode_index: r for r in self._store.committed()
                          if r.episode_id not in pruned and not r.kept_failure}
        except StoreError as exc:
            raise EpisodeSourceError(str(exc)) from None
        self.schema = JobSchema(task=fingerprint.task, fps=fingerprint.fps, state_shapes=dict(fingerprint.state_shapes),
                                action_shape=fingerprint.action_shape,
                                cameras=tuple((c.name, c.height, c.width) for c in fingerprint.cameras),
                                video=fingerprint.video.to_json(), task_options=dict(fingerprint.task_options),
                                depth_cameras=tuple(c.name for c in fingerprint.cameras if c.is_depth),
                                depth_video=fingerprint.depth_video)

    def episodes(self) -> list[EpisodeRef]:
        # A suite's episode records its member task: replay builds that task, not the suite.
        return [EpisodeRef(number=r.episode_index, label=f"episode {r.episode_index} ({r.episode_id})",
                           task=str((r.record or {}).get("task") or self.schema.task), seed=int(r.seed),
                           attempt=int(r.attempt), frames=int(r.frames or 0))
                for r in sorted(self._rows.values(), key=lambda r: r.episode_index)]

    def load(self, ref: EpisodeRef) -> RecordedEpisode:
        from demoforge.storage.staging import StagingCorruptError
        from demoforge.storage.store_verify import check_episode

        row = self._rows[ref.number]
        try:
            staged = check_episode(self._staging, row, decode=False)
        except StagingCorruptError as exc:
            raise EpisodeReadError(f"{exc} (see `demoforge verify --store {self.path}`)") from None
        return RecordedEpisode(ref=ref, task_options=self.schema.task_options, record=dict(row.record or {}),
                               state=staged.state, action=staged.action, reward=staged.reward,
                               annotations=staged.annotations, videos=staged.video)

    def header(self, ref: EpisodeRef) -> tuple[Mapping[str, Any], Mapping[str, Any] | None]:
        return dict(self._rows[ref.number].record or {}), self.schema.task_options

    def camera_frames(self, episode: RecordedEpisode, camera: str) -> list[np.ndarray]:
        return list(decode_frames(episode.videos[camera]))

    def depth_codes(self, episode: RecordedEpisode, camera: str) -> list[np.ndarray]:
        from demoforge.storage.depth import iter_codes

        return list(iter_codes(episode.videos[camera], self._depth_pix_fmt()))

    def close(self) -> None:
        self._store.close()


# --------------------------------------------------------------------------------------------- dataset
class ReplayDatasetSource(EpisodeSource):
    """Episodes of a LeRobot v3.0 dataset written by ``demoforge export``."""

    kind = "dataset"

    def __init__(self, path: Path) -> None:
        self.path = path
        self.root = path.resolve()
        if not (self.root / MARKER).is_file() or not (self.root / SIDECAR).is_file():
            raise EpisodeSourceError(f"{path} is a LeRobot dataset but not a demoforge export (no {MARKER} or "
                                     f"{SIDECAR}): its seeds and attempts are unknown, so it cannot be replayed")
        try:
            self._info = json.loads((self.root / INFO_FILE).read_text())
            schema = ExportMarker.read(self.root).schema
            sidecar = read_sidecar(self.root)
        except (OSError, ValueError) as exc:  # MarkerError is a ValueError
            raise EpisodeSourceError(f"cannot read the metadata of {path}: {exc}") from None
        try:
            # Markers name no task since a dataset may hold several jobs; each sidecar row names its own.
            task = schema.get("task") or (str(sidecar[0]["task"]) if sidecar else "")
            depth_cameras = tuple(str(c[0]) for c in schema["cameras"] if len(c) > 3 and c[3] == DEPTH)
            try:
                depth_video = DepthVideoIdentity.from_json(schema["depth_video"]) if depth_cameras else None
            except FingerprintError as exc:
                raise EpisodeSourceError(f"{path}: {MARKER} has a bad depth_video field: {exc}") from None
            self.schema = JobSchema(task=task, fps=int(schema["fps"]),
                                    state_shapes={k: tuple(v) for k, v in schema["state_shapes"].items()},
                                    action_shape=tuple(schema["action_shape"]),
                                    cameras=tuple((c[0], int(c[1]), int(c[2])) for c in schema["cameras"]),  # [3]: a kind
                                    video=dict(schema["video"]), depth_cameras=depth_cameras,
                                    depth_video=depth_video)
            self._sidecar = {int(r["dataset_episode_index"]): r for r in sidecar}
        except (KeyError, TypeError, ValueError) as exc:
            raise EpisodeSourceError(f"{path}: {MARKER} or {SIDECAR} lacks {exc}") from None
        self._episodes = self._episode_meta()
        self._table_cache: tuple[Path, Any] | None = None

    def _inside(self, relative: str) -> Path:
        """A path named by the dataset's own metadata, refused if it would lead outside the dataset."""
        candidate = (self.root / relative).resolve()
        if not candidate.is_relative_to(self.root):
            raise EpisodeReadError(f"{relative!r} (from {INFO_FILE}) points outside the dataset")
        return candidate

    def _episode_meta(self) -> dict[int, dict[str, Any]]:
        import pyarrow.parquet as pq

        rows: dict[int, dict[str, Any]] = {}
        for file in sorted(self.root.glob(EPISODES_GLOB)):
            try:
                table = pq.read_table(file)
            except Exception as exc:  # pyarrow raises several types for a damaged file
                raise EpisodeSourceError(f"cannot read {file.relative_to(self.root)}: {exc}") from None
            wanted = [c for c in table.column_names if c in ("episode_index", "length", "data/chunk_index",
                                                              "data/file_index") or c.startswith("videos/")]
            for rec in table.select(wanted).to_pylist():
                rows[int(rec["episode_index"])] = rec
        return rows

    def episodes(self) -> list[EpisodeRef]:
        refs = []
        for number in sorted(self._episodes):
            record = self._sidecar.get(number)
            if record is None:
                raise EpisodeSourceError(f"dataset episode {number} has no row in {SIDECAR}")
            refs.append(EpisodeRef(number=number, label=f"dataset episode {number}",
                                   task=str(record.get("task", self.schema.task)), seed=int(record["seed"]),
                                   attempt=int(record["attempt"]), frames=int(self._episodes[number]["length"])))
        return refs

    def _data_table(self, relative: str) -> Any:
        import pyarrow.parquet as pq

        path = self._inside(relative)
        if self._table_cache is None or self._table_cache[0] != path:
            try:
                self._table_cache = (path, pq.read_table(path))
            except Exception as exc:
                raise EpisodeReadError(f"cannot read {relative}: {exc}") from None
        return self._table_cache[1]

    def load(self, ref: EpisodeRef) -> RecordedEpisode:
        import pyarrow.compute as pc

        meta = self._episodes[ref.number]
        relative = self._info["data_path"].format(chunk_index=int(meta["data/chunk_index"]),
                                                  file_index=int(meta["data/file_index"]))
        table = self._data_table(relative)
        rows = table.filter(pc.equal(table["episode_index"], ref.number))
        rows = rows.take(pc.sort_indices(rows["frame_index"]))
        n = rows.num_rows
        if n != ref.frames:
            raise EpisodeReadError(f"{relative} holds {n} frames of episode {ref.number}; its metadata says "
                                   f"{ref.frames}")
        try:
            state = {name: _column(rows, name, shape) for name, shape in self.schema.state_shapes.items()}
            action = _column(rows, "action", self.schema.action_shape)
            reward = _column(rows, "next.reward", ())
            annotations = np.stack([_column(rows, f"annotation.{k}", ()).astype(np.int64) for k in ANNOTATION_KEYS],
                                   axis=1)
        except KeyError as exc:
            raise EpisodeReadError(f"{relative} has no column {exc}") from None
        record = self._sidecar[ref.number]
        options = record.get("task_options")
        return RecordedEpisode(ref=ref, task_options=dict(options) if isinstance(options, dict) else None,
                               record=record, state=state, action=action, reward=reward, annotations=annotations)

    def header(self, ref: EpisodeRef) -> tuple[Mapping[str, Any], Mapping[str, Any] | None]:
        record = self._sidecar[ref.number]
        options = record.get("task_options")
        return record, dict(options) if isinstance(options, dict) else None

    def camera_frames(self, episode: RecordedEpisode, camera: str) -> list[np.ndarray]:
        return self._camera_span(episode, camera, "rgb24")

    def depth_codes(self, episode: RecordedEpisode, camera: str) -> list[np.ndarray]:
        """The episode's span of the shared depth mp4, decoded to codes as for RGB (the remux keeps them)."""
        return self._camera_span(episode, camera, self._depth_pix_fmt())

    def _camera_span(self, episode: RecordedEpisode, camera: str, pix_fmt: str) -> list[np.ndarray]:
        key = camera_key(camera)
        meta = self._episodes[episode.ref.number]
        try:
            relative = self._info["video_path"].format(video_key=key, chunk_index=int(meta[f"videos/{key}/chunk_index"]),
                                                       file_index=int(meta[f"videos/{key}/file_index"]))
            start, end = float(meta[f"videos/{key}/from_timestamp"]), float(meta[f"videos/{key}/to_timestamp"])
        except KeyError as exc:
            raise EpisodeReadError(f"the episode metadata has no {exc} for camera {camera!r}") from None
        path = self._inside(relative)
        if not path.is_file():
            raise EpisodeReadError(f"{relative} is missing")
        return decode_span(path, start, end, self.schema.fps, pix_fmt)


def _column(table: Any, name: str, shape: Sequence[int]) -> np.ndarray:
    """A column as an (N, *shape) array, whether stored as scalars, lists or fixed-size lists."""
    import pyarrow as pa

    values = table[name].combine_chunks()
    n = len(values)
    while pa.types.is_list(values.type) or pa.types.is_large_list(values.type) or \
            pa.types.is_fixed_size_list(values.type):
        values = values.flatten()
    array = np.asarray(values.to_numpy(zero_copy_only=False))
    return array.reshape((n, *shape)) if shape else array.reshape(n)
