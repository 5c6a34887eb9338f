"""Fault-injection delays for tests and tools/ harnesses: widen a stage's window so a kill can land in it.

Read once from ``DEMOFORGE_STAGE_DELAY`` (e.g. ``"write:0.02,commit:0.3"``: seconds to sleep per frame in
the write stage, and between the fsync and the catalog flip of every commit). Unset in normal runs.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping

STAGES = ("step", "encode", "write", "commit")


def stage_delays(spec: str | None = None) -> Mapping[str, float]:
    spec = os.environ.get("DEMOFORGE_STAGE_DELAY", "") if spec is None else spec
    delays: dict[str, float] = {}
    for item in filter(None, (part.strip() for part in spec.split(","))):
        stage, _, seconds = item.partition(":")
        if stage not in STAGES:
            raise ValueError(f"DEMOFORGE_STAGE_DELAY names unknown stage {stage!r}; stages: {', '.join(STAGES)}")
        try:
            delays[stage] = float(seconds)
        except ValueError:
            raise ValueError(f"DEMOFORGE_STAGE_DELAY: {item!r} is not STAGE:SECONDS") from None
    return delays


def export_pause() -> Callable[[str], None] | None:
    """``DEMOFORGE_EXPORT_PAUSE=seconds`` sleeps at each step of an export, so a kill can land inside it."""
    raw = os.environ.get("DEMOFORGE_EXPORT_PAUSE")
    if not raw:
        return None
    seconds = float(raw)
    return lambda _step: time.sleep(seconds)
