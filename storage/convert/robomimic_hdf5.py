"""robomimic HDF5: one file, what robomimic trains from and MimicGen and Isaac Lab Mimic read and write.

The layout is robomimic's (``robomimic/utils/dataset.py``'s ``SequenceDataset`` reads it; docs/export.md,
"Other formats", lists every key):

- ``data`` attrs ``total`` (frames) and ``env_args`` (JSON: ``env_name`` the demoforge task, ``type`` 2 = robomimic's
  gym type, ``env_kwargs`` the task options); ``data/demo_<N>`` per dataset episode ``N``, attr ``num_samples``;
- ``actions`` (T, A), ``rewards`` (T,), ``dones`` (T,), exactly the dataset's rows; ``obs/<key>`` and
  ``next_obs/<key>`` (the observation after each action: ``obs`` shifted by one, the last one repeated, since a
  dataset holds no observation after its last action): state vectors float32 (``observation.state`` ->
  ``state``), cameras decoded from the videos to uint8 (T, H, W, 3) (``observation.images.front`` ->
  ``front_image``), depth cameras to float32 metres (T, H, W, 1) (``..._depth``);
- ``mask/<name>``: the filter keys (``train``, or the part an ``edit --split`` wrote; ``successful``, ``failed``);
- ours: per demo attrs ``success``, ``seed``, ``attempt``, ``task``, ``instruction``, ``segments`` (JSON spans) and
  ``demoforge_episode`` (the sidecar record), the per-step ``segment_ids``, every other per-frame column under
  ``demoforge/<column>``, and the segment boundaries as MimicGen's subtask termination signals
  (``datagen_info/subtask_term_signals/<segment name>``, 0 then 1 from the segment's last frame on: MimicGen's and
  Isaac Lab Mimic's parsers end a subtask one frame after the first 1, which is then the segment's end).

No simulator ``states`` (a demoforge episode is replayed from its seed and actions: ``demoforge replay``) and no
MimicGen poses (``eef_pose``, ``object_poses``: the environment's, not in a dataset).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from demoforge.storage.convert.reading import reading
from demoforge.storage.convert.report import ConvertError, ConvertReport
from demoforge.storage.depth import dequantize
from demoforge.storage.faults import ExportStep, reach
from demoforge.storage.lerobot.edit_source import DatasetToEdit
from demoforge.storage.lerobot.format import INFO, depth_identity_of_info
from demoforge.storage.paths import short_path
from demoforge.storage.video import decode_span

FORMAT = "robomimic-hdf5"
GYM_ENV_TYPE = 2  # robomimic.envs.env_base.EnvType.GYM_TYPE: demoforge's tasks are gymnasium environments
#: LeRobot's automatic columns: where a row sits in the dataset, not data of the episode.
AUTOMATIC = ("timestamp", "frame_index", "episode_index", "index", "task_index")
NUMERIC = ("float16", "float32", "float64", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32",
           "uint64", "bool")
SIGNALS = "datagen_info/subtask_term_signals"  # MimicGen's place for them (mimicgen/utils/file_utils.py)
GZIP_LEVEL = 4  # h5py's default gzip level; every HDF5 reader has the filter (lzf is h5py's own)


@dataclass(frozen=True)
class ObsKey:
    """One observation of the file: its name under ``obs/``, the dataset feature it comes from, and its kind
    (``low_dim``, ``rgb``, ``depth``: robomimic's observation modalities)."""

    key: str
    feature: str
    kind: str


@dataclass(frozen=True)
class Layout:
    """What goes where, decided (and checked) before anything is written."""

    obs: tuple[ObsKey, ...]
    extra: tuple[str, ...]  # other per-frame columns, under demoforge/<column>
    masks: Mapping[str, tuple[int, ...]]  # filter key -> dataset episode indices
    skipped: tuple[str, ...]  # features the format cannot hold


def write(dataset: Path, out: Path) -> ConvertReport:
    """Write the v3.0 dataset at ``dataset`` as one robomimic HDF5 file at the new path ``out``."""
    with reading(dataset) as source:
        layout = plan(source)
        return _write(source, layout, out)


# ------------------------------------------------------------------------------------------------ the plan
def plan(source: DatasetToEdit) -> Layout:
    """The file's keys for this dataset; a ConvertError (nothing written) for one robomimic cannot hold."""
    where = short_path(source.path)
    action = source.features.get("action")
    if action is None or action.get("dtype") not in NUMERIC:
        raise ConvertError(f"{where} has no numeric 'action' feature: robomimic's demos need actions; nothing was "
                           "written")
    obs: list[ObsKey] = []
    extra: list[str] = []
    skipped: list[str] = []
    for name, feature in source.features.items():
        dtype = feature.get("dtype")
        if name in AUTOMATIC or name in ("action", "next.reward", "next.done") or dtype == "language":
            continue
        if dtype == "video":
            depth = bool((feature.get("info") or {}).get("is_depth_map"))
            if depth and depth_identity_of_info(feature.get("info") or {}) is None:
                raise ConvertError(f"{where}: the depth feature {name!r} lacks its quantizer fields in {INFO}; "
                                   "nothing was written")
            key = _camera_key(name, "depth" if depth else "image")
            obs.append(ObsKey(key, name, "depth" if depth else "rgb"))
        elif dtype in NUMERIC and name.startswith("observation.") and len(feature.get("shape") or ()) == 1:
            obs.append(ObsKey(name.removeprefix("observation.").replace(".", "_"), name, "low_dim"))
        elif dtype in NUMERIC:
            extra.append(name)
        else:
            skipped.append(f"{name} ({dtype})")
    for ob in obs:
        if not re.fullmatch(r"[A-Za-z0-9_\-]+", ob.key):
            raise ConvertError(f"{where}: the feature {ob.feature!r} would be the observation key {ob.key!r}, which "
                               "HDF5 paths and robomimic's configs cannot hold; nothing was written")
    names = [ob.key for ob in obs]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ConvertError(f"{where}: features {', '.join(o.feature for o in obs if o.key in twice)} would share "
                           f"the observation key(s) {', '.join(twice)}; nothing was written")
    if any("/" in name for name in extra):
        raise ConvertError(f"{where}: a column name holds '/', which an HDF5 name cannot; nothing was written")
    return Layout(tuple(obs), tuple(extra), _masks(source), tuple(skipped))


def _camera_key(feature: str, kind: str) -> str:
    """A camera's observation key, robosuite-style: ``observation.images.front`` -> ``front_image``,
    ``observation.image`` -> ``image``, ``observation.images.front_depth`` -> ``front_depth``."""
    camera = feature.removeprefix("observation.images.").removeprefix("observation.").replace(".", "_")
    return camera if camera.endswith(kind) else f"{camera}_{kind}"


def _masks(source: DatasetToEdit) -> dict[str, tuple[int, ...]]:
    """robomimic's filter keys: the part an ``edit --split`` wrote (all of its episodes), else the splits of
    ``info.json`` (``train`` = all of them, as LeRobot writes it); ``successful`` / ``failed`` from the sidecar."""
    count = len(source.episodes)
    masks: dict[str, tuple[int, ...]] = {}
    operation = str(((source.marker.edit if source.marker is not None else None) or {}).get("operation") or "")
    part = re.search(r"\bpart=([A-Za-z0-9_\-]+)$", operation)
    if part:
        masks[part.group(1)] = tuple(range(count))
    else:
        for name, span in (source.info.get("splits") or {}).items():
            found = re.fullmatch(r"\s*(\d+)\s*:\s*(\d+)\s*", str(span))
            if not re.fullmatch(r"[A-Za-z0-9_\-]+", str(name)) or not found:
                raise ConvertError(f"{short_path(source.path)}: {INFO} has the split {name!r}: {span!r}, not NAME: "
                                   "'START:END'; nothing was written")
            masks[str(name)] = tuple(range(int(found.group(1)), min(int(found.group(2)), count)))
        masks.setdefault("train", tuple(range(count)))
    if source.has_sidecar:
        records = [e.record or {} for e in source.episodes]
        masks["successful"] = tuple(e.index for e, r in zip(source.episodes, records) if r.get("success"))
        masks["failed"] = tuple(e.index for e, r in zip(source.episodes, records) if not r.get("success"))
    return masks


# ------------------------------------------------------------------------------------------------ writing
def _write(source: DatasetToEdit, layout: Layout, out: Path) -> ConvertReport:
    import h5py

    frames = 0
    tasks: dict[str, Any] = {}
    with h5py.File(out, "w") as file:
        data = file.create_group("data")
        for episode in source.episodes:
            group = data.create_group(f"demo_{episode.index}")
            frames += _write_demo(source, layout, episode.index, group)
            record = episode.record or {}
            if record.get("task"):
                tasks.setdefault(str(record["task"]), record.get("task_options") or {})
            reach(ExportStep.AFTER_VIDEOS)  # one demo written: a kill test holds the conversion here
        data.attrs["total"] = frames
        data.attrs["env_args"] = json.dumps(_env_args(source, tasks), indent=4)
        data.attrs["demoforge"] = json.dumps(_provenance(source, layout), sort_keys=True)
        for name, indices in layout.masks.items():
            file.create_dataset(f"mask/{name}", data=np.array([f"demo_{i}" for i in indices], dtype="S"))
        reach(ExportStep.AFTER_DATA)
    return ConvertReport(FORMAT, len(source.episodes), frames, notes=tuple(_notes(source, layout)))


def _write_demo(source: DatasetToEdit, layout: Layout, index: int, group: Any) -> int:
    """One episode as ``data/demo_<index>``; returns its frame count."""
    length = source.episodes[index].length
    table, start = source.data_rows(index)
    rows = table.slice(start, length)
    group.attrs["num_samples"] = length
    group.create_dataset("actions", data=column(rows, "action", length))
    rewards = column(rows, "next.reward", length).reshape(length) if "next.reward" in source.features \
        else np.zeros(length, np.float32)
    group.create_dataset("rewards", data=rewards)
    if "next.done" in source.features:
        dones = column(rows, "next.done", length).reshape(length).astype(np.int64)
    else:  # an export from before the outcome columns: the episode's last frame ends it
        dones = np.zeros(length, np.int64)
        dones[-1:] = 1
    group.create_dataset("dones", data=dones)
    for ob in layout.obs:
        values = column(rows, ob.feature, length) if ob.kind == "low_dim" else camera_frames(source, ob, index)
        _write_obs(group, ob, values)
    for name in layout.extra:
        group.create_dataset(f"demoforge/{name}", data=column(rows, name, length))
    record = source.episodes[index].record
    segments = segments_of(record, length, source, index)
    if "annotation.segment_id" in source.features:
        group.create_dataset("segment_ids", data=column(rows, "annotation.segment_id", length).reshape(length))
    elif segments:
        ids = np.zeros(length, np.int64)
        for n, segment in enumerate(segments):
            ids[segment["start_step"]:segment["end_step"]] = n
        group.create_dataset("segment_ids", data=ids)
    for segment in segments:
        signal = np.zeros(length, np.int64)
        signal[max(segment["end_step"] - 1, 0):] = 1
        group.create_dataset(f"{SIGNALS}/{segment['signal']}", data=signal)
    _episode_attrs(group, source, index, segments)
    return length


def _write_obs(group: Any, ob: ObsKey, values: np.ndarray) -> None:
    """``obs/<key>`` and ``next_obs/<key>`` (shifted by one step; the last step's is its own observation)."""
    following = np.concatenate([values[1:], values[-1:]]) if len(values) else values
    for prefix, array in (("obs", values), ("next_obs", following)):
        if ob.kind == "low_dim":
            group.create_dataset(f"{prefix}/{ob.key}", data=array)
        else:  # a chunk per frame: robomimic reads short runs of frames; gzip costs little to read
            group.create_dataset(f"{prefix}/{ob.key}", data=array, chunks=(1, *array.shape[1:]),
                                 compression="gzip", compression_opts=GZIP_LEVEL)


def column(rows: Any, name: str, length: int) -> np.ndarray:
    """A column's values as the dataset holds them: (T, n) for a vector feature, (T, 1) for a scalar."""
    import pyarrow as pa

    values = rows[name].combine_chunks()
    while pa.types.is_list(values.type) or pa.types.is_large_list(values.type) \
            or pa.types.is_fixed_size_list(values.type):
        values = values.flatten()
    if values.null_count:
        raise ConvertError(f"the column {name!r} has {values.null_count} missing value(s); nothing was written")
    array = np.asarray(values.to_numpy(zero_copy_only=False))
    return array.reshape(length, -1) if length else array.reshape(0, 1)


def camera_frames(source: DatasetToEdit, ob: ObsKey, index: int) -> np.ndarray:
    """An episode's frames of one camera, decoded from its video as LeRobot reads them (from the episode's
    ``from_timestamp``, one frame per 1/fps): uint8 (T, H, W, 3), or depth in its unit (T, H, W, 1) float32."""
    path, start, _end = source.video_file(ob.feature, index)
    length = source.episodes[index].length
    feature = source.features[ob.feature]
    try:
        if ob.kind == "depth":
            identity = depth_identity_of_info(feature.get("info") or {})
            assert identity is not None  # checked by plan()
            frames = [dequantize(codes, identity)[..., None]
                      for codes in decode_span(path, start, start + length / source.fps, source.fps, "gray12le")]
        else:
            frames = decode_span(path, start, start + length / source.fps, source.fps)
    except (OSError, ValueError) as exc:  # PyAV's errors are both
        raise ConvertError(f"{short_path(path)}: cannot decode episode {index} of {ob.feature}: {exc}") from None
    if len(frames) != length:
        raise ConvertError(f"{short_path(path)}: episode {index} of {ob.feature} decodes to {len(frames)} frame(s), "
                           f"its metadata says {length} (`demoforge validate {source.path}` reports more)")
    shape = tuple(int(s) for s in feature.get("shape") or ())
    if frames and shape and frames[0].shape != shape:
        raise ConvertError(f"{short_path(path)}: {ob.feature} decodes to frames of {frames[0].shape}, {INFO} says "
                           f"{shape}")
    return np.stack(frames) if frames else np.zeros((0, *shape), np.float32 if ob.kind == "depth" else np.uint8)


# ------------------------------------------------------------------------------------------------ ours
def segments_of(record: Mapping[str, Any] | None, length: int, source: DatasetToEdit,
              index: int) -> list[dict[str, Any]]:
    """The episode's segments from its sidecar record, each with the name of its subtask signal (its own name;
    a name used twice in the episode gets ``_<n>``, the n-th use, on every use)."""
    segments = [dict(s) for s in (record or {}).get("segments") or ()]
    names = [str(s.get("name")) for s in segments]
    previous = 0
    for n, segment in enumerate(segments):
        start, end = segment.get("start_step"), segment.get("end_step")
        if not (isinstance(start, int) and isinstance(end, int) and start == previous and start < end <= length):
            raise ConvertError(f"{short_path(source.path)}: episode {index}'s segment {n} spans "
                               f"[{start}, {end}), not the next part of its {length} frames (`demoforge validate` "
                               "reports more); nothing was written")
        previous = end
        name = re.sub(r"[^A-Za-z0-9_\-]", "_", names[n]) or f"segment_{n}"
        segment["signal"] = f"{name}_{names[:n].count(names[n])}" if names.count(names[n]) > 1 else name
    return segments


def _episode_attrs(group: Any, source: DatasetToEdit, index: int, segments: Sequence[Mapping[str, Any]]) -> None:
    episode = source.episodes[index]
    group.attrs["dataset_episode_index"] = index
    group.attrs["task"] = episode.task
    record = episode.record
    if record is None:
        return
    group.attrs["success"] = bool(record.get("success"))
    for key in ("seed", "attempt"):
        if isinstance(record.get(key), int):
            group.attrs[key] = record[key]
    group.attrs["instruction"] = str(record.get("instruction") or episode.task)
    group.attrs["job_task"] = str(record.get("task") or "")
    group.attrs["segments"] = json.dumps([{k: s.get(k) for k in ("segment_id", "name", "instruction", "start_step",
                                                                  "end_step", "success", "failure_reason", "signal")}
                                          for s in segments])
    group.attrs["demoforge_episode"] = json.dumps(record, sort_keys=True)


def _env_args(source: DatasetToEdit, tasks: Mapping[str, Any]) -> dict[str, Any]:
    """robomimic's ``env_args``. Its rollouts would ``gym.make(env_name)``; demoforge's tasks are run by
    ``demoforge eval`` instead, so train with rollouts off."""
    name = next(iter(tasks)) if len(tasks) == 1 else ("" if not tasks else "mixed")
    return {"env_name": name or str(source.info.get("robot_type") or ""), "type": GYM_ENV_TYPE,
            "env_kwargs": dict(next(iter(tasks.values()))) if len(tasks) == 1 else {},
            "demoforge": {"tasks": sorted(tasks), "fps": source.fps}}


def _provenance(source: DatasetToEdit, layout: Layout) -> dict[str, Any]:
    return {"writer": "demoforge", "format": FORMAT, "fps": source.fps,
            "source": {"path": str(source.path), "version": source.version, "digest": source.digest(),
                       "repo_id": source.marker.repo_id if source.marker is not None else None},
            "obs": {ob.key: {"feature": ob.feature, "modality": ob.kind} for ob in layout.obs},
            "next_obs": "obs shifted by one step; the last step repeats its own observation",
            "subtask_term_signals": "per segment: 0, then 1 from the segment's last frame on"}


def _notes(source: DatasetToEdit, layout: Layout) -> list[str]:
    notes = ["next_obs of an episode's last step repeats its obs (a dataset holds no observation after the last "
             "action); no simulator states: `demoforge replay` re-runs an episode from its seed and actions"]
    if not source.has_sidecar:
        notes.append("a dataset without demoforge's sidecar: no segments, success or seeds to carry")
    if layout.skipped:
        notes.append(f"not carried (robomimic has no place for them): {', '.join(layout.skipped)}")
    return notes
