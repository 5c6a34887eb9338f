"""Several jobs, one dataset: `demoforge export --store A --store B --out DS`."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from demoforge.pipeline.job import JobSpec, VideoSettings
from demoforge.pipeline.runner import run_job
from demoforge.pipeline.tasks.fetch_pick_place import instruction
from demoforge.storage.lerobot.format import MARKER, read_sidecar
from demoforge.storage.lerobot.validate import validate_dataset
from demoforge.storage.store import open_store
from helpers import run_cli

pytestmark = pytest.mark.slow


def fetch(store: Path, episodes: int, cycles: int, image_size: int = 64) -> None:
    report = run_job(JobSpec(task="fetch-pick-place", episodes=episodes, video=VideoSettings(codec="h264"),
                             task_options={"cycles": cycles, "image_size": image_size}), store)
    assert report.complete


def versions(dataset: Path) -> list[str]:
    return sorted(p.name for p in Path(f"{dataset}.versions").iterdir() if p.is_dir())


@pytest.fixture(scope="module")
def two_jobs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    root = tmp_path_factory.mktemp("multi")
    one, two = root / "one-cycle", root / "two-cycles"
    fetch(one, 2, cycles=1)
    fetch(two, 1, cycles=2)
    return root, one, two


def test_two_stores_become_one_dataset_with_a_task_per_job(two_jobs: tuple[Path, Path, Path]) -> None:
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    root, one, two = two_jobs
    dataset = root / "both"
    done = run_cli("export", "--store", str(one), "--store", str(two), "--out", str(dataset))
    assert done.returncode == 0, done.stderr
    assert "exported 3 episode(s)" in done.stdout

    ds = LeRobotDataset("demoforge/fetch-pick-place", root=dataset, video_backend="pyav")
    assert ds.meta.total_episodes == 3 and len(ds.meta.tasks) == 2
    tasks = {ds.meta.tasks.iloc[i].name: int(ds.meta.tasks.iloc[i]["task_index"]) for i in range(len(ds.meta.tasks))}
    assert set(tasks) == {instruction(1), instruction(2)}
    wanted = [tasks[instruction(1)], tasks[instruction(1)], tasks[instruction(2)]]
    for episode, task_index in enumerate(wanted):
        first = int(ds.meta.episodes[episode]["dataset_from_index"])
        sample = ds[first]
        assert int(sample["task_index"]) == task_index and int(sample["episode_index"]) == episode
        assert sample["task"] == (instruction(1) if episode < 2 else instruction(2))

    sidecar = read_sidecar(dataset)
    ids = {}
    for store in (one, two):
        with open_store(store) as view:
            ids[store] = view.store_id()
    assert ids[one] and ids[two] and ids[one] != ids[two]
    assert [r["store_id"] for r in sidecar] == [ids[one], ids[one], ids[two]]
    assert [r["task_options"]["cycles"] for r in sidecar] == [1, 1, 2]
    assert [r["staging_episode_id"] for r in sidecar] == ["ep00000000-a00", "ep00000001-a00", "ep00000000-a00"]

    valid = validate_dataset(dataset)  # in process: the validate command itself is tested in test_export.py
    assert valid.status == 0, valid.to_json()

    from demoforge.storage.sampling import SegmentWindowSampler

    sampler = SegmentWindowSampler(dataset, mode="boundary", chunk_size=4, num_samples=16, seed=0)
    drawn = list(sampler)
    assert len(drawn) == 16 and all(0 <= i < ds.meta.total_frames for i in drawn)

    # A later export adds exactly what is new, whichever store it comes from; nothing twice.
    fetch(one, 3, cycles=1)
    again = run_cli("export", "--store", str(one), "--store", str(two), "--out", str(dataset))
    assert again.returncode == 0, again.stderr
    assert "exported 1 episode(s)" in again.stdout and "now holds 4 episode(s)" in again.stdout
    sidecar = read_sidecar(dataset)
    assert [(r["store_id"], r["staging_episode_id"]) for r in sidecar][-1] == (ids[one], "ep00000002-a00")
    assert len({(r["store_id"], r["staging_episode_id"]) for r in sidecar}) == 4
    nothing = run_cli("export", "--store", str(two), "--store", str(one), "--out", str(dataset))
    assert nothing.returncode == 0 and "nothing new to export" in nothing.stdout


def test_a_store_with_other_features_is_refused_naming_the_difference(two_jobs: tuple[Path, Path, Path],
                                                                         tmp_path: Path) -> None:
    root, one, _two = two_jobs
    dataset = tmp_path / "dataset"
    assert run_cli("export", "--store", str(one), "--out", str(dataset)).returncode == 0
    published = os.readlink(dataset)
    bigger = tmp_path / "bigger"
    fetch(bigger, 1, cycles=1, image_size=96)

    refused = run_cli("export", "--store", str(bigger), "--out", str(dataset))
    assert refused.returncode == 2
    assert "observation.images.front" in refused.stderr and "64x64" in refused.stderr and "96x96" in refused.stderr
    assert "Traceback" not in refused.stderr
    assert os.readlink(dataset) == published and versions(dataset) == [Path(published).name]

    # The same check among the stores of one export: nothing is written to a new dataset either.
    fresh = tmp_path / "fresh"
    mixed = run_cli("export", "--store", str(one), "--store", str(bigger), "--out", str(fresh))
    assert mixed.returncode == 2 and "observation.images.front" in mixed.stderr
    assert not fresh.exists()

    twice = run_cli("export", "--store", str(one), "--store", str(one), "--out", str(fresh))
    assert twice.returncode == 2 and "same store" in twice.stderr


def test_a_dataset_from_before_store_ids_keeps_exporting_exactly_once(tmp_path: Path) -> None:
    """Markers written before multi-store datasets name no store: the store that exported them keeps
    adding only its new episodes."""
    store, dataset = tmp_path / "store", tmp_path / "dataset"
    fetch(store, 1, cycles=1)
    assert run_cli("export", "--store", str(store), "--out", str(dataset)).returncode == 0
    marker_path = dataset / MARKER
    marker = json.loads(marker_path.read_text())
    for entry in marker["episodes"]:
        entry.pop("store_id")
    data = json.dumps(marker)
    marker_path.unlink()  # a hard link shared with nothing else here, but never write through one
    marker_path.write_text(data)

    fetch(store, 2, cycles=1)
    done = run_cli("export", "--store", str(store), "--out", str(dataset))
    assert done.returncode == 0, done.stderr
    assert "exported 1 episode(s)" in done.stdout and "now holds 2 episode(s)" in done.stdout
