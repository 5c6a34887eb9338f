"""The phases of Meta-World 3.0.0's 50 scripted experts: which branch of each expert's code is which segment.

Every expert (``metaworld.policies``) is reactive: ``get_action`` picks a target in ``_desired_pos`` with an
if/elif chain and a gripper effort in ``_grab_effort``. A phase is the pair (the ``return`` of
``_desired_pos`` that chose the target, the ``return`` of ``_grab_effort`` that chose the effort), both
counted in source order from 0; ``targets`` names the first, ``overrides`` names pairs where the gripper
changes what the phase is (descending while the fingers close is the grasp). Segments are runs of equal
names, so two branches with one name (two detours around a wall) are one segment.

Two experts choose their target inline in ``get_action`` (``drawer-open``, ``reach``) and one has a single
branch that does two things (``soccer``'s approach and push): for them ``branch`` reads the phase from the
parsed observation, with the expert's own thresholds (drawer-open) or a task predicate (soccer: the hand
within 7 cm of the ball).

The tables are written against metaworld 3.0.0's policy sources; demoforge refuses any other version.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

Parsed = Mapping[str, Any]  # a policy's ``_parse_obs`` result


@dataclass(frozen=True)
class ExpertPhases:
    """How one expert's branches become named phases."""

    obj: str  # what the task manipulates: every segment's target
    targets: tuple[str, ...]  # a phase name per return of _desired_pos (or per value of ``branch``)
    instructions: Mapping[str, str]  # what each phase asks for, as the segment's instruction
    overrides: Mapping[tuple[int, int], str] = field(default_factory=dict)  # (target, grip) -> name
    branch: Callable[[Parsed], int] | None = None  # the target branch, for experts without _desired_pos

    def name(self, target: int | None, grip: int | None) -> str:
        if target is None or not 0 <= target < len(self.targets):
            raise ValueError(f"target branch {target!r} of an expert with {len(self.targets)}")
        if grip is not None and (target, grip) in self.overrides:
            return self.overrides[(target, grip)]
        return self.targets[target]

    def names(self) -> tuple[str, ...]:
        """Every phase name, in the order of the expert's branches (a branch, then what the gripper makes of it)."""
        ordered: list[str] = []
        for index, name in enumerate(self.targets):
            ordered += [name] + [n for (t, _g), n in sorted(self.overrides.items()) if t == index]
        return tuple(dict.fromkeys(ordered))


def _drawer_open_branch(o: Parsed) -> int:
    """drawer-open's expert: above the handle, then down to it, then pull (its thresholds: 6 cm, 4 cm)."""
    hand, handle = np.asarray(o["hand_pos"]), np.asarray(o["drwr_pos"]) + np.array([0.0, 0.0, -0.02])
    if np.linalg.norm(hand[:2] - handle[:2]) > 0.06:
        return 0
    return 1 if abs(hand[2] - handle[2]) > 0.04 else 2


def _soccer_branch(o: Parsed) -> int:
    """soccer's expert always moves to a push point behind the ball; it pushes once the hand is at the ball."""
    return int(np.linalg.norm(np.asarray(o["hand_pos"]) - np.asarray(o["ball_pos"])) < 0.07)


def _single_branch(_o: Parsed) -> int:
    return 0


G = {(1, 1): "grasp"}  # the common case: descending (target 1) while the fingers close (grip 1) is the grasp


def _pick(obj: str, targets: tuple[str, ...], say: Mapping[str, str],
          overrides: Mapping[tuple[int, int], str] = G) -> ExpertPhases:
    return ExpertPhases(obj, targets, say, overrides)


def _touch(obj: str, targets: tuple[str, ...], say: Mapping[str, str],
           branch: Callable[[Parsed], int] | None = None) -> ExpertPhases:
    """An expert without a gripper branch (it holds one effort throughout)."""
    return ExpertPhases(obj, targets, say, {}, branch)


