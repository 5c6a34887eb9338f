"""Instruction paraphrases (``--instructions FILE``): each episode's task and sub-task phrasings drawn from its
seed, recorded where LeRobot reads them, and refused with the place named when the table is wrong."""

from __future__ import annotations

import json
from typing import Any

import pyarrow.parquet as pq
import pytest

from demoforge.storage.lerobot.format import read_sidecar
from helpers import run_cli

PUSH = ("--task", "metaworld-push-v3", "--option", "camera=none")
TASK = ["push the puck to the goal", "slide the puck onto the target", "move the puck to the marked spot"]
TABLE: dict[str, Any] = {"task": TASK, "segments": {"push": ["push it home", "shove the puck to the goal"]}}


def test_each_episode_says_its_task_in_words_drawn_from_its_seed(tmp_path) -> None:
    table = tmp_path / "words.json"
    table.write_text(json.dumps(TABLE))
    runs = []
    for name in ("a", "b"):
        dataset = tmp_path / f"{name}-d"
        done = run_cli("generate", *PUSH, "--episodes", "4", "--instructions", str(table),
                       "--store", str(tmp_path / name), "--export", str(dataset))
        assert done.returncode == 0, done.stderr
        runs.append(read_sidecar(dataset))
    first, again = runs
    said = [r["instruction"] for r in first]
    assert said == [r["instruction"] for r in again]  # the same seeds say the same words
    assert set(said) <= set(TASK) and len(set(said)) > 1
    for record in first:
        pushes = [s for s in record["segments"] if s["name"] == "push"]
        assert pushes and all(s["instruction"] in TABLE["segments"]["push"] for s in pushes)
        others = [s for s in record["segments"] if s["name"] != "push"]
        assert all(s["instruction"] not in TABLE["segments"]["push"] for s in others)
    tasks = pq.read_table(tmp_path / "a-d" / "meta" / "tasks.parquet").to_pandas()
    assert set(tasks.index if "task" not in tasks.columns else tasks["task"]) == set(said)


@pytest.mark.parametrize("content, message", [
    ("not json", "not JSON"),
    (json.dumps({"segments": {"fly": ["take off"]}}), "segment 'fly' is not one of the task's"),
    (json.dumps({"task": []}), '"task" must be a list of 1..200 strings'),
    (json.dumps({"words": ["x"]}), 'expected a JSON object with "task"'),
])
def test_a_bad_table_is_refused_naming_what_is_wrong(tmp_path, content, message) -> None:
    table, store = tmp_path / "words.json", tmp_path / "s"
    table.write_text(content)
    done = run_cli("generate", *PUSH, "--episodes", "1", "--instructions", str(table), "--store", str(store))
    assert done.returncode == 2 and message in done.stderr, done.stderr
    assert "Traceback" not in done.stderr and not store.exists()


def test_the_table_file_is_read_bounded_and_only_from_a_regular_file(tmp_path) -> None:
    """``--instructions /dev/zero`` once read until MemoryError: the reader takes at most the cap + 1 bytes, and a
    device, pipe or folder is refused unread (a FIFO without a writer is not waited on)."""
    import os

    from demoforge.pipeline.tasks.instructions import MAX_TABLE_BYTES, InstructionsError, read_table_file

    huge = tmp_path / "huge.json"
    with huge.open("wb") as f:
        f.truncate(1 << 40)  # sparse: reading it whole would need a terabyte
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for path, message in ((huge, f"larger than {MAX_TABLE_BYTES} bytes"), ("/dev/zero", "not a regular file"),
                          (fifo, "not a regular file"), (tmp_path, "not a regular file"),
                          (tmp_path / "missing.json", "cannot read it")):
        with pytest.raises(InstructionsError, match=message):
            read_table_file(path)
    exact = tmp_path / "exact.json"
    exact.write_text(json.dumps(TABLE).ljust(MAX_TABLE_BYTES))
    assert json.loads(read_table_file(exact)) == TABLE  # the cap itself is allowed
    store = tmp_path / "s"
    done = run_cli("generate", *PUSH, "--episodes", "1", "--instructions", "/dev/zero", "--store", str(store))
    assert done.returncode == 2 and "--instructions /dev/zero: not a regular file" in done.stderr, done.stderr
    assert not store.exists()
