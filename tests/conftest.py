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


import shutil  # noqa: E402
import tempfile  # noqa: E402

import pytest  # noqa: E402


@pytest.fixture(scope="session")
def ray_cluster():
    """One local Ray cluster for the whole test session (start-up takes seconds); yields its GCS address,
    which `demoforge generate --executor ray --ray-address` joins. Its workers import the project and the
    test task modules through the PYTHONPATH set here."""
    import ray

    repo = Path(__file__).resolve().parent.parent
    paths = [str(repo), str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")]
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
    # Ray's socket paths must stay under 108 bytes: a short folder, not pytest's deep tmp_path.
    temp_dir = tempfile.mkdtemp(prefix="dfray")
    context = ray.init(num_cpus=2, include_dashboard=False, object_store_memory=100 * 2**20, _temp_dir=temp_dir,
                       logging_level="ERROR", log_to_driver=False)
    try:
        yield context.address_info["gcs_address"]
    finally:
        ray.shutdown()
        shutil.rmtree(temp_dir, ignore_errors=True)