PHASES: dict[str, ExpertPhases] = {
    "assembly-v3": _pick("nut", ("reach", "insert", "grasp", "lift", "move"), {
        "reach": "move the open gripper above the nut", "grasp": "lower onto the nut and close the gripper on it",
        "lift": "lift the nut to the height of the peg", "move": "carry the nut above the peg",
        "insert": "lower the nut onto the peg"}, {}),
    "basketball-v3": _pick("ball", ("reach", "descend", "lift", "dunk"), {
        "reach": "move the open gripper above the ball", "descend": "lower the gripper to the ball",
        "grasp": "close the gripper on the ball", "lift": "lift the ball to the height of the hoop",
        "dunk": "carry the ball into the hoop"}),
    "bin-picking-v3": _pick("puck", ("reach", "descend", "lift", "move", "place"), {
        "reach": "move the open gripper above the puck", "descend": "lower the gripper to the puck",
        "grasp": "close the gripper on the puck", "lift": "lift the puck out of its bin",
        "move": "carry the puck above the other bin", "place": "lower the puck into the other bin"}),
    "box-close-v3": _pick("lid", ("reach", "descend", "lift", "place"), {
        "reach": "move the gripper above the lid", "descend": "lower the gripper to the lid's handle",
        "grasp": "close the gripper on the lid's handle", "lift": "lift the lid to the height of the box",
        "place": "put the lid on the box"}),
    "button-press-topdown-v3": _touch("button", ("reach", "press"), {
        "reach": "move the gripper above the button", "press": "press the button down"}),
    "button-press-topdown-wall-v3": _touch("button", ("reach", "press"), {
        "reach": "move the gripper above the button, past the wall", "press": "press the button down"}),
    "button-press-v3": _touch("button", ("align", "press"), {
        "align": "line the gripper up in front of the button", "press": "push the button in"}),
    "button-press-wall-v3": _touch("button", ("align", "approach", "lower", "press"), {
        "align": "move high above the wall, in line with the button", "approach": "move forward over the wall",
        "lower": "lower the gripper to the height of the button", "press": "push the button in"}),
    "coffee-button-v3": _touch("button", ("align", "press"), {
        "align": "line the gripper up in front of the coffee machine's button",
        "press": "push the coffee machine's button"}),
    "coffee-pull-v3": _pick("mug", ("reach", "descend", "pull"), {
        "reach": "move the open gripper above the mug", "descend": "lower the gripper to the mug",
        "grasp": "close the gripper on the mug", "pull": "pull the mug out from the coffee machine"}),
    "coffee-push-v3": _pick("mug", ("reach", "descend", "push"), {
        "reach": "move the open gripper above the mug", "descend": "lower the gripper to the mug",
        "grasp": "close the gripper on the mug", "push": "push the mug under the coffee machine"}),
    "dial-turn-v3": _touch("dial", ("reach", "descend", "turn"), {
        "reach": "move the gripper above the dial", "descend": "lower the gripper to the dial's edge",
        "turn": "turn the dial"}),
    "disassemble-v3": _pick("nut", ("reach", "descend", "lift"), {
        "reach": "move the open gripper above the nut", "descend": "lower the gripper to the nut",
        "grasp": "close the gripper on the nut", "lift": "lift the nut off the peg"}),
    "door-close-v3": _touch("door", ("rise", "approach", "lower", "push"), {
        "rise": "raise the gripper above the door handle", "approach": "move over the door's outer edge",
        "lower": "lower the gripper beside the door's outer edge", "push": "push the door closed"}),
    "door-lock-v3": _touch("lock", ("retreat", "reach", "press", "push"), {
        "retreat": "back away and rise above the door", "reach": "move the gripper above the lock",
        "press": "lower the gripper onto the lock, turning it", "push": "push the lock down"}),
    "door-open-v3": _touch("door", ("reach", "descend", "pull"), {
        "reach": "move the gripper above the door handle", "descend": "lower the gripper beside the door handle",
        "pull": "pull the door open by its handle"}),
    "door-unlock-v3": _touch("lock", ("lower", "reach", "unlock"), {
        "lower": "lower the gripper in front of the door", "reach": "move the gripper to the lock",
        "unlock": "push the lock round to unlock the door"}),
    "drawer-close-v3": _touch("drawer", ("rise", "reach", "descend", "push"), {
        "rise": "raise the gripper above the drawer", "reach": "move the gripper above the drawer's front",
        "descend": "lower the gripper in front of the drawer handle", "push": "push the drawer closed"}),
    "drawer-open-v3": _touch("drawer", ("reach", "descend", "pull"), {
        "reach": "move the gripper high above the drawer handle", "descend": "lower the gripper to the handle",
        "pull": "pull the drawer open"}, _drawer_open_branch),
    "faucet-close-v3": _touch("faucet", ("reach", "descend", "turn"), {
        "reach": "move the gripper above the faucet handle", "descend": "lower the gripper beside the handle",
        "turn": "turn the faucet clockwise"}),
    "faucet-open-v3": _touch("faucet", ("reach", "descend", "turn"), {
        "reach": "move the gripper above the faucet handle", "descend": "lower the gripper beside the handle",
        "turn": "turn the faucet counter-clockwise"}),
    "hammer-v3": _pick("hammer", ("reach", "descend", "lift", "hammer"), {
        "reach": "move the open gripper above the hammer", "descend": "lower the gripper to the hammer's handle",
        "grasp": "close the gripper on the hammer", "lift": "lift the hammer in line with the nail",
        "hammer": "drive the nail in with the hammer"}),
    "hand-insert-v3": _pick("puck", ("reach", "descend", "move", "insert"), {
        "reach": "move the open gripper above the puck", "descend": "lower the gripper to the puck",
        "grasp": "close the gripper on the puck", "move": "carry the puck above the hole",
        "insert": "lower the gripper into the hole"}),
    "handle-press-side-v3": _touch("handle", ("reach", "press"), {
        "reach": "move the gripper above the handle", "press": "press the handle down"}),
    "handle-press-v3": _touch("handle", ("reach", "press"), {
        "reach": "move the gripper above the handle", "press": "press the handle down"}),
    "handle-pull-side-v3": _pick("handle", ("reach", "descend", "pull"), {
        "reach": "move the open gripper above the handle", "descend": "lower the gripper to the handle",
        "grasp": "close the gripper on the handle", "pull": "pull the handle up"}),
    "handle-pull-v3": _touch("handle", ("reach", "descend", "pull"), {
        "reach": "move the gripper under the handle", "descend": "bring the gripper to the handle's height",
        "pull": "pull the handle up"}),
    "lever-pull-v3": _touch("lever", ("reach", "pull", "pull"), {
        "reach": "move the gripper under the lever's end", "pull": "push the lever's end round"}),
    "peg-insert-side-v3": _pick("peg", ("reach", "descend", "move", "insert"), {
        "reach": "move the open gripper above the peg", "descend": "lower the gripper to the peg",
        "grasp": "close the gripper on the peg", "move": "carry the peg in front of the hole",
        "insert": "push the peg into the hole"}),
    "peg-unplug-side-v3": _pick("peg", ("reach", "descend", "unplug"), {
        "reach": "move the open gripper above the peg", "descend": "lower the gripper to the peg",
        "grasp": "close the gripper on the peg", "unplug": "pull the peg out sideways"}),
    "pick-out-of-hole-v3": _pick("puck", ("reach", "descend", "lift", "place"), {
        "reach": "move the open gripper above the puck", "descend": "lower the gripper into the hole",
        "grasp": "close the gripper on the puck", "lift": "lift the puck out of the hole",
        "place": "carry the puck to the goal"}),
    # grip branch 0 of this expert closes the fingers (within 7 cm of the puck), branch 1 opens them
    "pick-place-v3": _pick("puck", ("reach", "descend", "grasp", "place"), {
        "reach": "move the open gripper above the puck", "descend": "lower the gripper to the puck",
        "grasp": "close the gripper on the puck", "place": "carry the puck to the goal"}, {(1, 0): "grasp"}),
    "pick-place-wall-v3": _pick("puck", ("reach", "descend", "lift", "move", "align", "place"), {
        "reach": "move the open gripper above the puck", "descend": "lower the gripper to the puck",
        "grasp": "close the gripper on the puck", "lift": "lift the puck above the wall",
        "move": "carry the puck over the wall", "align": "bring the puck to the height of the goal",
        "place": "carry the puck to the goal"}),
    "plate-slide-back-side-v3": _touch("plate", ("reach", "descend", "slide"), {
        "reach": "move the gripper above the plate's edge", "descend": "lower the gripper to the plate",
        "slide": "slide the plate out of the cabinet sideways"}),
    "plate-slide-back-v3": _touch("plate", ("reach", "descend", "pull", "slide", "slide"), {
        "reach": "move the gripper above the plate's edge", "descend": "lower the gripper to the plate",
        "pull": "pull the plate out of the cabinet", "slide": "slide the plate to the goal"}),
    "plate-slide-side-v3": _touch("plate", ("reach", "descend", "slide", "slide"), {
        "reach": "move the gripper beside the plate", "descend": "lower the gripper to the plate",
        "slide": "slide the plate into the cabinet sideways"}),
    "plate-slide-v3": _touch("plate", ("reach", "descend", "slide"), {
        "reach": "move the gripper behind the plate", "descend": "lower the gripper to the plate",
        "slide": "slide the plate into the cabinet"}),
    "push-back-v3": _pick("puck", ("reach", "descend", "push"), {
        "reach": "move the open gripper above the puck", "descend": "lower the gripper to the puck",
        "grasp": "close the gripper on the puck", "push": "push the puck back to the goal"}),
    "push-v3": _pick("puck", ("reach", "descend", "push"), {
        "reach": "move the open gripper above the puck", "descend": "lower the gripper to the puck",
        "grasp": "close the gripper on the puck", "push": "push the puck to the goal"}),
    "push-wall-v3": _pick("puck", ("reach", "descend", "detour", "detour", "push"), {
        "reach": "move the open gripper above the puck", "descend": "lower the gripper to the puck",
        "grasp": "close the gripper on the puck", "detour": "push the puck around the wall",
        "push": "push the puck to the goal"}),
    "reach-v3": _touch("goal", ("reach",), {"reach": "move the gripper to the goal"}, _single_branch),
    "reach-wall-v3": _touch("goal", ("rise", "reach"), {
        "rise": "rise above the wall while moving toward the goal", "reach": "move the gripper to the goal"}),
    "shelf-place-v3": _pick("block", ("reach", "descend", "align", "lift", "place"), {
        "reach": "move the open gripper above the block", "descend": "lower the gripper to the block",
        "grasp": "close the gripper on the block", "align": "carry the block in line with the shelf",
        "lift": "lift the block to the shelf's height", "place": "push the block onto the shelf"}),
    "soccer-v3": _touch("ball", ("reach", "kick"), {
        "reach": "move the gripper behind the ball", "kick": "push the ball into the goal"}, _soccer_branch),
    "stick-pull-v3": _pick("stick", ("reach", "descend", "align", "align", "hook", "pull"), {
        "reach": "move the open gripper above the stick", "descend": "lower the gripper to the stick",
        "grasp": "close the gripper on the stick", "align": "bring the stick in line with the box's handle",
        "hook": "hook the stick into the box's handle", "pull": "pull the box to the goal with the stick"}),
    "stick-push-v3": _pick("stick", ("reach", "descend", "align", "align", "hook", "push"), {
        "reach": "move the open gripper above the stick", "descend": "lower the gripper to the stick",
        "grasp": "close the gripper on the stick", "align": "bring the stick in line with the box",
        "hook": "bring the stick against the box", "push": "push the box to the goal with the stick"}),
    "sweep-into-v3": _pick("puck", ("reach", "descend", "sweep"), {
        "reach": "move the open gripper above the puck", "descend": "lower the gripper to the puck",
        "grasp": "close the gripper on the puck", "sweep": "sweep the puck into the hole"}),
    # grip branch 2 opens the fingers again once the puck is past the table's edge
    "sweep-v3": _pick("puck", ("reach", "descend", "sweep"), {
        "reach": "move the open gripper above the puck", "descend": "lower the gripper to the puck",
        "grasp": "close the gripper on the puck", "sweep": "sweep the puck off the table",
        "release": "let go of the puck"}, {(1, 1): "grasp", (2, 2): "release"}),
    "window-close-v3": _touch("window", ("reach", "descend", "push"), {
        "reach": "move the gripper above the window's handle", "descend": "lower the gripper beside the handle",
        "push": "slide the window closed"}),
    "window-open-v3": _touch("window", ("reach", "descend", "push"), {
        "reach": "move the gripper above the window's handle", "descend": "lower the gripper beside the handle",
        "push": "slide the window open"}),
}
