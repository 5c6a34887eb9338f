"""The dataset format demoforge exports: LeRobot v3.0 plus two files of its own, in one place.

Names and paths (LeRobot's layout constants and chunk numbering, repeated here as plain strings and one
function because importing ``lerobot.datasets`` costs about 8 CPU-s of torch and ``datasets`` imports in every
export process; a test checks each against lerobot's own), the features of an export, the
per-episode sidecar (``meta/demoforge_episodes.jsonl``: each episode's segment record) and the marker
(``meta/demoforge.json``: the version, the job schema, and every exported staging episode with its dataset
index; the truth that export reconciles the catalog with).

Importing this module does not import lerobot or torch.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from demoforge.storage.schema import ANNOTATION_KEYS
from demoforge.storage.schema import CameraSpec, DepthVideoIdentity, Fingerprint

MARKER = "meta/demoforge.json"
SIDECAR = "meta/demoforge_episodes.jsonl"
INFO = "meta/info.json"  # lerobot.datasets.utils.INFO_PATH
STATS = "meta/stats.json"  # lerobot.datasets.utils.STATS_PATH
TASKS = "meta/tasks.parquet"  # lerobot.datasets.utils.DEFAULT_TASKS_PATH
_CHUNK_FILE = "chunk-{chunk_index:03d}/file-{file_index:03d}"
DATA_PATH = f"data/{_CHUNK_FILE}.parquet"  # lerobot.datasets.utils.DEFAULT_DATA_PATH
VIDEO_PATH = "videos/{video_key}/" + _CHUNK_FILE + ".mp4"  # lerobot.datasets.utils.DEFAULT_VIDEO_PATH
EPISODES_PATH = f"meta/episodes/{_CHUNK_FILE}.parquet"  # lerobot.datasets.utils.DEFAULT_EPISODES_PATH
#: ``info.json`` features of LeRobot's two language columns (``lerobot.datasets.language.language_feature_info``).
LANGUAGE_FEATURES: Mapping[str, Mapping[str, Any]] = {
    "language_persistent": {"dtype": "language", "shape": [1], "names": None},
    "language_events": {"dtype": "language", "shape": [1], "names": None},
}
#: The small metadata files every export version rewrites whole, in the order it writes them (marker last).
SMALL_METADATA = (TASKS, STATS, INFO, SIDECAR, MARKER)
#: Folders whose files, once published, are never rewritten (new episodes go to new files).
APPEND_ONLY_FOLDERS = ("data/", "videos/", "meta/episodes/")
EXPORT_FORMAT = 1
WRITER = "demoforge"
CODEBASE_VERSION = "v3.0"
CHUNKS_SIZE = 1000
DATA_FILE_MB = 100
VIDEO_FILE_MB = 200
#: LeRobot's automatic columns, after the features of a task (their statistics are computed at export).
AUTOMATIC_COLUMNS = ("timestamp", "frame_index", "episode_index", "index", "task_index")


def next_file(chunk: int, file: int) -> tuple[int, int]:
    """The (chunk, file) after this one: ``CHUNKS_SIZE`` files per chunk (LeRobot's
    ``update_chunk_file_indices``)."""
    return (chunk + 1, 0) if file == CHUNKS_SIZE - 1 else (chunk, file + 1)


class MarkerError(ValueError):
    """A ``meta/demoforge.json`` that this version of demoforge did not write (missing or bad field)."""


def camera_key(camera: str) -> str:
    """A camera's LeRobot feature key: ``observation.images.<camera>``, except that a camera named
    ``observation.<name>`` is exported under exactly that key (``observation.image``: the single image
    LeRobot's Meta-World, PushT and similar envs give a policy)."""
    return camera if camera.startswith("observation.") else f"observation.images.{camera}"


def annotation_key(name: str) -> str:
    return f"annotation.{name}"


def video_info(fingerprint: Fingerprint, height: int, width: int) -> dict[str, Any]:
    """A camera feature's ``info`` block, as LeRobot's writer fills it."""
    video = fingerprint.video
    return {"video.height": height, "video.width": width,
            "video.codec": {"libsvtav1": "av1", "libaom-av1": "av1"}.get(video.codec, video.codec),
            "video.pix_fmt": video.pix_fmt, "video.fps": fingerprint.fps, "video.channels": 3,
            "has_audio": False, "video.g": video.g, "video.crf": video.crf, "video.preset": video.preset,
            "video.fast_decode": 0, "video.video_backend": "pyav", "video.extra_options": {},
            "is_depth_map": False}


def depth_video_info(fingerprint: Fingerprint, camera: CameraSpec) -> dict[str, Any]:
    """A depth camera feature's ``info`` block, as LeRobot 0.6.1's writer fills it for ``DepthEncoderConfig``
    (``is_depth_map``, ``depth_unit`` and the quantizer's ``video.depth_*`` fields its reader dequantizes with)."""
    depth = fingerprint.depth_video
    if depth is None:
        raise ValueError(f"camera {camera.name!r} is a depth camera but the fingerprint has no depth settings")
    return {"is_depth_map": True, "depth_unit": "m", "video.height": camera.height, "video.width": camera.width,
            "video.codec": depth.codec, "video.pix_fmt": depth.pix_fmt, "video.fps": fingerprint.fps,
            "video.channels": 1, "has_audio": False, "video.g": depth.g, "video.crf": depth.crf,
            "video.preset": depth.preset, "video.fast_decode": 0, "video.video_backend": "pyav",
            "video.extra_options": dict(depth.extra_options), "video.depth_min": depth.depth_min,
            "video.depth_max": depth.depth_max, "video.shift": depth.shift, "video.use_log": depth.use_log}


def depth_identity_of_info(info: Mapping[str, Any]) -> DepthVideoIdentity | None:
    """The inverse of :func:`depth_video_info`: a LeRobot depth feature's quantization (``info.json``:
    ``features[key]["info"]``), or None when the feature is not a depth map or lacks a quantizer field."""
    if not info.get("is_depth_map"):
        return None
    try:
        return DepthVideoIdentity(
            codec=str(info.get("video.codec", "hevc")), pix_fmt=str(info.get("video.pix_fmt", "gray12le")),
            g=info.get("video.g"), crf=info.get("video.crf"), preset=info.get("video.preset"),
            extra_options=dict(info.get("video.extra_options") or {}),
            depth_min=float(info["video.depth_min"]), depth_max=float(info["video.depth_max"]),
            shift=float(info["video.shift"]), use_log=bool(info["video.use_log"]))
    except (KeyError, TypeError, ValueError):
        return None


#: Per-frame outcome flags, named and typed as ``lerobot-eval`` records them: ``next.done`` at the frame that ends
#: the episode, ``next.success`` there when the episode succeeded ("the only time this can be True").
OUTCOME_COLUMNS = ("next.success", "next.done")


def dataset_features(fingerprint: Fingerprint, *, outcomes: bool = True) -> dict[str, dict]:
    """LeRobot features of an export: states, action, reward, outcome flags (unless ``outcomes`` is False: a
    dataset exported before them), annotations, cameras, language, then the automatic columns (timestamp,
    frame_index, episode_index, index, task_index)."""
    features: dict[str, dict] = {}
    names = {k: list(v) for k, v in fingerprint.feature_names.items()}
    for name, shape in fingerprint.state_shapes.items():
        features[name] = {"dtype": "float32", "shape": list(shape), "names": names.get(name)}
    features["action"] = {"dtype": "float32", "shape": list(fingerprint.action_shape), "names": names.get("action")}
    features["next.reward"] = {"dtype": "float32", "shape": [1], "names": None}
    if outcomes:
        for key in OUTCOME_COLUMNS:
            features[key] = {"dtype": "bool", "shape": [1], "names": None}
    for key in ANNOTATION_KEYS:
        features[annotation_key(key)] = {"dtype": "int64", "shape": [1], "names": None}
    for camera in fingerprint.cameras:
        info = (depth_video_info(fingerprint, camera) if camera.is_depth
                else video_info(fingerprint, camera.height, camera.width))
        features[camera_key(camera.name)] = {"dtype": "video", "shape": list(camera.feature_shape),
                                             "names": ["height", "width", "channels"], "info": info}
    for key, ft in LANGUAGE_FEATURES.items():
        features[key] = {**ft, "shape": list(ft["shape"])}
    for key in AUTOMATIC_COLUMNS:
        features[key] = {"dtype": "float32" if key == "timestamp" else "int64", "shape": [1], "names": None}
    return features


def schema_identity(fingerprint: Fingerprint) -> dict[str, Any]:
    """What must match between every store a dataset holds episodes of, and the dataset: the features and
    how they are encoded. The task is not part of it: one dataset can hold several jobs (each job's
    instruction is a task of its own in ``tasks.parquet``)."""
    raw = fingerprint.to_dict()
    return {k: raw[k] for k in ("schema_version", "fps", "cameras", "state_shapes", "action_shape", "video",
                                "depth_video") if k in raw}  # depth_video: only when a camera is a depth camera


def schema_differences(a: Mapping[str, Any], b: Mapping[str, Any], a_name: str, b_name: str) -> list[str]:
    """How two schema identities differ, by feature name: ``observation.images.front: 64x64 in A, 96x96 in B``.
    Empty when they match (a ``task`` key, which markers written before multi-job datasets carry, is ignored)."""
    out: list[str] = []

    def differ(what: str, x: Any, y: Any) -> None:
        out.append(f"{what}: {x} in {a_name}, {y} in {b_name}")

    def by_name(schema: Mapping[str, Any], key: str) -> dict[str, Any]:
        value = schema.get(key) or {}
        if key == "cameras":  # [name, height, width] or [name, height, width, kind]
            return {c[0]: f"{c[1]}x{c[2]}" + (f" {c[3]}" if len(c) > 3 else "") for c in value}
        return {k: tuple(v) for k, v in dict(value).items()}

    for key, label in (("cameras", camera_key), ("state_shapes", lambda name: name)):
        left, right = by_name(a, key), by_name(b, key)
        for name in sorted(set(left) | set(right)):
            if left.get(name) != right.get(name):
                differ(label(name), left.get(name, "absent"), right.get(name, "absent"))
    if tuple(a.get("action_shape") or ()) != tuple(b.get("action_shape") or ()):
        differ("action shape", tuple(a.get("action_shape") or ()), tuple(b.get("action_shape") or ()))
    for key in ("fps", "schema_version"):
        if a.get(key) != b.get(key):
            differ(key, a.get(key), b.get(key))
    for section in ("video", "depth_video"):
        va, vb = dict(a.get(section) or {}), dict(b.get(section) or {})
        for key in sorted(set(va) | set(vb)):
            if va.get(key) != vb.get(key):
                differ(f"{section.replace('_', ' ')} {key}", va.get(key), vb.get(key))
    return out


#: What must agree between two datasets' video features for their episodes to share one dataset.
VIDEO_IDENTITY = ("video.height", "video.width", "video.codec", "video.pix_fmt", "video.channels", "is_depth_map",
                  "video.depth_min", "video.depth_max", "video.shift", "video.use_log")


def feature_differences(a: Mapping[str, Mapping[str, Any]], b: Mapping[str, Mapping[str, Any]], a_name: str,
                        b_name: str) -> list[str]:
    """How two datasets' ``info.json`` features differ, by feature name: ``action: float32 (7,) in A, float32
    (6,) in B``, ``observation.images.front: absent in A, video (96, 96, 3) in B``, a video's codec or size.
    Empty when every feature has the same dtype, shape and video encoding."""
    def shown(ft: Mapping[str, Any] | None) -> str:
        return "absent" if ft is None else f"{ft.get('dtype')} {tuple(ft.get('shape') or ())}"

    out: list[str] = []
    for name in sorted(set(a) | set(b)):
        fa, fb = a.get(name), b.get(name)
        if fa is None or fb is None or shown(fa) != shown(fb):
            out.append(f"{name}: {shown(fa)} in {a_name}, {shown(fb)} in {b_name}")
            continue
        ia, ib = dict(fa.get("info") or {}), dict(fb.get("info") or {})
        for key in VIDEO_IDENTITY:
            if ia.get(key) != ib.get(key):
                out.append(f"{name} {key.removeprefix('video.')}: {ia.get(key)} in {a_name}, {ib.get(key)} in {b_name}")
    return out


@dataclass(frozen=True)
class PublishedEpisode:
    episode_id: str  # the staging episode
    dataset_index: int
    store_id: str | None = None  # None in markers written before datasets held several stores

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"episode_id": self.episode_id, "dataset_index": self.dataset_index}
        if self.store_id is not None:
            out["store_id"] = self.store_id
        return out


