"""The built-in task "aloha-transfer-cube": gym-aloha's bimanual cube handover with a scripted expert.

The plan is end-effector waypoints rolled out phase by phase in the mocap copy of the scene
(:mod:`demoforge.pipeline.tasks.aloha_sim` says how); this module holds the handover's timeline and checks.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from gym_aloha.tasks.sim import TransferCubeTask

from demoforge.pipeline.tasks import aloha_sim
from demoforge.pipeline.tasks.aloha_sim import (
    CLOSED,
    OPEN,
    TABLE_GEOM,
    Keyframe,
    OneCameraRendering,
    axis_quat,
    rounded,
    touching,
)
from demoforge.stages.contract import Segment, StepView

TASK_NAME = "aloha-transfer-cube"
ADDED_OPTIONS: dict[str, Any] = {"depth": False}  # options added later: left out of fingerprints when default
INSTRUCTION = "transfer the cube from the right arm to the left arm"
CUBE_GEOM = "red_box"

# ------------------------------------------------------------------------------------ the waypoint plan
MEET = np.array([0.0, 0.5, 0.25])  # where the right arm presents the cube to the left arm
GRASP_OFFSET = np.zeros(3)  # fingertip point at the cube centre; lower, the fingers drag on the table
HOLD_RADIUS = 0.03  # a held cube's centre is this close to the gripper's fingertip point
LEFT_READY = np.array([-0.1, 0.0, 0.0])  # left fingertips relative to the presented cube, before/after
LEFT_GRASP = np.array([0.01, 0.0, 0.0])  # ... and while grasping it
PICK_QUAT = axis_quat((0.0, 1.0, 0.0), -60.0)  # right gripper tilted down toward the table
MEET_QUAT = axis_quat((1.0, 0.0, 0.0), -90.0)  # left gripper rolled: fingers cross the right's, the
# finger gym-aloha checks for contact ends up below the cube, where gravity keeps it touching


@dataclass(frozen=True)
class TransferPhase(aloha_sim.ScriptedPhase):
    """A handover phase. ``tracks_cube`` re-reads the cube on the table; ``measures_handoff`` re-reads where
    the right gripper holds it, so the left arm aims at the cube rather than at a nominal point."""

    tracks_cube: bool = False
    measures_handoff: bool = False


PHASES = (
    TransferPhase("reach_above_cube", 0, 90, "move the right gripper above the cube and open it", True),
    TransferPhase("descend", 90, 130, "lower the open right gripper around the cube", True),
    TransferPhase("grasp", 130, 170, "close the right gripper on the cube"),
    TransferPhase("lift_to_meet", 170, 200, "lift the cube toward the meeting point"),
    TransferPhase("move_to_meet", 200, 260, "bring both grippers to the meeting point", measures_handoff=True),
    TransferPhase("handover", 260, 310, "close the left gripper on the cube, then open the right gripper"),
    TransferPhase("retreat", 310, 400, "pull both arms apart with the cube in the left gripper"),
)
SEGMENT_NAMES = tuple(phase.name for phase in PHASES)
PLAN_STEPS = PHASES[-1].end
# gym-aloha's default limit (300) would truncate the plan. The margin lets a finished vector row hold still
# while other rows run (a truncated row may not be stepped again without a reset).
STEP_LIMIT = 4 * PLAN_STEPS


def waypoint_plan(cube: np.ndarray, handoff: np.ndarray, start: Mapping[str, Keyframe]
                  ) -> dict[str, list[Keyframe]]:
    """Each arm's keyframes for the whole episode.

    ``cube`` is the cube on the table, ``handoff`` where the cube will be when the right arm is at
    :data:`MEET` and ``start`` the arms' poses at step 0.
    """
    above = cube + np.array([0.0, 0.0, 0.08])
    at_cube = cube + GRASP_OFFSET
    left_ready = handoff + LEFT_READY
    left_grasp = handoff + LEFT_GRASP
    right = [
        start["right"],
        Keyframe(90, above, PICK_QUAT, OPEN),
        Keyframe(130, at_cube, PICK_QUAT, OPEN),
        Keyframe(155, at_cube, PICK_QUAT, CLOSED),  # closed early: the fingers settle on the cube by 170
        Keyframe(170, at_cube, PICK_QUAT, CLOSED),
        Keyframe(200, MEET + np.array([0.05, 0.0, 0.0]), PICK_QUAT, CLOSED),
        Keyframe(220, MEET, PICK_QUAT, CLOSED),
        Keyframe(285, MEET, PICK_QUAT, CLOSED),
        Keyframe(305, MEET, PICK_QUAT, OPEN),
        Keyframe(360, MEET + np.array([0.1, 0.0, 0.0]), PICK_QUAT, OPEN),
        Keyframe(400, MEET + np.array([0.1, 0.0, 0.0]), PICK_QUAT, OPEN),
    ]
    left = [
        start["left"],
        Keyframe(100, left_ready, MEET_QUAT, OPEN),
        Keyframe(260, left_grasp, MEET_QUAT, OPEN),
        Keyframe(280, left_grasp, MEET_QUAT, CLOSED),
        Keyframe(310, left_grasp, MEET_QUAT, CLOSED),
        Keyframe(360, left_ready, MEET_QUAT, CLOSED),
        Keyframe(400, left_ready, MEET_QUAT, CLOSED),
    ]
    return {"left": left, "right": right}


def cube_touchers(physics: Any) -> set[str]:
    """Names of the geoms in contact with the cube."""
    return touching(physics, (CUBE_GEOM,))


def cube_position(physics: Any) -> np.ndarray:
    return np.array(physics.named.data.xpos["box"])


class _TransferCubeTask(OneCameraRendering, TransferCubeTask):
    """gym-aloha's transfer task rendering only the top camera."""


