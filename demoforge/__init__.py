"""demoforge: segment-aware, crash-proof robot demonstration generation.

The public API is what this module exports (``from demoforge import ...``); docs/api.md shows it in use.
Everything else is internal and may change. The code lives in the repository's top-level folders
(``pipeline/``, ``stages/``, ``storage/``), packaged as ``demoforge.pipeline``, ``demoforge.stages`` and
``demoforge.storage`` through committed symlinks.

Names are imported on first use (PEP 562): ``import demoforge`` stays cheap, and a task author who needs
only the contract does not pull in the exporter's torch and lerobot.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

# public name -> module that defines it
_EXPORTS: dict[str, str] = {
    # writing a task
    "Segment": "demoforge.stages.contract",
    "StepView": "demoforge.stages.contract",
    "RecordedObservation": "demoforge.stages.contract",
    "TaskInfo": "demoforge.pipeline.tasks.registry",
    "CameraSpec": "demoforge.pipeline.tasks.registry",
    "TaskEntry": "demoforge.pipeline.tasks.registry",
    "TaskOptionError": "demoforge.pipeline.tasks.registry",
    "register": "demoforge.pipeline.tasks.registry",
    "get_task": "demoforge.pipeline.tasks.registry",
    "run_episodes": "demoforge.stages.executor",
    # the contract as types (stages/task_protocol.py): check a task with mypy or pyright
    "SegmentTask": "demoforge.stages.task_protocol",
    "ActionListTask": "demoforge.stages.task_protocol",
    "ChecksSuccess": "demoforge.stages.task_protocol",
    "HoldsAction": "demoforge.stages.task_protocol",
    "RecordsObservation": "demoforge.stages.task_protocol",
    "GivesInstruction": "demoforge.stages.task_protocol",
    "SelectsEpisode": "demoforge.stages.task_protocol",
    "SeedsAttempt": "demoforge.stages.task_protocol",
    "Randomizes": "demoforge.stages.task_protocol",
    "RandomizesVariants": "demoforge.stages.task_protocol",
    "task_capability": "demoforge.stages.task_protocol",
    # poses for `demoforge multiply` (docs/multiply.md)
    "TracksPoses": "demoforge.stages.task_protocol",
    "TaskPoses": "demoforge.stages.task_protocol",
    "Pose": "demoforge.stages.task_protocol",
    # a reactive expert (observation -> action) as segments
    "Phase": "demoforge.pipeline.reactive",
    "ReactiveExpert": "demoforge.pipeline.reactive",
    "PolicyExpert": "demoforge.pipeline.reactive",
    "ReturnBranch": "demoforge.pipeline.reactive",
    "ReturnBranchUnsupported": "demoforge.pipeline.reactive",
    "reactive_segments": "demoforge.pipeline.reactive",
    "EpisodeResult": "demoforge.stages.contract",
    "AttemptEnded": "demoforge.stages.records",
    # using the library
    "generate": "demoforge.api",
    "export": "demoforge.api",
    "validate": "demoforge.api",
    "open_store": "demoforge.storage.store",  # mode "r" (the default) reads beside a running job
    "open_dataset": "demoforge.api",
    # recording from a loop of your own (LeRobot's call shape, demoforge's durability)
    "Recorder": "demoforge.pipeline.recorder",
}

__all__ = sorted(_EXPORTS)

if TYPE_CHECKING:  # what type checkers and editors see; at run time each name is imported on first use
    from demoforge.api import export, generate, open_dataset, validate
    from demoforge.storage.store import open_store
    from demoforge.pipeline.recorder import Recorder
    from demoforge.stages.contract import EpisodeResult, RecordedObservation, Segment, StepView
    from demoforge.stages.executor import run_episodes
    from demoforge.stages.task_protocol import (
        ActionListTask,
        ChecksSuccess,
        GivesInstruction,
        HoldsAction,
        Pose,
        Randomizes,
        RandomizesVariants,
        RecordsObservation,
        SeedsAttempt,
        SegmentTask,
        SelectsEpisode,
        TaskPoses,
        TracksPoses,
        task_capability,
    )
    from demoforge.pipeline.reactive import (
        Phase,
        PolicyExpert,
        ReactiveExpert,
        ReturnBranch,
        ReturnBranchUnsupported,
        reactive_segments,
    )
    from demoforge.stages.records import AttemptEnded
    from demoforge.pipeline.tasks.registry import (
        CameraSpec,
        TaskEntry,
        TaskInfo,
        TaskOptionError,
        get_task,
        register,
    )


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'demoforge' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
