"""A LeRobot policy checkpoint as a driver (``--driver FOLDER``): LeRobot's own loaders, on the CPU.

The folder is a ``pretrained_model`` folder as ``lerobot-train`` saves it: ``config.json``, the weights and
the pre/post-processor pipelines (normalisation with the training set's statistics). Observations are given
to the preprocessor as ``lerobot-eval`` gives them (images CHW float in [0, 1], states float32, a batch of
one, an empty ``task``: no instruction is passed, so language-conditioned policies get none); the
postprocessor's action goes to the env.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import sys
import threading
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from demoforge.pipeline.policy_io import PolicyLoadError, feature_mismatch, features_of
from demoforge.stages.contract import RecordedObservation
from demoforge.stages.control import Policy
from demoforge.storage.paths import short_path


_LOADING = threading.Lock()  # sys.stdout and logging's switch are the process's: one load at a time swaps them


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """LeRobot's loading notes (printed on stdout, which `eval --json` keeps for its report, and logged warnings
    such as the device it switches to): shown on stderr once the load succeeds, dropped when it fails, so a
    refused checkpoint is one line."""
    notes = io.StringIO()
    with _LOADING:
        before = logging.root.manager.disable
        logging.disable(max(before, logging.WARNING))
        try:
            with contextlib.redirect_stdout(notes):
                yield
        finally:
            logging.disable(before)
    sys.stderr.write(notes.getvalue())


def _load_config(path: Path) -> Any:
    if not (path / "config.json").is_file():
        raise PolicyLoadError(f"--driver {short_path(path)}: not a LeRobot policy checkpoint (no config.json; "
                              "give the pretrained_model folder lerobot-train saved)")
    import lerobot.policies.factory  # noqa: F401  (registers the policy types' configs)
    from lerobot.configs.policies import PreTrainedConfig

    try:
        with _quiet():
            return PreTrainedConfig.from_pretrained(str(path))
    except Exception as exc:
        detail = " ".join(str(exc).split())  # one line: parsers' messages span several
        raise PolicyLoadError(f"--driver {short_path(path)}: not a LeRobot policy checkpoint "
                              f"({type(exc).__name__}: {detail})"[:600]) from None


def _check_features(path: Path, wanted: Mapping[str, tuple[int, ...]], actions: list[tuple[int, ...]],
                    task_features: Mapping[str, tuple[int, ...]], action_shape: tuple[int, ...]) -> None:
    problems = feature_mismatch(wanted, task_features)
    if actions and actions[0] != tuple(action_shape):
        problems.append(f"action {actions[0]} (the task's action is {tuple(action_shape)})")
    if problems:
        raise PolicyLoadError(f"--driver {short_path(path)}: the checkpoint's features do not match the task: "
                              + "; ".join(problems))


class CheckpointPolicy:
    """One loaded checkpoint; ``reset()`` clears its action queue between attempts."""

    def __init__(self, path: Path, config: Any) -> None:
        import torch
        from lerobot.policies.factory import get_policy_class, make_pre_post_processors

        config.device = "cpu"
        self.torch = torch
        with _quiet():
            self.policy = get_policy_class(config.type).from_pretrained(str(path), config=config)
            self.policy.eval()
            self.pre, self.post = make_pre_post_processors(
                config, pretrained_path=str(path), preprocessor_overrides={"device_processor": {"device": "cpu"}})
        self.image_keys = [k for k, f in config.input_features.items() if f.type.name == "VISUAL"]
        self.task = ""

    def reset(self) -> None:
        self.policy.reset()

    def act(self, observation: RecordedObservation) -> np.ndarray:
        torch = self.torch
        batch: dict[str, Any] = {}
        for name, value in features_of(observation).items():
            tensor = torch.from_numpy(np.array(value, order="C"))  # a copy: the frame's arrays are read-only
            if name in self.image_keys:
                tensor = tensor.permute(2, 0, 1).float() / 255.0
            else:
                tensor = tensor.float()
            batch[name] = tensor.unsqueeze(0)
        batch["task"] = [self.task]
        with torch.inference_mode():
            action = self.post(self.policy.select_action(self.pre(batch)))
        return np.asarray(action.squeeze(0).cpu().numpy(), dtype=np.float32)


def _task_shape(kind: str, shape: tuple[int, ...]) -> tuple[int, ...]:
    """A checkpoint feature's shape as the task records it: LeRobot keeps images CHW, the task records HWC."""
    return (shape[1], shape[2], shape[0]) if kind == "VISUAL" and len(shape) == 3 else shape


def _declared_features(path: Path) -> tuple[dict[str, tuple[int, ...]], list[tuple[int, ...]]] | None:
    """The input features (HWC for images, as the task records them) and action shapes that ``config.json``
    declares, read as plain JSON: a checkpoint for another task is refused before LeRobot and torch are
    imported (seconds). None when the file does not read so; LeRobot's own loader then has the last word."""
    try:
        config = json.loads((path / "config.json").read_text())
        wanted: dict[str, tuple[int, ...]] = {}
        for name, feature in config["input_features"].items():
            wanted[name] = _task_shape(str(feature["type"]), tuple(int(n) for n in feature["shape"]))
        actions = [tuple(int(n) for n in f["shape"]) for f in config["output_features"].values()]
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return None
    return wanted, actions


def checkpoint_policy(path: Path, task_features: Mapping[str, tuple[int, ...]],
                      action_shape: tuple[int, ...]) -> Callable[[], Policy]:
    """Check the checkpoint against the task (every input feature recorded with its shape, the action's
    shape), then return a builder of loaded policies."""
    declared = _declared_features(path)
    if declared is not None:
        _check_features(path, *declared, task_features, action_shape)
    config = _load_config(path)
    missing = [what for what, features in (("input", config.input_features), ("output", config.output_features))
               if not features]
    if missing:
        raise PolicyLoadError(f"--driver {short_path(path)}: its config.json declares no "
                              f"{' and no '.join(missing)} features (input_features, output_features): not a "
                              "trained policy's checkpoint (give the pretrained_model folder lerobot-train saved)")
    wanted = {name: _task_shape(feature.type.name, tuple(feature.shape))
              for name, feature in config.input_features.items()}
    _check_features(path, wanted, [tuple(f.shape) for f in config.output_features.values()], task_features,
                    action_shape)

    def make() -> Policy:
        return CheckpointPolicy(path, _load_config(path))

    return make
