"""The dataset a format's writer reads, held still while it is read."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

from demoforge.storage.lerobot.edit_source import DatasetToEdit
from demoforge.storage.lerobot.publish import lock_exports


@contextlib.contextmanager
def reading(source: DatasetToEdit) -> Iterator[None]:
    """The dataset's export lock while it is read (a demoforge dataset): no export publishes and prunes the
    version being converted meanwhile."""
    if source.published is None:
        yield
        return
    fd = lock_exports(source.published.versions)
    try:
        yield
    finally:
        os.close(fd)
