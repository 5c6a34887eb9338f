"""The dataset a format's writer reads, opened and held still while it is read."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

from demoforge.storage.convert.report import ConvertError
from demoforge.storage.lerobot.edit_source import DatasetToEdit, EditError, open_dataset
from demoforge.storage.lerobot.publish import lock_exports


@contextlib.contextmanager
def reading(dataset: Path) -> Iterator[DatasetToEdit]:
    """The dataset at ``dataset`` (one that cannot be read is a ConvertError), under its export lock when demoforge
    published it: no export publishes and prunes the version being converted meanwhile."""
    try:
        source = open_dataset(dataset)
    except EditError as exc:
        raise ConvertError(str(exc)) from None
    if source.published is None:
        yield source
        return
    fd = lock_exports(source.published.versions)
    try:
        yield source
    finally:
        os.close(fd)
