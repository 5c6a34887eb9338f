"""An action checked against its env's action space, and the action a finished vector row holds.

Apart from the contract (stages/contract.py) because these need gymnasium's spaces: the contract's records
also cross into the encoder process (stages/encoder_child.py), which must start without importing gymnasium.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

from demoforge.stages.contract import ActionError, TaskProtocolError


def default_hold_action(action_space: gym.Space) -> np.ndarray:
    """Zeros shaped like the action: "no motion" for delta-controlled arms. Absolute-position tasks must
    define ``demo_hold_action``."""
    if not isinstance(action_space, gym.spaces.Box):
        raise TaskProtocolError(f"no default hold action for {type(action_space).__name__}; define "
                                "demo_hold_action()")
    return np.zeros(action_space.shape, dtype=action_space.dtype)


def check_action(action: Any, space: gym.Space, *, clip: bool = False) -> np.ndarray:
    """A finite numeric array of the action space's shape, or an :class:`ActionError` saying what is off.

    ``clip``: clip to a Box space's bounds, as the env clips what it is stepped with (a driving policy's action:
    what is recorded as executed is what the env executed). Clipped before the cast, so a value beyond the
    space's dtype (1e39 for float32) clips instead of turning into inf; without ``clip`` such a value is refused."""
    try:
        array = np.asarray(action)
    except Exception as exc:  # ragged lists etc.
        raise ActionError(f"action is not an array: {exc}") from None
    if array.dtype.kind not in "biuf":
        raise ActionError(f"action has dtype {array.dtype}; expected a numeric array")
    expected = getattr(space, "shape", None)
    if expected is not None and array.shape != tuple(expected):
        raise ActionError(f"action has shape {array.shape}; the env expects {tuple(expected)}")
    if array.dtype.kind == "f" and not np.all(np.isfinite(array)):
        raise ActionError(f"action contains NaN or inf: {np.array2string(array, precision=3)}")
    low, high = getattr(space, "low", None), getattr(space, "high", None)
    if clip and low is not None and high is not None:
        array = np.clip(array.astype(np.float64), low, high)
    dtype = getattr(space, "dtype", None)
    if dtype is None:
        return array
    with np.errstate(over="ignore", invalid="ignore"):
        cast = array.astype(dtype, copy=False)
    if cast.dtype != array.dtype and cast.dtype.kind == "f" and not np.all(np.isfinite(cast)):
        raise ActionError(f"action {np.array2string(array, precision=3)} does not fit the action space's dtype "
                          f"{np.dtype(dtype)} (it overflows to inf)")
    return cast
