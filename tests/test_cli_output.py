"""What a person sees from the command line, beyond each command's own work: the task listing at 80 columns,
`demoforge` alone and `--version`, a closed output pipe, a quiet exit after offscreen rendering, and replay of
a pruned store."""

from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
from pathlib import Path

import pytest

from demoforge.pipeline.cli.tasks import short_description
from helpers import cli_env, demoforge_argv, run_cli


# ------------------------------------------------------------------------------------------ the task list
def _listing(columns: int) -> list[str]:
    shown = run_cli("tasks", COLUMNS=str(columns))
    assert shown.returncode == 0, shown.stderr
    return shown.stdout.splitlines()


def test_the_task_list_fits_80_columns_whole_words_and_suites_apart() -> None:
    rows = json.loads(run_cli("tasks", "--json").stdout)
    suites = [r for r in rows if r["suite"]]
    assert {r["name"] for r in suites} >= {"metaworld-mt10", "metaworld-very-hard"}
    assert all(not r["suite"] for r in rows if r["name"] == "fetch-pick-place")
    for columns in (80, 140, 50):
        lines = _listing(columns)
        assert all(len(line) <= columns for line in lines), [line for line in lines if len(line) > columns]
        assert all(line == line.rstrip() for line in lines), "a line ends in spaces"
        text = " ".join(" ".join(lines).split())
        for row in rows:  # every name whole at a line's start, and its description in whole words, in order
            assert any(line.split(" ", 1)[0] == row["name"] for line in lines), (columns, row["name"])
            assert " ".join(short_description(row).split()) in text, (columns, row["name"])
        heading = next(i for i, line in enumerate(lines) if line.startswith("suites:"))
        starts = {line.split(" ", 1)[0]: i for i, line in enumerate(lines) if line and not line.startswith(" ")}
        assert all(starts[r["name"]] > heading for r in suites)
        assert all(starts[r["name"]] < heading for r in rows if not r["suite"])
    at_80 = _listing(80)
    fetch = next(line for line in at_80 if line.startswith("fetch-pick-place "))
    assert fetch.split() == ["fetch-pick-place", "25", "front", "224x224", "(4,)"]  # camera and action kept
    assert "Reach a goal position" in " ".join(at_80)
    wide = _listing(140)
    assert next(line for line in wide if line.startswith("fetch-pick-place ")).split()[5] == "Fetch"  # beside it
    assert "segments" in _listing(220)[0].split()  # a wide terminal shows more
    suite = run_cli("tasks", "metaworld-very-hard")
    assert "suite of 5 tasks" in suite.stdout and "metaworld-stick-pull-v3" in suite.stdout


# ---------------------------------------------------------------------------------- the program itself
def test_demoforge_alone_lists_the_commands_and_version_is_the_packages() -> None:
    bare = run_cli()
    assert bare.returncode == 0, bare.stderr
    for command in ("tasks", "generate", "export", "view", "replay", "daemon"):
        assert f"\n    {command} " in bare.stdout, command
    version = run_cli("--version")
    assert (version.returncode, version.stdout) == (0, f"demoforge {importlib.metadata.version('demoforge')}\n")
    assert "--version" in run_cli("--help").stdout


# argparse ignores a failed write of its help (unbuffered, as the tests run: 0); a buffered one fails at the flush.
@pytest.mark.parametrize("args, statuses", [(("tasks", "--json"), {141}), (("--version",), {141}),
                                            (("tasks", "fetch-pick-place"), {141}),  # printed by rich
                                            (("--help",), {0, 141})])
def test_a_closed_output_pipe_ends_quietly_as_a_shell_tool_does(args: tuple[str, ...], statuses: set[int]) -> None:
    # The reader is gone before the command starts (as `| head -1` is after its line): every write fails.
    read, write = os.pipe()
    os.close(read)
    try:
        done = subprocess.run(demoforge_argv(*args), stdout=write, stderr=subprocess.PIPE, text=True,
                              env=cli_env(), stdin=subprocess.DEVNULL, timeout=120)
    finally:
        os.close(write)
    assert done.returncode in statuses, done.stderr  # 141 = 128 + SIGPIPE, what `yes | head -1` gives yes
    assert done.stderr == ""


def test_a_broken_pipe_that_is_not_the_output_is_still_an_internal_error(monkeypatch, capsys) -> None:
    from demoforge.pipeline import cli
    from demoforge.pipeline.cli import tasks

    def encoder_gone(_args: object) -> int:
        raise BrokenPipeError(32, "Broken pipe")  # e.g. a child process's stdin

    monkeypatch.setattr(tasks, "cmd_tasks", encoder_gone)
    assert cli.main(["tasks"]) == 1
    assert "demoforge tasks: internal error: BrokenPipeError" in capsys.readouterr().err


# ----------------------------------------------------------------------------------------- rendering
@pytest.mark.slow
def test_a_rendered_suite_exits_without_gl_teardown_noise() -> None:
    # Each member renders its episode; its GL context is destroyed when the suite moves on or closes, not left
    # for the interpreter's exit after MuJoCo's EGL display is gone (`Exception ignored ... EGL_NOT_INITIALIZED`).
    done = run_cli("run", "--task", "metaworld-very-hard", "--episodes", "1", "--option", "image_size=64",
                   "--option", "antialias=false", "--option", "max_steps=3", "--max-attempts", "1", fresh=True)
    assert done.returncode == 1 and "truncated=5" in done.stdout, done.stderr  # 3 steps: none succeeds
    assert "Exception ignored" not in done.stderr and "Traceback" not in done.stderr, done.stderr[-3000:]


# ------------------------------------------------------------------------------------------------ replay
def test_replay_of_a_pruned_store_points_to_the_dataset(tmp_path: Path) -> None:
    store, dataset = tmp_path / "store", tmp_path / "dataset"
    made = run_cli("generate", "--task", "toy-point", "--codec", "h264", "--option", "steps=8", "--episodes", "2",
                   "--store", str(store), "--export", str(dataset))
    assert made.returncode == 0, made.stderr
    assert run_cli("prune", "--store", str(store), "--exported").returncode == 0
    refused = run_cli("replay", str(store))
    assert refused.returncode == 2 and refused.stdout == "", refused.stdout
    assert refused.stderr.startswith("demoforge replay: error: ") and len(refused.stderr.splitlines()) == 1
    assert "2 committed episode(s) were pruned" in refused.stderr and "demoforge replay DATASET" in refused.stderr
    from_dataset = run_cli("replay", str(dataset), "--json")
    assert from_dataset.returncode == 0 and json.loads(from_dataset.stdout)["summary"]["reproduced"] == 2
