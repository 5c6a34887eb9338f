"""One rule for every command that writes a dataset or a store from others (``export``, ``edit``, ``merge``,
``rerender``, ``repair``): an output is never an input, never inside one, and never holds one.

A command that broke it wrote into its own source (a version of the source dataset with every episode twice, a
repaired copy inside the broken recording) or, holding its source, would publish a dataset around it. Paths are
compared as the file system sees them: a dataset is a link to ``NAME.versions/vNNNNNN``, so each path counts for
where it is, where its links lead, and its ``NAME.versions`` folder; a path that does not exist yet counts for
where it would be created.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from demoforge.storage.lerobot.publish import versions_dir
from demoforge.storage.paths import short_path


def _places(path: Path | str) -> set[Path]:
    """Where a store or dataset at ``path`` lives: the path itself (its folder's links resolved), what it resolves
    to, and a dataset's ``NAME.versions`` beside it."""
    absolute = Path(os.path.abspath(path))
    if "\x00" in str(absolute):  # no file system has it, so it overlaps nothing; the path checks refuse it
        return {absolute}
    located = Path(os.path.realpath(absolute.parent)) / absolute.name
    return {located, Path(os.path.realpath(absolute)), versions_dir(located)}


def output_overlap(out: Path | str, inputs: Mapping[str, Path | str]) -> str | None:
    """Why ``out`` cannot be written from ``inputs`` (what each is, for the message: ``{"the source": path}``),
    e.g. "'a/b' is inside the source 'a'"; None when it is apart from all of them."""
    mine = _places(out)
    for label, source in inputs.items():
        theirs = _places(source)
        named = f"{label} {short_path(source)}"
        if mine & theirs:
            return f"{short_path(out)} is {named}"
        if any(a.is_relative_to(b) for a in mine for b in theirs):
            return f"{short_path(out)} is inside {named}"
        if any(b.is_relative_to(a) for a in mine for b in theirs):
            return f"{short_path(out)} holds {named}"
    return None
