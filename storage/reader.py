"""The read side of a job store: one opener for everything that reads a store without writing it.

In the spirit of zarr's ``Store`` with ``read_only``: :func:`open_store_reader` returns a :class:`StoreView`
whose catalog is an SQLite ``mode=ro`` connection (no schema script; every write raises
:class:`ReadOnlyError`) and whose staging area creates nothing. It takes no lock and works while a writer
runs (WAL: readers never block the writer). Export and verify also flip attempt states (``exported``,
``quarantined``) of an existing store, possibly while a generate job holds the writer lock: they open it
with :func:`open_store_updater` (the same view; its catalog may update states but never creates a store or a
schema). Generating is the writer's alone: ``storage/store.py`` ``JobStore.open`` behind the store lock.
"""

from __future__ import annotations

from pathlib import Path

from demoforge.storage.catalog import CATALOG_FILE, Catalog, check_catalog_file
from demoforge.storage.errors import ReadOnlyError, StoreError
from demoforge.storage.paths import path_problem, short_path
from demoforge.storage.schema import Fingerprint
from demoforge.storage.staging import StagingLayout, StagingStore

__all__ = ["ReadOnlyError", "StoreView", "open_store_reader", "open_store_updater"]


class StoreView:
    """An opened store: its catalog, job fingerprint, episode layout and staged episodes.

    ``fingerprint``, ``layout`` and ``staging`` are None until a job is bound to the store (a reader may
    open a store a writer has only just created); :meth:`require_job` raises instead.
    """

    def __init__(self, path: Path, catalog: Catalog) -> None:
        self.path = path
        self.catalog = catalog
        self._fingerprint: Fingerprint | None = None
        self._staging: StagingStore | None = None

    @property
    def read_only(self) -> bool:
        return self.catalog.read_only

    @property
    def fingerprint(self) -> Fingerprint | None:
        if self._fingerprint is None:  # re-read until a writer binds a job; fixed for life after that
            self._fingerprint = self.catalog.fingerprint()
        return self._fingerprint

    @property
    def layout(self) -> StagingLayout | None:
        fingerprint = self.fingerprint
        return None if fingerprint is None else StagingLayout.from_fingerprint(fingerprint)

    @property
    def staging(self) -> StagingStore | None:
        if self._staging is None and self.layout is not None:
            self._staging = StagingStore(self.path, self.layout, read_only=True)
        return self._staging

    def require_job(self) -> tuple[Fingerprint, StagingStore]:
        """The job and its staged episodes, or a StoreError when nothing was ever generated here."""
        fingerprint, staging = self.fingerprint, self.staging
        if fingerprint is None or staging is None:
            raise StoreError(f"{short_path(self.path)} holds no job yet: nothing was ever generated there")
        return fingerprint, staging

    def close(self) -> None:
        self.catalog.close()

    def __enter__(self) -> StoreView:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _open(path: Path | str, read_only: bool) -> StoreView:
    path = Path(path)
    problem = path_problem(path)
    if problem:
        raise StoreError(f"{short_path(path)} is not a demoforge store: the path {problem}")
    if not (path / CATALOG_FILE).is_file():
        raise StoreError(f"{short_path(path)} is not a demoforge store (no {CATALOG_FILE})")
    check_catalog_file(path)
    return StoreView(path, Catalog.open_read_only(path) if read_only else Catalog.open_existing(path))


def open_store_reader(path: Path | str) -> StoreView:
    """Open an existing store to read it (status, inspect, sampling, tools); StoreError if it is not one."""
    return _open(path, read_only=True)


def open_store_updater(path: Path | str) -> StoreView:
    """Open an existing store to read it and flip attempt states (export: ``exported``; verify and export:
    ``quarantined``). Safe beside a running writer: each flip is one short SQLite transaction."""
    return _open(path, read_only=False)
