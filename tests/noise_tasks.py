"""Registers ``toy-noise``: the toy point task with a camera of random noise, so encoded frames are large
(tens of KB) and a run's encoded output is far bigger than what the pipeline may hold at once."""

from __future__ import annotations

import numpy as np

from demoforge.pipeline.contract import RecordedObservation
from demoforge.pipeline.tasks.registry import TaskEntry, register
from toy_tasks import DEFAULTS, CameraPointEnv, _info


class NoiseCameraEnv(CameraPointEnv):
    def demo_record(self, observation) -> RecordedObservation:
        rng = np.random.default_rng([int(getattr(self, "_seed", 0) or 0), self.t])
        img = rng.integers(0, 256, size=(self.size, self.size, 3), dtype=np.uint8)
        return RecordedObservation(state={"observation.state": observation}, images={"cam": img})


def _noise_info(options):
    return _info(options)


register(TaskEntry(name="toy-noise", defaults=DEFAULTS, describe=_noise_info,
                   make_env=lambda o: NoiseCameraEnv(dict(o))))
