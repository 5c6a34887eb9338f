"""Rejecting episodes from the viewer: the dataset's rejected list (``storage/lerobot/rejected.py``, a file beside the
dataset, never inside it) as the page shows and changes it, in the keys of the version the viewer pinned.

An entry is written with the episode's store and staging episode (from the sidecar) when the dataset records
them, so ``demoforge edit --delete-rejected`` finds the episode whatever its index has become since.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from pathlib import Path

from demoforge.storage.lerobot.rejected import Rejection, read_rejections, rejected_list_path, set_rejected


class RejectionMarks:
    """The rejected episodes of one pinned dataset version; thread-safe (the server handles requests in threads)."""

    def __init__(self, dataset: Path, version: str | None, identities: Mapping[str, tuple[str | None, str | None]]
                 ) -> None:
        self.path = rejected_list_path(dataset)
        self.version = version
        self._identities = dict(identities)  # episode key -> (store id, staging episode id)
        self._lock = threading.Lock()

    def _key_of(self, entry: Rejection) -> str | None:
        if entry.episode_id is not None:
            for key, (store_id, episode_id) in self._identities.items():
                if episode_id == entry.episode_id and store_id == entry.store_id:
                    return key
            return None
        key = str(entry.dataset_index)
        return key if entry.version == self.version and key in self._identities else None

    def keys(self) -> list[str]:
        """Keys of this version's episodes the list names (entries of deleted episodes are not shown)."""
        with self._lock:
            found = {k for e in read_rejections(self.path) if (k := self._key_of(e)) is not None}
        return sorted(found, key=int)

    def set(self, key: str, rejected: bool) -> list[str]:
        """Mark (or unmark) one episode; KeyError for a key not in the version."""
        store_id, episode_id = self._identities[key]
        entry = Rejection(int(key), self.version, store_id if episode_id is not None else None, episode_id)
        with self._lock:
            set_rejected(self.path, entry, rejected)
        return self.keys()
