"""Task registrations scoped to a block: what tests (and a user trying a task in a session) rely on."""

from __future__ import annotations

import pytest

import toy_tasks
from demoforge.pipeline.tasks.registry import TaskEntry, UnknownTaskError, get_task, registered, task_names


def entry(name: str) -> TaskEntry:
    return TaskEntry(name=name, defaults=toy_tasks.DEFAULTS, describe=toy_tasks.describe,
                     make_env=lambda o: toy_tasks.CameraPointEnv(dict(o)))


def test_a_scoped_task_is_gone_after_its_block_and_can_be_registered_again():
    for _ in range(2):  # the second round is what a second run of a test in one process does
        scoped = entry("toy-scoped")
        with registered(scoped):
            assert get_task("toy-scoped") is scoped and "toy-scoped" in task_names()
        with pytest.raises(UnknownTaskError, match="unknown task 'toy-scoped'"):
            get_task("toy-scoped")


def test_a_failed_registration_in_a_block_leaves_nothing_behind():
    with pytest.raises(ValueError, match="'toy-point' is already registered"):
        with registered(entry("toy-first"), entry("toy-point")):
            pass
    with pytest.raises(UnknownTaskError):
        get_task("toy-first")
    assert get_task("toy-point").make_env is not None  # the module-level registration is untouched


def test_the_register_task_fixture_scopes_to_one_test(register_task):
    register_task(entry("toy-fixture"))
    assert "toy-fixture" in task_names()


def test_the_fixture_s_task_is_gone_in_the_next_test():
    assert "toy-fixture" not in task_names()
