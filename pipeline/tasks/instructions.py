"""Instruction paraphrases: each episode says its task (and each segment its sub-task) in words drawn from a list.

``--instructions FILE`` holds a JSON object: ``"task"`` (a list of phrasings of the episode's instruction) and
``"segments"`` (segment name -> a list of phrasings of that segment's instruction); either may be left out.
Each attempt draws one phrasing per key from its seed (its own generator: nothing else the seed draws moves),
so a resumed or replayed episode says the same words. The table is a task option (``instructions``, canonical
JSON), so it is part of the job's fingerprint and of every exported episode's task options. A cheap axis of
diversity: LeRobot's language-conditioned policies see several phrasings of one task.
"""

from __future__ import annotations

import dataclasses
import json
import os
import stat
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

INSTRUCTIONS = "instructions"  # the task option
_SALT = 0x1A57  # the paraphrase draw's own stream
MAX_PHRASINGS = 200
MAX_LENGTH = 500
MAX_TABLE_BYTES = 64 * 1024


class InstructionsError(ValueError):
    """An instructions table that is not what ``--instructions`` expects (the message names where)."""


def read_table_file(path: Path | str) -> str:
    """The text of an instructions file, read at most ``MAX_TABLE_BYTES`` + 1 bytes: a device (``/dev/zero``), a
    pipe or a huge file is refused before it fills memory. Opened without blocking, so a FIFO no one writes to is
    refused too, not waited on."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as exc:
        raise InstructionsError(f"cannot read it: {exc.strerror or exc}") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise InstructionsError("not a regular file (a device, a pipe or a folder); give a JSON file")
    with os.fdopen(fd, "rb") as file:
        try:
            data = file.read(MAX_TABLE_BYTES + 1)
        except OSError as exc:
            raise InstructionsError(f"cannot read it: {exc.strerror or exc}") from None
    if len(data) > MAX_TABLE_BYTES:
        raise InstructionsError(f"the file is larger than {MAX_TABLE_BYTES} bytes, the most a table may hold")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InstructionsError(f"not UTF-8 text ({exc.reason} at byte {exc.start})") from None


def parse_table(text: str, segment_names: Sequence[str] | None = None) -> dict[str, Any]:
    """The checked table of ``text``; segment names are checked against ``segment_names`` when given."""
    if len(text.encode()) > MAX_TABLE_BYTES:
        raise InstructionsError(f"the table is {len(text.encode())} bytes; at most {MAX_TABLE_BYTES}")
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise InstructionsError(f"not JSON: {exc}") from None
    if not isinstance(data, dict) or not set(data) <= {"task", "segments"} or not data:
        raise InstructionsError('expected a JSON object with "task" (a list of strings) and/or "segments" '
                                "(segment name -> a list of strings)")
    table: dict[str, Any] = {}
    if "task" in data:
        table["task"] = _phrasings(data["task"], '"task"')
    if "segments" in data:
        segments = data["segments"]
        if not isinstance(segments, dict) or not segments:
            raise InstructionsError('"segments" must map segment names to lists of strings')
        unknown = [name for name in segments if segment_names is not None and name not in segment_names]
        if unknown:
            raise InstructionsError(f"segment {unknown[0]!r} is not one of the task's: {', '.join(segment_names or ())}")
        table["segments"] = {str(name): _phrasings(value, f'"segments" {name!r}') for name, value in segments.items()}
    return table


def _phrasings(value: object, where: str) -> list[str]:
    if not isinstance(value, list) or not value or len(value) > MAX_PHRASINGS:
        raise InstructionsError(f"{where} must be a list of 1..{MAX_PHRASINGS} strings")
    for item in value:
        if not isinstance(item, str) or not item.strip() or len(item) > MAX_LENGTH:
            raise InstructionsError(f"{where} holds {item!r}: each phrasing is a non-empty string of at most "
                                    f"{MAX_LENGTH} characters")
    return [item.strip() for item in value]


def canonical(table: Mapping[str, Any]) -> str:
    """The option value: the table as canonical JSON (sorted keys), so equal tables fingerprint alike."""
    return json.dumps(table, sort_keys=True, separators=(",", ":"))


class ParaphrasedInstructions(gym.Wrapper):
    """A task env whose episode and segment instructions are drawn from a table at each seeded reset."""

    def __init__(self, env: gym.Env, table: Mapping[str, Any]) -> None:
        super().__init__(env)
        self.table = table
        self._chosen: dict[str, str] = {}

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> Any:
        rng = np.random.default_rng([int(seed or 0) & 0xFFFFFFFFFFFFFFFF, _SALT])
        self._chosen = {}
        if "task" in self.table:
            self._chosen["task"] = self.table["task"][int(rng.integers(len(self.table["task"])))]
        for name, phrasings in sorted(self.table.get("segments", {}).items()):
            self._chosen[f"segment:{name}"] = phrasings[int(rng.integers(len(phrasings)))]
        return self.env.reset(seed=seed, options=options)

    def demo_instruction(self) -> str | None:
        if "task" in self._chosen:
            return self._chosen["task"]
        from demoforge.stages.task_protocol import GivesInstruction, task_capability

        inner = task_capability(self.env, GivesInstruction)
        return inner.demo_instruction() if inner is not None else None

    def create_demo_segments(self) -> Iterator[Any]:
        from demoforge.stages.task_protocol import iter_segments

        for segment in iter_segments(self.env, "?"):  # the executor names the task in any error
            chosen = self._chosen.get(f"segment:{segment.name}")
            yield dataclasses.replace(segment, instruction=chosen) if chosen is not None else segment
