"""Making writes survive a power cut, not only a killed process: fsync a file, a folder, create folders.

A killed process loses nothing the kernel already holds; a power cut (or a kernel panic) loses every write and
every name that was not fsynced. POSIX makes a new name (a created file or folder, a rename, an unlink)
durable only once its *folder* is fsynced; a file's fsync makes its data durable, not its name. Every
durable path of a store and a dataset goes through these (tools/powercut_fs.py tests it: a file system that
forgets whatever was not fsynced).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path


def fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def make_dirs(path: Path) -> list[Path]:
    """``mkdir -p`` whose folders survive a power cut: each folder it creates is fsynced into its parent
    (without that, a store's committed episodes can vanish with the folder that holds them). Returns the
    folders created, outermost first."""
    path = Path(path)
    missing: list[Path] = []
    p = path
    while not p.is_dir():
        missing.append(p)
        if p.parent == p:
            break
        p = p.parent
    created: list[Path] = []
    for folder in reversed(missing):
        try:
            folder.mkdir()
        except FileExistsError:
            if not folder.is_dir():
                raise
            continue  # another process made it: its creator fsyncs the parent
        fsync_dir(folder.parent)
        created.append(folder)
    return created


class FsyncPool:
    """Threads that fsync many files at once: the file system folds concurrent fsyncs into few journal commits
    (measured 5-15x faster for an episode's files than one after another, docs/scale-out.md). Owned by what
    writes (a store's staging area, a dataset version being published) and closed with it; the threads start
    at the first batch."""

    def __init__(self, threads: int = 16) -> None:
        self._threads = threads
        self._executor: ThreadPoolExecutor | None = None
        self._closed = False

    def fsync_all(self, files: Iterable[Path], dirs: Iterable[Path] = ()) -> None:
        """fsync the files, then the folders, concurrently; every one has returned before this does (the
        first failure is raised)."""
        if self._closed:
            raise RuntimeError("the fsync pool was closed")
        if self._executor is None:
            self._executor = ThreadPoolExecutor(self._threads, thread_name_prefix="fsync")
        list(self._executor.map(fsync_file, files))
        list(self._executor.map(fsync_dir, dirs))

    def close(self) -> None:
        self._closed = True
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None

    def __enter__(self) -> FsyncPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
