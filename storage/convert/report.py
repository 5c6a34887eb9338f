"""What a conversion says it did, and its error type."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path


class ConvertError(ValueError):
    """A conversion that cannot be made (bad output, a dataset the format cannot hold): nothing was written."""


@dataclass(frozen=True)
class ConvertReport:
    """``out``: where the conversion was published; ``bytes``: its size on disk; ``notes``: what the format could
    not carry, or carried differently, one line each."""

    format: str
    episodes: int
    frames: int
    out: Path | None = None
    bytes: int = 0
    seconds: float = 0.0
    notes: tuple[str, ...] = ()

    def published(self, out: Path, seconds: float, is_file: bool) -> ConvertReport:
        size = out.stat().st_size if is_file else sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
        return dataclasses.replace(self, out=out, bytes=size, seconds=seconds)
