"""SIGKILL `demoforge edit` (in place, and split) and `demoforge merge` at random moments: every dataset is
always either its old version or the complete new one (checksums, validate, LeRobotDataset), never a mix, and
the same command run again finishes the work or reports it done."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

import toy_tasks  # noqa: F401
from demoforge.storage.lerobot.edit import ALREADY, WRITTEN, edit_dataset, merge_datasets
from demoforge.storage.lerobot.edit_selection import parse_split
from demoforge.storage.lerobot.export import export_stores
from demoforge.storage.lerobot.publish import unfinished_leftovers
from edit_helpers import copy_dataset, episodes_meta, toy_store, violations
from helpers import cli_env, demoforge_argv, kill_once_started

pytestmark = pytest.mark.slow
KILLS_PER_OPERATION = 2


def moments(rng: random.Random, span_s: float) -> list[float]:
    """When to kill, after the command starts writing: one moment in each part of its run (early, late), so
    kills land while files are written and around the publishing rename and link swap."""
    step = span_s / KILLS_PER_OPERATION
    return [rng.uniform(k * step, (k + 1) * step) for k in range(KILLS_PER_OPERATION)]


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    root = tmp_path_factory.mktemp("edit-crash")
    out = root / "dataset"
    export_stores([toy_store(root / "store", 8)], out)
    return out


def kill_while_writing(argv: list[str], watch: list[Path], delay_s: float) -> bool:
    """Run ``argv`` with a pause at each step of publishing, wait until it starts writing (a ``*.partial``
    version or a new ``.versions`` folder appears under ``watch``), let it work ``delay_s`` more, SIGKILL it.
    True when the kill landed (False: it had finished)."""
    before = {p for w in watch for p in w.parent.glob(f"{w.name}*")}

    def writing() -> bool:
        now = {p for w in watch for p in w.parent.glob(f"{w.name}*")}
        return bool(now - before) or any(w.is_dir() and any(w.glob("*.partial")) for w in watch)

    return kill_once_started(argv, writing, delay_s, cli_env(DEMOFORGE_EXPORT_PAUSE="0.3"))


def published(path: Path) -> int | None:
    """Episodes of the dataset published at ``path`` (None: nothing published there)."""
    return len(episodes_meta(path)) if path.is_symlink() else None


def test_kills_during_an_edit_in_place_leave_the_old_or_the_new_version(dataset, tmp_path):
    rng = random.Random(22)
    target = copy_dataset(dataset, tmp_path)
    problems: list[str] = []
    seen = set()
    for delay in moments(rng, 2.2):
        kill_while_writing(demoforge_argv("edit", str(target), "--delete", "1,3-4"), [Path(f"{target}.versions")],
                           delay)
        count = published(target)
        seen.add(count)
        if count not in (8, 5):
            problems.append(f"after a kill the dataset holds {count} episodes (8 or 5 expected)")
        problems += violations(target)
    final = edit_dataset(target, delete="1,3-4")  # finishes, or reports that a killed run had finished
    assert final.outputs[0].status in (WRITTEN, ALREADY)
    assert published(target) == 5 and not unfinished_leftovers(Path(f"{target}.versions"))
    assert problems + violations(target) == []
    assert seen <= {8, 5}


def test_kills_during_a_split_leave_each_part_absent_or_complete(dataset, tmp_path):
    rng = random.Random(7)
    parts = tmp_path / "parts"
    problems: list[str] = []
    argv = demoforge_argv("edit", str(dataset), "--split", "train=0.75,val=0.25", "--seed", "1", "--out-root",
                          str(parts))
    for delay in moments(rng, 4.0):
        kill_while_writing(argv, [parts / "train.versions", parts / "val.versions"], delay)
        for name, size in (("train", 6), ("val", 2)):
            count = published(parts / name)
            if count not in (None, size):
                problems.append(f"after a kill {name} holds {count} episodes")
            if count is not None:
                problems += [f"{name}: {p}" for p in violations(parts / name)]
    final = edit_dataset(dataset, split=parse_split("train=0.75,val=0.25"), seed=1, out_root=parts)
    assert {o.status for o in final.outputs} <= {WRITTEN, ALREADY}
    assert [published(parts / n) for n in ("train", "val")] == [6, 2]
    assert problems + violations(parts / "train") + violations(parts / "val") == []


def test_kills_during_a_merge_leave_nothing_or_the_whole_dataset(dataset, tmp_path):
    rng = random.Random(3)
    half = edit_dataset(dataset, split=parse_split("a=0.5,b=0.5"), out_root=tmp_path / "halves")
    assert [o.episodes for o in half.outputs] == [4, 4]
    out = tmp_path / "merged"
    problems: list[str] = []
    argv = demoforge_argv("merge", str(tmp_path / "halves" / "a"), str(tmp_path / "halves" / "b"), "--out", str(out))
    for delay in moments(rng, 2.2):
        kill_while_writing(argv, [Path(f"{out}.versions")], delay)
        count = published(out)
        if count not in (None, 8):
            problems.append(f"after a kill the merge holds {count} episodes")
        if count is not None:
            problems += violations(out)
    final = merge_datasets([tmp_path / "halves" / "a", tmp_path / "halves" / "b"], out)
    assert final.outputs[0].status in (WRITTEN, ALREADY) and published(out) == 8
    assert problems + violations(out) == []
