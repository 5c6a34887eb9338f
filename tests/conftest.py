import os
import sys
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest

# Offscreen MuJoCo rendering on CPU must be chosen before mujoco is imported anywhere.
os.environ.setdefault("MUJOCO_GL", "egl")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).parent))


@pytest.fixture
def anyio_backend() -> str:
    """anyio's pytest plugin runs ``@pytest.mark.anyio`` tests on the loop the pipeline uses."""
    return "asyncio"


@pytest.fixture
def register_task() -> Iterator[Callable]:
    """Register tasks for one test only (the registry is global: a task left behind makes a second run of
    the same test, in the same process, fail as a duplicate registration)."""
    from demoforge.pipeline.tasks.registry import TaskEntry, registered

    with ExitStack() as stack:
        def register(entry: TaskEntry) -> TaskEntry:
            stack.enter_context(registered(entry))
            return entry

        yield register
