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


@pytest.fixture(autouse=True)
def no_real_time_threads_left() -> Iterator[None]:
    """A test that leaves a thread of this pytest worker at real-time priority (SVT-AV1 opened outside
    ``normal_priority()``, as root) errors here, naming itself; the worker is put back to normal priority so that
    nothing it starts later (a browser, a Ray cluster, a job) inherits the class and hangs the run (issue #30)."""
    yield
    from demoforge.storage.scheduling import realtime_threads, reset_process_priority

    left = realtime_threads()
    if left:
        reset_process_priority()
        pytest.fail(f"the test left {len(left)} thread(s) of the test process at real-time priority "
                    f"({', '.join(f'tid {t.tid} policy {t.policy} priority {t.priority}' for t in left[:5])}); "
                    "open encoders inside demoforge.storage.scheduling.normal_priority()", pytrace=False)


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


@pytest.fixture(scope="module")
def ray_nodes(tmp_path_factory):
    """One real multi-node Ray cluster for the test file that asks for it (start-up takes seconds; only
    test_scale_out.py does, and an idle cluster costs ~7% of a core, so it stops with the file): the head and
    one more node, one CPU each, without token authentication (``ray.cluster_utils.Cluster`` in a host process,
    see ray_nodes.py). Tests that add or remove nodes leave the cluster as they like; the fixtures below
    size it back first."""
    from ray_nodes import LocalCluster

    cluster = LocalCluster(tmp_path_factory.mktemp("ray-nodes"), auth=False, head_cpus=1, nodes=1)
    try:
        yield cluster
    finally:
        cluster.close()


@pytest.fixture
def ray_cluster(ray_nodes) -> str:
    """The session's cluster with the head and one more node (2 CPUs); yields the GCS address that
    `demoforge generate --executor ray --ray-address` joins."""
    ray_nodes.resize(1)
    return ray_nodes.address


@pytest.fixture(scope="module")
def ray_token_cluster(tmp_path_factory):
    """A one-node Ray cluster with token authentication (as `ray start --head` makes since Ray 2.59); its
    token is in ``.token_file``."""
    from ray_nodes import LocalCluster

    cluster = LocalCluster(tmp_path_factory.mktemp("ray-token"), auth=True, head_cpus=1)
    try:
        yield cluster
    finally:
        cluster.close()


# Seconds each file took in a suite run on the 2-core machine (per-file sums of `pytest --junitxml`, the run of
# 2026-12-04 21:23 UTC with the CLI's commands forked by tests/helpers.py run_cli; `tools/profile_suite.py` prints
# them), rounded to 5 s.
# pytest-xdist's `--dist loadfile` hands a worker the next file of the collection order when it is free;
# with the heaviest files first (`--no-loadscope-reorder` keeps our order) the two workers end together
# instead of one running a 2-minute file alone at the end. Files not listed count as small.
FILE_SECONDS = {
    "test_doc_commands.py": 175,  # measured alone, 2026-12-05 08:45 UTC (load average 2-3.5): 145 CPU-s
    # the files added on 2026-12-05, each from its own runs that day on a shared machine (not a suite run)
    "test_multiply.py": 80, "test_task_robosuite.py": 60, "test_convert_hdf5.py": 45, "test_hostile_inputs.py": 40,
    "test_multiply_jobs.py": 35, "test_convert.py": 25, "test_trim.py": 20, "test_cli_output.py": 20,
    "test_scale_out.py": 110, "test_metaworld.py": 75, "test_rerender.py": 70, "test_replay.py": 65,
    "test_task_so101.py": 60, "test_reliability.py": 50, "test_viewer.py": 45, "test_export.py": 45,
    "test_export_watchdog.py": 40, "test_edit_crash.py": 40, "test_policy_loop.py": 40, "test_daemon.py": 40,
    "test_recorder.py": 40, "test_docs.py": 35, "test_task_aloha.py": 30, "test_task_aloha_insertion.py": 30,
    "test_scheduling.py": 25, "test_export_child.py": 25, "test_task_fetch.py": 25, "test_depth.py": 25,
    "test_sampling.py": 15, "test_subtask_labels.py": 15, "test_prune.py": 15, "test_randomization.py": 10,
    "test_edit.py": 10, "test_multi_store.py": 10, "test_plugins.py": 10, "test_pipeline.py": 10,
    "test_crash.py": 10, "test_instructions.py": 10, "test_kept_failures.py": 10, "test_full_disk.py": 10,
    "test_export_stats.py": 10,
}


def pytest_collection_modifyitems(config, items) -> None:
    """Heaviest test files first (longest-processing-time-first scheduling over the xdist workers); the
    order of tests inside a file is kept."""
    items.sort(key=lambda item: -FILE_SECONDS.get(item.path.name, 5))  # sort is stable