@dataclass(frozen=True)
class RemovedEpisode:
    """A staging episode a dataset held once and ``demoforge edit`` removed (deleted, filtered out, or left in
    another split): an export never adds it again."""

    episode_id: str
    store_id: str | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"episode_id": self.episode_id}
        if self.store_id is not None:
            out["store_id"] = self.store_id
        return out


FileCursor = tuple[int, int]  # (chunk index, file index) of the next file to write


@dataclass(frozen=True)
class FileChecksum:
    """What a published file held when it was published."""

    size: int
    sha256: str


def file_checksum(path: Path) -> FileChecksum:
    import hashlib

    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return FileChecksum(path.stat().st_size, digest.hexdigest())


@dataclass(frozen=True)
class ExportMarker:
    """``meta/demoforge.json`` of one published version."""

    version: int
    repo_id: str
    schema: Mapping[str, Any]
    total_episodes: int
    total_frames: int
    tasks: Mapping[str, int]
    next_data: FileCursor
    next_meta: FileCursor
    next_videos: Mapping[str, FileCursor]
    episodes: tuple[PublishedEpisode, ...]
    # Every published file but this marker: relative path -> (bytes, sha256). Empty for versions written
    # before checksums were recorded; ``demoforge verify DATASET`` checks against it.
    files: Mapping[str, FileChecksum] = field(default_factory=dict)
    # Episodes an edit removed (an export never adds them again), and what the edit that made this version did
    # (``demoforge edit`` reads it back so that a re-run after a crash never applies the same edit twice).
    # Both are left out of the JSON when empty, so an export's marker is what it always was.
    removed: tuple[RemovedEpisode, ...] = ()
    edit: Mapping[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        out = {"format": EXPORT_FORMAT, "writer": WRITER, "version": self.version, "repo_id": self.repo_id,
               "schema": dict(self.schema), "total_episodes": self.total_episodes,
               "total_frames": self.total_frames, "tasks": dict(self.tasks),
               "next_files": {"data": list(self.next_data), "meta": list(self.next_meta),
                              "videos": {c: list(v) for c, v in self.next_videos.items()}},
               "episodes": [e.to_json() for e in self.episodes],
               "files": {path: {"bytes": c.size, "sha256": c.sha256} for path, c in sorted(self.files.items())}}
        if self.removed:
            out["removed"] = [e.to_json() for e in self.removed]
        if self.edit is not None:
            out["edit"] = dict(self.edit)
        return out

    @classmethod
    def from_json(cls, data: object) -> ExportMarker:
        if not isinstance(data, Mapping):
            raise MarkerError("it is not a JSON object")
        for key in ("format", "writer", "version", "repo_id", "schema", "total_episodes", "total_frames", "tasks",
                    "next_files", "episodes"):
            if key not in data:
                raise MarkerError(f"field {key!r} is missing")
        if data["format"] != EXPORT_FORMAT or data["writer"] != WRITER:
            raise MarkerError(f"format {data['format']!r} by {data['writer']!r}; this demoforge writes format "
                              f"{EXPORT_FORMAT}")
        try:
            files = data["next_files"]
            return cls(version=int(data["version"]), repo_id=str(data["repo_id"]), schema=dict(data["schema"]),
                       total_episodes=int(data["total_episodes"]), total_frames=int(data["total_frames"]),
                       tasks={str(k): int(v) for k, v in data["tasks"].items()},
                       next_data=_cursor(files["data"]), next_meta=_cursor(files["meta"]),
                       next_videos={str(c): _cursor(v) for c, v in files["videos"].items()},
                       episodes=tuple(PublishedEpisode(str(e["episode_id"]), int(e["dataset_index"]),
                                                       None if e.get("store_id") is None else str(e["store_id"]))
                                      for e in data["episodes"]),
                       files={str(path): FileChecksum(int(c["bytes"]), str(c["sha256"]))
                              for path, c in data.get("files", {}).items()},
                       removed=tuple(RemovedEpisode(str(e["episode_id"]),
                                                    None if e.get("store_id") is None else str(e["store_id"]))
                                     for e in data.get("removed", ())),
                       edit=None if data.get("edit") is None else dict(data["edit"]))
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise MarkerError(f"a field has the wrong shape ({type(exc).__name__}: {exc})") from None

    @classmethod
    def read(cls, version_dir: Path) -> ExportMarker:
        return cls.from_json(json.loads((version_dir / MARKER).read_text()))

    def dataset_indices(self, store_id: str | None = None) -> dict[str, int]:
        """Staging episode -> dataset index: of every episode, or of those from the store ``store_id``."""
        return {e.episode_id: e.dataset_index for e in self.episodes if store_id is None or e.store_id == store_id}

    def removed_ids(self, store_id: str | None, *, legacy: bool = False) -> set[str]:
        """The staging episodes of store ``store_id`` an edit removed; ``legacy``: also those recorded without a
        store (markers from before store ids, read for an export from a single store)."""
        return {e.episode_id for e in self.removed if e.store_id == store_id or (legacy and e.store_id is None)}


def _cursor(value: Any) -> FileCursor:
    chunk, file = value
    return int(chunk), int(file)


def read_sidecar(root: Path) -> list[dict[str, Any]]:
    """The episode records of a dataset version, in dataset order (FileNotFoundError when absent)."""
    return [json.loads(line) for line in (root / SIDECAR).read_text().splitlines() if line.strip()]
