"""RLDS: a TensorFlow Datasets folder of episodes of steps, what OpenVLA, OpenVLA-OFT and Octo train from.

``OUT/<name>/1.0.0/`` (``name``: OUT's own name in snake case) holds what TFDS writes (``dataset_info.json``,
``features.json``, ``<name>-<split>.tfrecord-*``), read with ``tfds.builder_from_directory(OUT/<name>/1.0.0)`` or
``tfds.builder(name, data_dir=OUT)``. Each episode is one example, in dataset order:

- ``steps``: ``observation/<key>`` (the keys of robomimic_hdf5.py: ``state`` float32, cameras PNG-encoded uint8
  ``front_image``, depth float32 metres ``front_depth``), ``action``, ``reward``, ``discount`` (1), ``is_first``,
  ``is_last``, ``is_terminal`` (the last step of an episode that terminated, not one cut short),
  ``language_instruction`` (the instruction of the segment the step is in, else the episode's) and ``segment_id``;
- ``episode_metadata``: ``file_path`` (the source dataset and episode, Open X-Embodiment's field), ``episode_index``,
  ``success``, ``seed``, ``attempt``, ``instruction``, ``task``, ``segments`` (JSON spans) and ``demoforge_episode``
  (the sidecar record, JSON).

TensorFlow is an optional extra (``pip install 'demoforge[rlds]'``): the writer imports it only here, so no other
command pays its import, and ``--format rlds`` without it is refused before anything is written.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from demoforge.storage.convert.report import ConvertError, ConvertReport
from demoforge.storage.convert.reading import reading
from demoforge.storage.convert.robomimic_hdf5 import Layout, camera_frames, column, plan, segments_of
from demoforge.storage.faults import ExportStep, reach
from demoforge.storage.lerobot.edit_source import DatasetToEdit

FORMAT = "rlds"
VERSION = "1.0.0"
EXTRA = "pip install 'demoforge[rlds]' (tensorflow-cpu and tensorflow-datasets)"


def write(dataset: Path, out: Path) -> ConvertReport:
    """Write the v3.0 dataset at ``dataset`` as an RLDS (TFDS) dataset into the new folder ``out``."""
    tfds = _tfds()
    with reading(dataset) as source:
        layout = plan(source)
        splits = {name: indices for name, indices in layout.masks.items()
                  if name not in ("successful", "failed") and indices} or {"train": tuple(range(len(source.episodes)))}
        name = dataset_name(out)
        features = _features(tfds, source, layout)
        out.mkdir()
        with contextlib.redirect_stdout(io.StringIO()):  # TFDS prints "Downloading and preparing dataset ..."
            tfds.dataset_builders.store_as_tfds_dataset(
                name=name, version=VERSION, features=features, data_dir=out, disable_shuffling=True,
                split_datasets={split: _episodes(source, layout, indices) for split, indices in splits.items()},
                description=f"demoforge dataset {source.path} ({source.version or 'not published by demoforge'}) "
                            "converted by `demoforge convert --format rlds`")
        for empty in ("downloads/extracted", "downloads"):  # TFDS's download folders, unused here
            with contextlib.suppress(OSError):
                (out / empty).rmdir()
    frames = sum(e.length for e in source.episodes)
    notes = [f"read it with tfds.builder_from_directory('{out.with_name(out.name.split('.partial-')[0])}/{name}/"
             f"{VERSION}')"]
    if not source.has_sidecar:
        notes.append("a dataset without demoforge's sidecar: no segments, success or seeds to carry")
    if layout.skipped:
        notes.append(f"not carried: {', '.join(layout.skipped)}")
    return ConvertReport(FORMAT, len(source.episodes), frames, notes=tuple(notes))


def _tfds() -> Any:
    """TensorFlow Datasets, quiet; a ConvertError (nothing written) when the extra is not installed, or when this
    process has rendered with Mesa (MuJoCo's EGL or OSMesa): TensorFlow imported after that crashes the process
    (a segmentation fault; both carry LLVM), which the CLI's own process never does."""
    rendered = [m for m in ("OpenGL.EGL", "OpenGL.osmesa") if m in sys.modules]
    if rendered and "tensorflow" not in sys.modules:
        raise ConvertError("--format rlds imports TensorFlow, which crashes a process that has rendered with "
                           f"Mesa ({rendered[0]} is loaded): run `demoforge convert` in a process of its own; "
                           "nothing was written")
    # TensorFlow's C++ start-up lines on stderr (its oneDNN notice: only TensorFlow's own float ops change with
    # it, and a conversion runs none; it encodes PNGs and serializes)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")
    try:
        import tensorflow_datasets as tfds
        from absl import logging as absl_logging
    except ImportError as exc:
        raise ConvertError(f"--format rlds needs TensorFlow Datasets, which is not installed ({exc}): {EXTRA}; "
                           "nothing was written") from None
    absl_logging.set_verbosity(absl_logging.ERROR)
    tfds.disable_progress_bar()
    return tfds


def dataset_name(out: Path) -> str:
    """The TFDS name of the conversion at ``out`` (``convert`` writes ``OUT.partial-N`` first): OUT's name in
    snake case, as TFDS names datasets."""
    name = re.sub(r"[^a-z0-9]+", "_", out.name.split(".partial-")[0].lower()).strip("_")
    name = re.sub(r"^[0-9_]+", "", name)
    return name or "demoforge_dataset"


def _features(tfds: Any, source: DatasetToEdit, layout: Layout) -> Any:
    f = tfds.features
    observation: dict[str, Any] = {}
    for ob in layout.obs:
        shape = tuple(int(s) for s in source.features[ob.feature].get("shape") or ())
        if ob.kind == "rgb":
            observation[ob.key] = f.Image(shape=shape, dtype=np.uint8, encoding_format="png")
        elif ob.kind == "depth":
            observation[ob.key] = f.Tensor(shape=shape, dtype=np.float32)
        else:
            observation[ob.key] = f.Tensor(shape=shape, dtype=np.dtype(source.features[ob.feature]["dtype"]))
    action = source.features["action"]
    steps = {"observation": f.FeaturesDict(observation),
             "action": f.Tensor(shape=tuple(action.get("shape") or ()), dtype=np.dtype(action["dtype"])),
             "reward": f.Scalar(dtype=np.float32), "discount": f.Scalar(dtype=np.float32),
             "is_first": f.Scalar(dtype=np.bool_), "is_last": f.Scalar(dtype=np.bool_),
             "is_terminal": f.Scalar(dtype=np.bool_), "language_instruction": f.Text(),
             "segment_id": f.Scalar(dtype=np.int64)}
    metadata = {"file_path": f.Text(), "episode_index": f.Scalar(dtype=np.int64), "success": f.Scalar(dtype=np.bool_),
                "seed": f.Scalar(dtype=np.int64), "attempt": f.Scalar(dtype=np.int64), "instruction": f.Text(),
                "task": f.Text(), "segments": f.Text(), "demoforge_episode": f.Text()}
    return f.FeaturesDict({"steps": f.Dataset(steps), "episode_metadata": f.FeaturesDict(metadata)})


def _episodes(source: DatasetToEdit, layout: Layout, indices: tuple[int, ...]) -> Iterator[tuple[int, dict[str, Any]]]:
    """(key, example) per episode, built when TFDS asks for it (one episode's frames in memory at a time)."""
    for index in indices:
        yield index, _episode(source, layout, index)
        reach(ExportStep.AFTER_VIDEOS)  # one episode written: a kill test holds the conversion here


def _episode(source: DatasetToEdit, layout: Layout, index: int) -> dict[str, Any]:
    episode = source.episodes[index]
    length = episode.length
    table, start = source.data_rows(index)
    rows = table.slice(start, length)
    record: Mapping[str, Any] = episode.record or {}
    segments = segments_of(episode.record, length, source, index)
    instruction = str(record.get("instruction") or episode.task)
    observations = {ob.key: column(rows, ob.feature, length) if ob.kind == "low_dim" else
                    camera_frames(source, ob, index) for ob in layout.obs}
    actions = column(rows, "action", length)
    rewards = column(rows, "next.reward", length).reshape(length) if "next.reward" in source.features \
        else np.zeros(length, np.float32)
    ids = np.full(length, -1, np.int64)
    said = [instruction] * length
    for n, segment in enumerate(segments):
        ids[segment["start_step"]:segment["end_step"]] = n
        if segment.get("instruction"):
            said[segment["start_step"]:segment["end_step"]] = [str(segment["instruction"])] * \
                (segment["end_step"] - segment["start_step"])
    if "annotation.segment_id" in source.features:
        ids = column(rows, "annotation.segment_id", length).reshape(length).astype(np.int64)
    terminal = _terminated(record, rows, length)
    steps = [{"observation": {key: values[t] for key, values in observations.items()},
              "action": actions[t], "reward": np.float32(rewards[t]), "discount": np.float32(1.0),
              "is_first": t == 0, "is_last": t == length - 1, "is_terminal": terminal and t == length - 1,
              "language_instruction": said[t], "segment_id": np.int64(ids[t])} for t in range(length)]
    metadata = {"file_path": f"{source.path}#episode={index}", "episode_index": index,
                "success": bool(record.get("success")), "seed": _int(record.get("seed")),
                "attempt": _int(record.get("attempt")), "instruction": instruction, "task": episode.task,
                "segments": json.dumps([{k: s.get(k) for k in ("segment_id", "name", "instruction", "start_step",
                                                                "end_step", "success", "failure_reason")}
                                        for s in segments]),
                "demoforge_episode": json.dumps(dict(record), sort_keys=True) if record else ""}
    return {"steps": steps, "episode_metadata": metadata}


def _terminated(record: Mapping[str, Any], rows: Any, length: int) -> bool:
    """Whether the episode ended in a terminal state (RLDS's ``is_terminal``), not cut short: the sidecar's
    ``terminated``, else the last frame's ``annotation.terminated``, else ``next.done`` there (LeRobot's)."""
    if isinstance(record.get("terminated"), bool):
        return bool(record["terminated"])
    for name in ("annotation.terminated", "next.done"):
        if name in rows.column_names and length:
            return bool(column(rows, name, length).reshape(length)[-1])
    return False


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else -1
