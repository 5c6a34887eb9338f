"""Driving policies: what ``--driver`` names, loaded as the executor's :class:`~demoforge.stages.control.Policy`.

A driver sees a frame as a policy trained on the dataset would: a dict of the dataset's feature names (the
task's state features, ``observation.images.<camera>`` as HxWx3 uint8) to numpy arrays, and returns one action.

- ``module:factory``: ``factory()`` (no arguments) returns an object with ``select_action(features)`` (and
  optionally ``reset()``, called before each attempt) or a plain callable ``features -> action``. The module
  is imported in every worker, as a task plugin is.
- a folder: a LeRobot policy checkpoint (``pretrained_model``: ``config.json`` and the weights, with the pre-
  and post-processors saved beside them), loaded with LeRobot's own factory on the CPU, nothing from a hub.
"""

from __future__ import annotations

import importlib
import re
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from demoforge.pipeline.policy_io import PolicyLoadError, features_of, task_features
from demoforge.pipeline.tasks.registry import TaskInfo
from demoforge.stages.contract import RecordedObservation
from demoforge.stages.control import Policy, bounded_call, describe_failure
from demoforge.storage.paths import short_path

_FACTORY = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_]\w*")
BUILD_TIMEOUT_S = 300.0  # building a policy (a checkpoint's torch import and weights) at start-up may take this long


class FeaturePolicy:
    """Adapts a ``select_action(features)`` object (or a callable) to the executor's ``act(observation)``."""

    def __init__(self, inner: Any, name: str) -> None:
        self.inner = inner
        self._select = getattr(inner, "select_action", None) or inner
        if not callable(self._select):
            raise PolicyLoadError(f"--driver {name}: the factory returned a {type(inner).__name__}, which has no "
                                  "select_action(features) and is not callable")

    def reset(self) -> None:
        reset = getattr(self.inner, "reset", None)
        if callable(reset):
            reset()

    def act(self, observation: RecordedObservation) -> Any:
        return self._select(features_of(observation))


def _factory_policy(driver: str) -> Callable[[], Policy]:
    module_name, _, attr = driver.partition(":")
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:
        raise PolicyLoadError(f"--driver {driver}: importing module {module_name!r} failed: "
                              f"{type(exc).__name__}: {exc}") from None
    factory = getattr(module, attr, None)
    if not callable(factory):
        raise PolicyLoadError(f"--driver {driver}: module {module_name!r} has no callable {attr!r}")

    def make() -> Policy:
        return FeaturePolicy(factory(), driver)

    return make


def policy_factory(driver: str, info: TaskInfo) -> Callable[[], Policy]:
    """A function that builds one driving policy (one per env row: policies keep state); raises
    :class:`PolicyLoadError` naming ``--driver`` when it names nothing loadable or does not fit the task."""
    if not driver.strip():
        raise PolicyLoadError("--driver '': name a LeRobot checkpoint folder or module:factory")
    path = Path(driver)
    if path.exists() or "/" in driver or driver.startswith("."):
        from demoforge.pipeline.lerobot_policy import checkpoint_policy

        if not path.is_dir():
            raise PolicyLoadError(f"--driver {short_path(path)}: no such folder (a LeRobot checkpoint's "
                                  "pretrained_model folder, or module:factory)")
        return checkpoint_policy(path, task_features(info), tuple(info.action_shape))
    if not _FACTORY.fullmatch(driver):
        raise PolicyLoadError(f"--driver {driver!r}: expected a LeRobot checkpoint folder or module:factory "
                              "(e.g. my_policies:make)")
    return _factory_policy(driver)


def check_driver(make: Callable[[], Policy], driver: str, timeout_s: float | None = BUILD_TIMEOUT_S
                 ) -> Callable[[], Policy]:
    """Build the driver (``make``, from :func:`policy_factory`) once where the job starts, whatever the executor,
    so a bad one is refused (:class:`PolicyLoadError`, naming ``--driver``) before anything is written. Returns a
    builder that hands out that first policy before building more (a checkpoint is loaded once less)."""
    try:
        first = bounded_call(make, timeout_s, f"policy check {driver}")
    except PolicyLoadError:
        raise
    except TimeoutError:
        raise PolicyLoadError(f"--driver {driver}: building the policy did not return within {timeout_s:g} s") \
            from None
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # sys.exit() in a factory is the factory's failure, not the command's exit
        raise PolicyLoadError(f"--driver {driver}: building the policy {describe_failure(exc)}") from None
    spare: list[Policy] = [first]
    lock = threading.Lock()

    def make_again() -> Policy:
        with lock:
            if spare:
                return spare.pop()
        return make()

    return make_again
