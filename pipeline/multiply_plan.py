"""The planning half of ``demoforge multiply``: poses as rigid transforms, the extracted source (what the source
demonstrations did, frame by frame) and its content-hashed file, and how one generated segment is made from a
source segment. Pure numpy: no simulator, so it is unit-tested alone (docs/multiply.md).

A source segment is moved with its reference object: ``T = (reference pose now) x inverse(reference pose at the
source segment's start)``; every pose the source commanded in the segment is moved by ``T``. A segment without a
reference is moved so that it starts where the end effector is (``T = eef now x inverse(source eef at its
start)``): relative to where the previous segment ended.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from demoforge.stages.task_protocol import Pose

#: Bumped when the file's layout changes (a file of another version is refused, never misread).
SOURCE_FORMAT = 1
STRATEGIES = ("random", "nearest")
POSE_WIDTH = 7  # position (3) + quaternion (w, x, y, z)
_ARRAYS = ("eef", "commanded", "gripper", "objects")


class SourceFileError(ValueError):
    """The extracted source file is missing, unreadable, of another format or not the one the job names."""


# ------------------------------------------------------------------------------------------ rigid transforms
def quaternion_matrix(q: np.ndarray) -> np.ndarray:
    """The rotation matrix of a unit quaternion (w, x, y, z)."""
    w, x, y, z = (float(v) for v in q)
    return np.array([[1 - 2 * (y * y + z * z), 2 * (x * y - w * z), 2 * (x * z + w * y)],
                     [2 * (x * y + w * z), 1 - 2 * (x * x + z * z), 2 * (y * z - w * x)],
                     [2 * (x * z - w * y), 2 * (y * z + w * x), 1 - 2 * (x * x + y * y)]])


def matrix_quaternion(r: np.ndarray) -> np.ndarray:
    """The unit quaternion (w, x, y, z, with w >= 0) of a rotation matrix (Shepperd's method: stable for any
    rotation)."""
    trace = float(np.trace(r))
    if trace > 0:
        s = 2.0 * np.sqrt(trace + 1.0)
        q = np.array([0.25 * s, (r[2, 1] - r[1, 2]) / s, (r[0, 2] - r[2, 0]) / s, (r[1, 0] - r[0, 1]) / s])
    else:
        i = int(np.argmax(np.diag(r)))
        j, k = (i + 1) % 3, (i + 2) % 3
        s = 2.0 * np.sqrt(max(1.0 + r[i, i] - r[j, j] - r[k, k], 1e-300))
        q = np.empty(4)
        q[0] = (r[k, j] - r[j, k]) / s
        q[1 + i] = 0.25 * s
        q[1 + j] = (r[j, i] + r[i, j]) / s
        q[1 + k] = (r[k, i] + r[i, k]) / s
    q /= np.linalg.norm(q)
    return -q if q[0] < 0 else q


def pose_matrix(pose: Pose) -> np.ndarray:
    """The pose as a 4x4 homogeneous transform (world from body)."""
    m = np.eye(4)
    m[:3, :3] = quaternion_matrix(pose.quaternion)
    m[:3, 3] = pose.position
    return m


def matrix_pose(m: np.ndarray) -> Pose:
    return Pose(m[:3, 3].copy(), matrix_quaternion(m[:3, :3]))


def relative_transform(now: Pose, then: Pose) -> np.ndarray:
    """``now x inverse(then)``: the rigid motion that takes ``then`` to ``now`` (and whatever moved with it)."""
    then_m = pose_matrix(then)
    inverse = np.eye(4)
    inverse[:3, :3] = then_m[:3, :3].T
    inverse[:3, 3] = -then_m[:3, :3].T @ then_m[:3, 3]
    return pose_matrix(now) @ inverse


def apply_transform(transform: np.ndarray, pose: Pose) -> Pose:
    return matrix_pose(transform @ pose_matrix(pose))


def interpolate(start: Pose, end: Pose, fraction: float) -> Pose:
    """Linear in position, spherical-linear in orientation; ``fraction`` 0 is ``start``, 1 is ``end``."""
    q0, q1 = start.quaternion, end.quaternion
    dot = float(np.dot(q0, q1))
    if dot < 0:  # the shorter way round
        q1, dot = -q1, -dot
    if dot > 0.9995:
        q = q0 + fraction * (q1 - q0)
    else:
        angle = np.arccos(min(dot, 1.0))
        q = (np.sin((1 - fraction) * angle) * q0 + np.sin(fraction * angle) * q1) / np.sin(angle)
    return Pose(start.position + fraction * (end.position - start.position), q)


def pose_row(pose: Pose) -> np.ndarray:
    return np.concatenate([pose.position, pose.quaternion])


def row_pose(row: np.ndarray) -> Pose:
    return Pose(row[:3], row[3:POSE_WIDTH])


def json_transform(transform: np.ndarray) -> list[list[float]]:
    """A 4x4 transform as JSON-safe nested lists (for the episode's provenance)."""
    return [[round(float(v), 9) for v in row] for row in transform]


# ------------------------------------------------------------------------------------------------ the source
@dataclass(frozen=True)
class ExtractedSegment:
    """One segment of a source episode: frames ``[start, end)``, and the object its poses move with."""

    index: int
    name: str
    target: str | None
    instruction: str | None
    start: int
    end: int
    reference: str | None  # the task's ``reference(name, target)``; None: relative to the previous segment's end

    def to_json(self) -> dict[str, Any]:
        return {"index": self.index, "name": self.name, "target": self.target, "instruction": self.instruction,
                "start": self.start, "end": self.end, "reference": self.reference}

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> ExtractedSegment:
        return cls(index=int(raw["index"]), name=str(raw["name"]), target=raw.get("target"),
                   instruction=raw.get("instruction"), start=int(raw["start"]), end=int(raw["end"]),
                   reference=raw.get("reference"))


@dataclass(frozen=True, eq=False)
class ExtractedEpisode:
    """What one source episode did, from replaying it: per frame ``t`` (``0..n``, the last after the last
    action) the end-effector pose and every object's pose; per action the pose it commanded and its gripper."""

    number: int  # the episode's number in the source (its job index in a store, dataset index in a dataset)
    label: str
    seed: int
    segments: tuple[ExtractedSegment, ...]
    eef: np.ndarray  # (n + 1, 7)
    commanded: np.ndarray  # (n, 7)
    gripper: np.ndarray  # (n,)
    objects: np.ndarray  # (n + 1, len(object_names), 7)

    def object_pose(self, index: int, frame: int) -> Pose:
        return row_pose(self.objects[frame, index])

    def eef_pose(self, frame: int) -> Pose:
        return row_pose(self.eef[frame])


@dataclass(frozen=True, eq=False)
class ExtractedSource:
    """The extracted source of a multiply job: episodes with one segment sequence, and where they came from."""

    task: str  # the task the episodes are of (and are multiplied in)
    source: str  # the store or dataset read (for the record)
    object_names: tuple[str, ...]
    episodes: tuple[ExtractedEpisode, ...]

    @property
    def sequence(self) -> tuple[str, ...]:
        return tuple(s.name for s in self.episodes[0].segments)

    def object_index(self, name: str) -> int:
        return self.object_names.index(name)

    # -- the file: npz of plain arrays and one JSON string (np.load with allow_pickle=False reads it)
    def _meta(self) -> str:
        return json.dumps({"format": SOURCE_FORMAT, "task": self.task, "source": self.source,
                           "objects": list(self.object_names),
                           "episodes": [{"number": e.number, "label": e.label, "seed": e.seed, "frames": len(e.gripper),
                                         "segments": [s.to_json() for s in e.segments]} for e in self.episodes]},
                          sort_keys=True, allow_nan=False)

    def _arrays(self) -> dict[str, np.ndarray]:
        return {"eef": np.concatenate([e.eef for e in self.episodes]).astype(np.float64),
                "commanded": np.concatenate([e.commanded for e in self.episodes]).astype(np.float64),
                "gripper": np.concatenate([e.gripper for e in self.episodes]).astype(np.float64),
                "objects": np.concatenate([e.objects for e in self.episodes]).astype(np.float64)}

    def content_hash(self) -> str:
        """sha256 of what the file holds (its JSON and its arrays' dtype, shape and bytes), not of the zip's
        bytes (which carry timestamps): the same source extracted twice has the same hash."""
        return _hash(self._meta(), self._arrays())

    def save(self, folder: Path) -> Path:
        """Write ``folder/source-<hash>.npz`` durably (a temporary file renamed into place) unless it is there
        already with the same content; returns its path."""
        from demoforge.storage.durable import fsync_dir, fsync_file, make_dirs

        digest = self.content_hash()
        path = folder / source_file_name(digest)
        if path.is_file():
            try:
                if load_source(path, digest) is not None:
                    return path
            except SourceFileError:
                pass  # a damaged file from an interrupted write: written again below
        make_dirs(folder)
        temporary = folder / f".{path.name}.tmp"
        save: Any = np.savez  # its stubs take **kwds as allow_pickle's type
        with open(temporary, "wb") as handle:
            save(handle, meta=np.array(self._meta()), **self._arrays())
        fsync_file(temporary)
        os.replace(temporary, path)
        fsync_dir(folder)
        return path


def source_file_name(digest: str) -> str:
    return f"source-{digest[:16]}.npz"


def _hash(meta: str, arrays: Mapping[str, np.ndarray]) -> str:
    digest = hashlib.sha256(meta.encode())
    for name in _ARRAYS:
        array = np.ascontiguousarray(arrays[name])
        digest.update(f"{name}:{array.dtype.str}:{array.shape}".encode())
        digest.update(array.tobytes())
    return digest.hexdigest()


def load_source(path: Path | str, expected_hash: str) -> ExtractedSource:
    """Read an extracted source file and check that its content hash is ``expected_hash`` (the job's)."""
    try:
        with np.load(path, allow_pickle=False) as npz:
            meta_text = str(npz["meta"])
            arrays = {name: np.asarray(npz[name], dtype=np.float64) for name in _ARRAYS}
    except (OSError, ValueError, KeyError) as exc:
        raise SourceFileError(f"cannot read the multiply source {path}: {exc}") from None
    actual = _hash(meta_text, arrays)
    if actual != expected_hash:
        raise SourceFileError(f"the multiply source {path} has content hash {actual[:16]}, the job's is "
                              f"{expected_hash[:16]}: it was changed or replaced")
    meta = json.loads(meta_text)
    if meta.get("format") != SOURCE_FORMAT:
        raise SourceFileError(f"the multiply source {path} has format {meta.get('format')!r}; this demoforge "
                              f"reads {SOURCE_FORMAT}")
    episodes, frame, step = [], 0, 0
    for raw in meta["episodes"]:
        n = int(raw["frames"])
        episodes.append(ExtractedEpisode(
            number=int(raw["number"]), label=str(raw["label"]), seed=int(raw["seed"]),
            segments=tuple(ExtractedSegment.from_json(s) for s in raw["segments"]),
            eef=arrays["eef"][frame:frame + n + 1], commanded=arrays["commanded"][step:step + n],
            gripper=arrays["gripper"][step:step + n], objects=arrays["objects"][frame:frame + n + 1]))
        frame, step = frame + n + 1, step + n
    return ExtractedSource(task=str(meta["task"]), source=str(meta["source"]), object_names=tuple(meta["objects"]),
                     episodes=tuple(episodes))


# ------------------------------------------------------------------------------------------ one segment
@dataclass(frozen=True, eq=False)
class PlannedSegment:
    """A source segment moved into the current scene: the pose to interpolate to, the poses to command (one
    per source action) with the source's gripper commands, and the transform that moved them."""

    episode: ExtractedEpisode
    segment: ExtractedSegment
    transform: np.ndarray
    start: Pose  # the source's end-effector pose at the segment's start, transformed
    targets: tuple[Pose, ...]
    grippers: tuple[float, ...]

    def provenance(self, strategy: str, interpolation: int, hold: int = 0) -> dict[str, Any]:
        """What the generated segment records of where it came from (JSON-safe): ``interpolation`` steps before
        the moved segment, ``hold`` steps holding its last pose after it (the episode's last segment)."""
        return {"source_episode": self.episode.number, "source_label": self.episode.label,
                "source_seed": self.episode.seed, "source_segment": self.segment.index,
                "source_segment_name": self.segment.name, "source_frames": [self.segment.start, self.segment.end],
                "reference": self.segment.reference, "transform": json_transform(self.transform),
                "interpolation_steps": interpolation, "hold_steps": hold, "strategy": strategy}


def reference_pose(source: ExtractedSource, episode: ExtractedEpisode, segment: ExtractedSegment) -> Pose:
    """The pose the source segment moves with, at its start: its reference object's, or the end effector's."""
    if segment.reference is None:
        return episode.eef_pose(segment.start)
    return episode.object_pose(source.object_index(segment.reference), segment.start)


def plan_segment(source: ExtractedSource, episode: ExtractedEpisode, position: int, now: Pose) -> PlannedSegment:
    """Move segment ``position`` of ``episode`` so that its reference pose at its start becomes ``now``."""
    segment = episode.segments[position]
    transform = relative_transform(now, reference_pose(source, episode, segment))
    targets = tuple(apply_transform(transform, row_pose(row)) for row in episode.commanded[segment.start:segment.end])
    return PlannedSegment(episode=episode, segment=segment, transform=transform,
                          start=apply_transform(transform, episode.eef_pose(segment.start)), targets=targets,
                          grippers=tuple(float(g) for g in episode.gripper[segment.start:segment.end]))


def choose(source: ExtractedSource, position: int, strategy: str, now: Sequence[Pose], rng: np.random.Generator) -> int:
    """Which source episode gives segment ``position``: ``now[i]`` is episode ``i``'s reference pose in the
    current scene. ``random``: uniform, from the attempt's generator; ``nearest``: the episode whose reference
    was nearest (position, metres) at the segment's start, the first on a tie."""
    if strategy == "random":
        return int(rng.integers(len(source.episodes)))
    distances = [float(np.linalg.norm(pose.position - reference_pose(source, e, e.segments[position]).position))
                 for e, pose in zip(source.episodes, now)]
    return int(np.argmin(distances))
