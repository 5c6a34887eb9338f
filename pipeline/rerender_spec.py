"""What a rerender job re-simulates: a recorded store or dataset, and how many appearance variants of each
episode (the job's fingerprint carries it; pipeline/rerender.py does the work)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

MAX_VARIANTS = 64


@dataclass(frozen=True)
class RerenderSpec:
    """``source``: the recorded store or dataset (resolved path); ``variants``: new episodes per source one."""

    source: str
    variants: int = 1

    def __post_init__(self) -> None:
        if not isinstance(self.variants, int) or isinstance(self.variants, bool) or \
                not 1 <= self.variants <= MAX_VARIANTS:
            raise ValueError(f"--variants must be an integer in 1..{MAX_VARIANTS}, got {self.variants!r}")

    def to_json(self) -> dict[str, Any]:
        return {"source": self.source, "variants": self.variants}

    def locate(self, episode_index: int) -> tuple[int, int]:
        """Job episode ``i`` is variant ``i % variants`` of the source's ``i // variants``-th episode."""
        return divmod(int(episode_index), self.variants)
