"""What every stage of one job shares besides its streams: the stop flag, the busy meter and the fault delays.

One :class:`StageContext` per job, handed to each stage, instead of the same three loose parameters on every
stage function. It carries no state of its own beyond that: stages still talk only through their streams.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass, field


class BusyMeter:
    """Seconds each stage spent working (not waiting on its streams), by stage key (``step:0``, ``encode:front``,
    ``write``, ``commit``): what the daemon's ``demoforge_stage_busy_seconds`` and the benchmarks report.

    Written from the event loop and from worker threads; each key has one writer, and a reader takes a
    :meth:`snapshot`."""

    def __init__(self) -> None:
        self._seconds: dict[str, float] = {}
        self._lock = threading.Lock()

    def add(self, key: str, seconds: float) -> None:
        with self._lock:
            self._seconds[key] = self._seconds.get(key, 0.0) + seconds

    def set(self, key: str, seconds: float) -> None:
        """For a stage that keeps its own total (the encoder lanes)."""
        with self._lock:
            self._seconds[key] = seconds

    def snapshot(self) -> dict[str, float]:
        with self._lock:
            return dict(self._seconds)


@dataclass(frozen=True)
class StageContext:
    """``stop``: set to end the job (workers finish their step, attempts in flight end interrupted).
    ``delays``: seconds a stage sleeps per record (``DEMOFORGE_STAGE_DELAY``, storage/faults.py: the crash
    tests widen the windows they kill in); empty in production."""

    stop: threading.Event = field(default_factory=threading.Event)
    busy: BusyMeter = field(default_factory=BusyMeter)
    delays: Mapping[str, float] = field(default_factory=dict)

    def delay(self, stage: str) -> float:
        return self.delays.get(stage, 0.0)
