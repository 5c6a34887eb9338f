"""The library versions an episode was simulated with, recorded with every committed episode.

MuJoCo, NumPy and the env packages decide the floating-point results of a simulation; a replay under other
versions (or on another CPU architecture) may legitimately differ, so ``demoforge replay`` compares what
was recorded with what is running and says so. Read from package metadata: no simulator is imported.
"""

from __future__ import annotations

import functools
import platform
from collections.abc import Mapping
from importlib import metadata

# Distributions whose versions can change what a built-in task computes (plus demoforge itself).
PACKAGES = ("demoforge", "numpy", "mujoco", "gymnasium", "gymnasium-robotics", "gym-aloha", "dm-control", "av")


@functools.cache
def library_versions() -> dict[str, str]:
    """``{"python": ..., "machine": ..., "<distribution>": version}`` of this process (installed ones only)."""
    versions = {"python": platform.python_version(), "machine": platform.machine()}
    for name in PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return versions


def version_differences(recorded: Mapping[str, str] | None, running: Mapping[str, str]) -> list[str]:
    """``"mujoco 3.8.1 -> 3.9.0"`` for every entry recorded with another value than the running one."""
    if not recorded:
        return []
    return [f"{name} {recorded[name]} -> {running.get(name, 'not installed')}"
            for name in sorted(recorded) if recorded[name] != running.get(name)]
