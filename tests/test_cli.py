"""The `tasks` and `run` commands as a user runs them."""

import json
import re

import pytest

from helpers import packages_imported_by, run_cli


def test_tasks_lists_both_builtin_tasks_with_their_shapes():
    result = run_cli("tasks", "--json")
    assert result.returncode == 0, result.stderr
    tasks = {t["name"]: t for t in json.loads(result.stdout)}
    assert tasks["fetch-pick-place"]["cameras"] == {"front": [224, 224, 3]}
    assert tasks["fetch-pick-place"]["action_shape"] == [4]
    assert tasks["fetch-pick-place"]["segments"][:5] == ["reach_0", "descend_0", "grasp_0", "carry_0", "release_0"]
    assert tasks["aloha-transfer-cube"]["cameras"] == {"top": [224, 224, 3]}
    assert tasks["aloha-transfer-cube"]["action_shape"] == [14]
    # The table a person reads: one row per task with its rate, cameras and action shape; columns are
    # separated by at least two spaces (a camera cell has one inside).
    human = run_cli("tasks", COLUMNS="400")
    assert human.returncode == 0, human.stderr
    rows = {cells[0]: cells[1:4] for line in human.stdout.splitlines()
            if len(cells := re.split(r"\s{2,}", line.strip())) > 4}
    assert rows["fetch-pick-place"] == ["25", "front 224x224", "(4,)"]
    assert rows["aloha-transfer-cube"] == ["50", "top 224x224", "(14,)"]
    assert rows["toy-point"] == ["10", "cam 32x32", "(1,)"]  # a plugin task (DEMOFORGE_TASK_MODULES) is listed too


@pytest.mark.slow
def test_run_prints_each_episodes_segments():
    result = run_cli("run", "--task", "fetch-pick-place", "--episodes", "2", "--option", "cycles=1",
                     "--option", "image_size=64", fresh=True)  # a fresh interpreter: its imports print here
    assert result.returncode == 0, result.stderr
    assert "reach_0[" in result.stdout and "release_0[" in result.stdout
    assert "succeeded=2" in result.stdout and "nothing was stored" in result.stdout
    # gymnasium-robotics' import-time notice about its Adroit envs (none of which a task uses) is not shown.
    assert "Adroit" not in result.stderr and "Adroit" not in result.stdout, result.stderr


def test_a_command_forked_by_the_tests_answers_as_one_started_afresh(tmp_path, monkeypatch):
    # run_cli forks commands from a server that has imported the CLI (tests/helpers.py): the same exit status,
    # output, working directory and environment as a fresh interpreter, for a success and for a refusal.
    forked = {}
    for args in (("tasks",), ("status", "--store", "not-here"), ("run", "--task", "no-such-task")):
        forked[args], fresh = run_cli(*args, COLUMNS="123"), run_cli(*args, COLUMNS="123", fresh=True)
        assert (forked[args].returncode, forked[args].stdout, forked[args].stderr) == \
            (fresh.returncode, fresh.stdout, fresh.stderr)
    unknown = forked[("run", "--task", "no-such-task")]
    assert unknown.returncode == 2 and "unknown task 'no-such-task'" in unknown.stderr
    assert run_cli("tasks", COLUMNS="60").stdout != forked[("tasks",)].stdout  # the environment reached it
    monkeypatch.chdir(tmp_path)  # after the server started elsewhere
    done = run_cli("generate", "--task", "toy-point", "--episodes", "1", "--store", "relative")
    assert done.returncode == 0 and (tmp_path / "relative" / "catalog.sqlite").exists(), done.stderr  # and the cwd


def test_unknown_task_and_bad_option_are_clear_errors():
    unknown = run_cli("run", "--task", "no-such-task", "--episodes", "1")
    assert unknown.returncode == 2 and "unknown task 'no-such-task'" in unknown.stderr
    bad = run_cli("run", "--task", "fetch-pick-place", "--episodes", "1", "--option", "cycle=2")
    assert bad.returncode == 2 and "has no option 'cycle'" in bad.stderr


def test_idle_encoder_priority_without_the_encoder_process_is_refused_before_anything_is_made(tmp_path):
    store = tmp_path / "store"
    refused = run_cli("generate", "--task", "toy-point", "--episodes", "1", "--store", str(store),
                      "--encoder-process", "off", "--encoder-priority", "idle")
    assert refused.returncode == 2 and "the idle encoder priority needs the encoder process" in refused.stderr
    assert "Traceback" not in refused.stderr and not store.exists()


def test_every_command_and_option_is_documented_with_an_example():
    """`demoforge --help` and each command's help end with an example; every option says what it does."""
    import argparse

    from demoforge.pipeline.cli import build_parser

    parser = build_parser()
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    assert parser.format_help().rstrip().splitlines()[-1].startswith("run `demoforge COMMAND --help`")
    for name, command in sub.choices.items():
        text = command.format_help().rstrip()
        last = text.splitlines()[-1].strip()
        assert last.startswith(f"demoforge {name}"), (name, last)
        assert text.splitlines()[-2].strip() == "example:", name
        for action in command._actions:
            if isinstance(action, argparse._HelpAction):
                continue
            assert action.help, f"demoforge {name} {action.option_strings or action.dest} has no help text"
            if action.option_strings and not action.required:
                shown_help = command._get_formatter()._get_help_string(action) or ""
                # the default is named once, in one style: "(default: VALUE)", never Python's None/False/[]
                assert len(re.findall(r"\bdefault: ", shown_help, re.IGNORECASE)) == 1, (name, action.dest, shown_help)
                assert "(default: " in shown_help or "; default: " in shown_help, (name, action.dest, shown_help)
                assert not re.search(r"default: (None|False|True|\[\])|\(None: |Default: ", shown_help), (
                    name, action.dest, shown_help)
    shown = run_cli("--help")
    assert shown.returncode == 0 and "example:" in shown.stdout


def test_the_command_line_starts_without_an_event_loop_library_or_lerobot():
    # Every command pays for what `demoforge.pipeline.cli` imports before it parses its arguments (the suite
    # starts about 400 of them); anyio is imported by the commands that run a pipeline, when they run it.
    assert packages_imported_by("demoforge.pipeline.cli", {"anyio", "torch", "lerobot", "pandas"}) == []
