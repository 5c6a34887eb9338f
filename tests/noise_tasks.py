"""Toy tasks for the scale-out tests (workers import this module by name): ``toy-noise``, a camera of random
noise, so encoded frames are large (tens of KB) and a run's output is far bigger than what the pipeline may
hold at once; ``toy-stall``, whose episode 1 attempt 0 hangs in ``step``; ``toy-crash-start``, whose env
kills its process while it is built (as a simulator that aborts in a C library would), after a line on
stderr."""

from __future__ import annotations

import numpy as np

from demoforge.pipeline.tasks.registry import TaskEntry, register
from demoforge.stages.contract import RecordedObservation
from toy_tasks import DEFAULTS, CameraPointEnv, describe


class NoiseCameraEnv(CameraPointEnv):
    def demo_record(self, observation) -> RecordedObservation:
        rng = np.random.default_rng([int(getattr(self, "_seed", 0) or 0), self.t])
        img = rng.integers(0, 256, size=(self.size, self.size, 3), dtype=np.uint8)
        return RecordedObservation(state={"observation.state": observation}, images={"cam": img})


def _noise_info(options):
    return describe(options)


register(TaskEntry(name="toy-noise", defaults=DEFAULTS, describe=_noise_info,
                   make_env=lambda o: NoiseCameraEnv(dict(o))))


STALL_SEED = 3964924996  # derive_seed(0, 1, 0): episode 1, attempt 0 hangs at step 5


class StallingEnv(CameraPointEnv):
    def step(self, action):
        if self._seed == STALL_SEED and self.t == 5:
            import time

            time.sleep(3600)  # never returns within a test: the driver's watchdog must give up on the worker
        return super().step(action)


register(TaskEntry(name="toy-stall", defaults=DEFAULTS, describe=_noise_info,
                   make_env=lambda o: StallingEnv(dict(o))))


CRASH_MESSAGE = "toy-crash-start: cannot open the simulator's display (simulated)"


def _crash_while_building(options):
    import os
    import sys

    print(CRASH_MESSAGE, file=sys.stderr, flush=True)
    os._exit(3)


register(TaskEntry(name="toy-crash-start", defaults=DEFAULTS, describe=_noise_info, make_env=_crash_while_building))
