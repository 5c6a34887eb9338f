"""The process environment the simulators and encoders read, set in one place and never at import.

MuJoCo chooses its GL backend (``MUJOCO_GL``) when it is first imported, and SVT-AV1 reads its log level
(``SVT_LOG``) when an encoder opens. :func:`prepare_process` sets both (a value the user set is kept) and
silences third-party notices that tell a demoforge user nothing. It runs at every way in: the CLI's
``main``, a task's module import and build (the registry), a job (``run_job``: the library's ``generate``)
and every worker process (the process and Ray executors pass :data:`WORKER_ENVIRONMENT`; replay's spawned
workers build their envs through the registry).
"""

from __future__ import annotations

import os

DEFAULTS = {
    "MUJOCO_GL": "egl",  # offscreen rendering, on machines with or without a display
    "SVT_LOG": "1",  # SVT-AV1 prints a banner per encoder at info level: warnings only
}
WORKER_ENVIRONMENT = {**DEFAULTS, "HF_HUB_OFFLINE": "1"}  # a worker never downloads anything


def prepare_process() -> None:
    """Set the defaults this process has not set and silence the notices; cheap, and safe to call again."""
    for key, value in DEFAULTS.items():
        os.environ.setdefault(key, value)
    _silence_notices()


def _silence_notices() -> None:
    # gymnasium-robotics 1.4.2 prints, on import, a notice about the reward functions of its Adroit envs
    # (from the farama_notifications table): the first line `demoforge generate` printed on every run.
    # demoforge's tasks use no Adroit env; other notices of the table are kept.
    try:
        from farama_notifications import notifications
    except ImportError:
        return
    for version, note in list(notifications.get("gymnasium_robotics", {}).items()):
        if "Adroit" in note:
            del notifications["gymnasium_robotics"][version]
