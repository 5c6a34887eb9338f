"""Errors of the store as a whole (storage/store.py), shared by its catalog and staging area."""

from __future__ import annotations


class StoreError(RuntimeError):
    """The store directory cannot be used (not writable, not a directory, not a demoforge store)."""


class StoreLockedError(StoreError):
    """Another process is writing to this store."""


class ReadOnlyError(StoreError):
    """A write was attempted through a store or catalog opened for reading."""

    def __init__(self, operation: str, where: object) -> None:
        super().__init__(f"cannot {operation}: {where} is open read-only (writes go through a store opened "
                         "with open_store(path, 'w'), or 'r+' for state changes)")
        self.operation = operation
        self.where = where