# ------------------------------------------------------------------------------------------ the task
class AlohaTransferCube(aloha_sim.AlohaTask):
    """The joint env as a demoforge task: segments from the scripted handover expert, success (the left gripper
    holds the cube off the table: the env's max reward) decided at plan end."""

    def __init__(self, options: Mapping[str, Any]) -> None:
        super().__init__(options, scene="transfer_cube", task_class=_TransferCubeTask, step_limit=STEP_LIMIT,
                         instruction=INSTRUCTION)

    def create_demo_segments(self) -> Iterator[Segment]:
        """Plan each phase from the live joint state when the executor asks for it."""
        cube, handoff = cube_position(self.physics), MEET
        for phase in PHASES:
            if phase.tracks_cube:
                cube = cube_position(self.physics)
            if phase.measures_handoff:
                handoff = MEET + cube_position(self.physics) - self.tip("right")
            actions = self.plan_phase(waypoint_plan(cube, handoff, self._start), phase)
            yield Segment(actions=actions, name=phase.name, target="cube", instruction=phase.instruction,
                          metadata={"plan_start_step": phase.start, "plan_end_step": phase.end,
                                    "cube_xyz": rounded(cube), "handoff_xyz": rounded(handoff)},
                          validator=self._validator(phase.name, cube))

    # -- validators (read the joint env's physics after the segment's last step)
    def _validator(self, name: str, cube: np.ndarray) -> Callable[[StepView], bool]:
        """The check for phase ``name``; ``cube`` is where that phase's plan expected the cube."""
        checks: dict[str, Callable[[], bool]] = {
            "reach_above_cube": lambda: self._above_cube(cube),
            "descend": lambda: self._around_cube(cube),
            "grasp": lambda: self._holds("right"),
            "lift_to_meet": lambda: self._lifted_by("right"),
            "move_to_meet": lambda: self._lifted_by("right") and self._near_meet(),
            "handover": lambda: self._lifted_by("left"),
            "retreat": lambda: self._lifted_by("left") and not self.touches("right", (CUBE_GEOM,)),
        }
        check = checks[name]
        return lambda _view: bool(check())

    def _above_cube(self, planned: np.ndarray) -> bool:
        """The open right gripper hovers over the cube, which has not been pushed."""
        tip = self.tip("right")
        cube = cube_position(self.physics)
        return bool(np.linalg.norm(cube[:2] - planned[:2]) < 0.01 and np.linalg.norm(tip[:2] - cube[:2]) < 0.03
                    and tip[2] > cube[2] + 0.04)

    def _around_cube(self, planned: np.ndarray) -> bool:
        """The right fingertips are at the cube and the cube has not been knocked away."""
        tip = self.tip("right")
        cube = cube_position(self.physics)
        return bool(np.linalg.norm(cube - planned) < 0.015 and np.linalg.norm(tip - cube) < 0.04)

    def _holds(self, arm: str) -> bool:
        """``arm``'s fingers touch the cube and it sits between them (one finger's contact may flicker)."""
        near = np.linalg.norm(cube_position(self.physics) - self.tip(arm)) < HOLD_RADIUS
        return self.touches(arm, (CUBE_GEOM,)) and bool(near)

    def _lifted_by(self, arm: str) -> bool:
        """``arm`` holds the cube clear of the table."""
        return (self._holds(arm) and TABLE_GEOM not in cube_touchers(self.physics)
                and cube_position(self.physics)[2] > 0.05)

    def _near_meet(self) -> bool:
        return bool(np.linalg.norm(cube_position(self.physics) - MEET) < 0.08)


# ---------------------------------------------------------------------------------------- registry
aloha_sim.register_task(
    TASK_NAME, instruction=INSTRUCTION, segment_names=SEGMENT_NAMES, make_env=AlohaTransferCube,
    description="ALOHA bimanual sim (gym-aloha AlohaTransferCube-v0): the right arm picks up the cube and hands it "
                "to the left arm; 14 absolute joint targets, top camera.",
    objects=("box",), added_options=ADDED_OPTIONS)
