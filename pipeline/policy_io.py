"""How a driving policy sees a frame: the dataset's feature names (the task's state features,
``observation.images.<camera>`` as HxWx3 uint8) mapped to numpy arrays, and the check that a policy's
features are ones the task records."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from demoforge.pipeline.tasks.registry import TaskInfo
from demoforge.stages.contract import RecordedObservation
from demoforge.stages.settings import JobConfigError
from demoforge.storage.lerobot.format import camera_key


class PolicyLoadError(JobConfigError):
    """``--driver`` names nothing loadable, or a policy whose features do not match the task's."""


def task_features(info: TaskInfo) -> dict[str, tuple[int, ...]]:
    """What a driver sees, by LeRobot feature name, with shapes (images HxWxC)."""
    features = {name: tuple(shape) for name, shape in info.state_shapes.items()}
    for camera in info.cameras:
        features[camera_key(camera.name)] = tuple(camera.feature_shape)
    return features


def _read_only(value: object) -> np.ndarray:
    view = np.asarray(value).view()
    view.flags.writeable = False
    return view


def features_of(observation: RecordedObservation) -> dict[str, np.ndarray]:
    """A recorded observation as the driver sees it (the dataset's feature names): read-only views of the arrays
    the frame records, so a policy that writes into its input fails (naming it) instead of changing the data."""
    out = {name: _read_only(value) for name, value in observation.state.items()}
    for camera, image in observation.images.items():
        out[camera_key(camera)] = _read_only(image)
    return out


def feature_mismatch(wanted: Mapping[str, tuple[int, ...]], task: Mapping[str, tuple[int, ...]]) -> list[str]:
    """What a policy wants that the task does not record, or records with another shape."""
    out = []
    for name, shape in sorted(wanted.items()):
        if name not in task:
            out.append(f"{name} {shape} (the task records no such feature)")
        elif tuple(task[name]) != tuple(shape):
            out.append(f"{name} {shape} (the task records {tuple(task[name])})")
    return out
