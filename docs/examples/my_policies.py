"""An example driving policy for ``--driver my_policies:make`` (docs/policy-loop.md, "Drivers").

A driver is ``module:factory``: ``factory()`` returns an object with ``select_action(features) -> action``
(and optionally ``reset()``, called before each attempt). ``features`` maps the dataset's feature names to
numpy arrays. This one is Meta-World's own scripted push policy with a shaky hand: it sees the full 39-d
state, which a task records as ``observation.environment_state`` with ``--option full_state=true``, and
adds noise to every action, so it is good but not perfect, like a policy that has learned something.

From the repository root, with this folder on the import path::

    PYTHONPATH=docs/examples demoforge eval --task metaworld-push-v3 --option camera=none \
        --option full_state=true --driver my_policies:make --episodes 10
    PYTHONPATH=docs/examples demoforge generate --task metaworld-push-v3 --option camera=none \
        --option full_state=true --driver my_policies:make --beta 0.5 --episodes 10 --store runs/my-dagger

A policy of your own replaces ``ShakyPush.select_action`` (a trained network's forward pass, a remote call...).
"""

from __future__ import annotations

import zlib

import numpy as np
from metaworld.policies import SawyerPushV3Policy

STATE = "observation.environment_state"  # Meta-World's 39-d observation (--option full_state=true)
NOISE = 0.3  # standard deviation added to each action dimension (actions lie in [-1, 1])


class ShakyPush:
    """Meta-World's push expert plus gaussian noise. The noise is drawn from the state itself, so the same
    state gives the same action: a resumed job or another worker makes the same episode."""

    def __init__(self, noise: float = NOISE) -> None:
        self.expert = SawyerPushV3Policy()
        self.noise = noise

    def reset(self) -> None:
        """Called before each attempt; the scripted policy keeps nothing between steps."""

    def select_action(self, features: dict[str, np.ndarray]) -> np.ndarray:
        if STATE not in features:
            raise KeyError(f"my_policies needs {STATE} (run the task with --option full_state=true); "
                           f"it got {sorted(features)}")
        state = np.asarray(features[STATE], dtype=np.float64)
        action = np.clip(self.expert.get_action(state), -1.0, 1.0)
        rng = np.random.default_rng(zlib.crc32(state.tobytes()))
        return np.clip(action + rng.normal(0.0, self.noise, action.shape), -1.0, 1.0).astype(np.float32)


def make() -> ShakyPush:
    """The factory ``--driver my_policies:make`` names: one policy per env row (policies may keep state)."""
    return ShakyPush()
