"""SIGKILL `demoforge edit` (in place, and split) and `demoforge merge` at each step of publishing, at the moment
the command's fault hook says it is there (storage/faults.py): every dataset is always either its old version or
the complete new one (checksums, validate, LeRobotDataset), never a mix, and the same command run again finishes
the work or reports it done."""

from __future__ import annotations

from pathlib import Path

import pytest

import toy_tasks  # noqa: F401
from demoforge.storage.lerobot.edit import ALREADY, WRITTEN, edit_dataset, merge_datasets
from demoforge.storage.lerobot.edit_selection import parse_split
from demoforge.storage.lerobot.export import export_stores
from demoforge.storage.lerobot.publish import unfinished_leftovers
from edit_helpers import copy_dataset, episodes_meta, toy_store, violations
from helpers import demoforge_argv, kill_at_step

pytestmark = pytest.mark.slow
#: The steps a new version passes while it is built and published (storage/lerobot/edit.py, publish.py):
#: ``before_publish`` is after the version's rename into place and before the link swap.
STEPS = ("after_videos", "after_data", "before_fsync", "before_publish", "after_publish")


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    root = tmp_path_factory.mktemp("edit-crash")
    out = root / "dataset"
    export_stores([toy_store(root / "store", 8)], out)
    return out


def published(path: Path) -> int | None:
    """Episodes of the dataset published at ``path`` (None: nothing published there)."""
    return len(episodes_meta(path)) if path.is_symlink() else None


def test_kills_during_an_edit_in_place_leave_the_old_or_the_new_version(dataset, tmp_path) -> None:
    target = copy_dataset(dataset, tmp_path)
    argv = demoforge_argv("edit", str(target), "--delete", "1,3-4")
    problems: list[str] = []
    for step in STEPS:
        kill_at_step(argv, step, tmp_path / f"reached-{step}")
        expected = 5 if step == "after_publish" else 8  # the new version once its link is swapped
        if published(target) != expected:
            problems.append(f"killed at {step}: the dataset holds {published(target)} episodes ({expected} expected)")
        problems += [f"killed at {step}: {p}" for p in violations(target)]
    final = edit_dataset(target, delete="1,3-4")  # reports that the killed run had finished
    assert final.outputs[0].status in (WRITTEN, ALREADY)
    assert published(target) == 5 and not unfinished_leftovers(Path(f"{target}.versions"))
    assert problems + violations(target) == []


def test_kills_during_a_split_leave_each_part_absent_or_complete(dataset, tmp_path) -> None:
    """Killed while the first part is built and just after it is published, then (a run that finds the first part
    done goes on with the second) while the second is built and just after it is published."""
    parts = tmp_path / "parts"
    argv = demoforge_argv("edit", str(dataset), "--split", "train=0.75,val=0.25", "--seed", "1", "--out-root",
                          str(parts))
    problems: list[str] = []
    for trial, (step, expected) in enumerate((("after_data#1", [None, None]), ("before_publish#1", [None, None]),
                                              ("after_publish#1", [6, None]), ("before_publish#1", [6, None]),
                                              ("after_publish#1", [6, 2]))):
        kill_at_step(argv, step, tmp_path / f"reached-{trial}")
        counts = [published(parts / name) for name in ("train", "val")]
        if counts != expected:
            problems.append(f"killed at {step}: train and val hold {counts} episodes ({expected} expected)")
        for name, count in zip(("train", "val"), counts):
            if count is not None:
                problems += [f"killed at {step}: {name}: {p}" for p in violations(parts / name)]
    final = edit_dataset(dataset, split=parse_split("train=0.75,val=0.25"), seed=1, out_root=parts)
    assert {o.status for o in final.outputs} <= {WRITTEN, ALREADY}
    assert [published(parts / n) for n in ("train", "val")] == [6, 2]
    assert problems + violations(parts / "train") + violations(parts / "val") == []


def test_kills_during_a_merge_leave_nothing_or_the_whole_dataset(dataset, tmp_path) -> None:
    half = edit_dataset(dataset, split=parse_split("a=0.5,b=0.5"), out_root=tmp_path / "halves")
    assert [o.episodes for o in half.outputs] == [4, 4]
    out = tmp_path / "merged"
    argv = demoforge_argv("merge", str(tmp_path / "halves" / "a"), str(tmp_path / "halves" / "b"), "--out", str(out))
    problems: list[str] = []
    for step in STEPS:
        kill_at_step(argv, step, tmp_path / f"reached-{step}")
        expected = 8 if step == "after_publish" else None
        if published(out) != expected:
            problems.append(f"killed at {step}: the merge holds {published(out)} episodes ({expected} expected)")
    final = merge_datasets([tmp_path / "halves" / "a", tmp_path / "halves" / "b"], out)
    assert final.outputs[0].status in (WRITTEN, ALREADY) and published(out) == 8
    assert problems + violations(out) == []
