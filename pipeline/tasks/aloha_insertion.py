"""The built-in task "aloha-insertion": gym-aloha's bimanual peg insertion (``AlohaInsertion-v0``, LeRobot's
default ALOHA eval) with a scripted expert.

The left arm grasps the socket, the right arm the peg; both lift, meet in the air and the peg is pushed into
the socket until it touches the pin inside (gym-aloha's reward 4). The plan is end-effector waypoints rolled
out phase by phase in the mocap copy of the scene (:mod:`demoforge.pipeline.tasks.aloha_sim` says how), the
ACT paper's recipe for this task with the grippers tilted 60 degrees toward the table.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

import numpy as np
from gym_aloha.tasks.sim import InsertionTask

from demoforge.pipeline.tasks import aloha_sim
from demoforge.pipeline.tasks.aloha_sim import CLOSED, OPEN, TABLE_GEOM, Keyframe, OneCameraRendering, ScriptedPhase, \
    axis_quat, rounded, touching
from demoforge.stages.contract import Segment, StepView

TASK_NAME = "aloha-insertion"
INSTRUCTION = "insert the peg into the socket"
PEG_GEOMS = ("red_peg",)
SOCKET_GEOMS = ("socket-1", "socket-2", "socket-3", "socket-4", "pin")
# Which arm carries which object, and the name it has in segment targets and metadata.
CARRIES = {"left": ("socket", SOCKET_GEOMS), "right": ("peg", PEG_GEOMS)}

# ------------------------------------------------------------------------------------ the waypoint plan
MEET = np.array([0.0, 0.5, 0.15])  # the point between the two grippers when the objects meet
APART = 0.1  # each gripper's distance from MEET along x before the insertion
# The peg touches the pin when the centres of peg and socket are 0.1 apart along x (the pin's half-length
# 0.04 plus the peg's 0.06); the plan pushes 1 cm further, so the contact holds against the grip's give.
INSERTED = 0.09
LINE_UP = 0.04  # the peg waits this far outside the touching point while it is lined up with the socket
ABOVE = np.array([0.0, 0.0, 0.08])  # where a gripper waits above its grasp point before descending
# Fingertip heights above the table where each arm closes: the socket (4.4 cm tall) near its top, the peg
# (2 cm) at its top edge, so the peg hangs level with the socket's mouth. Heights, not offsets from the
# objects: at step 0 the objects are still dropping onto the table from where gym-aloha spawned them.
GRASP_HEIGHT = {"left": 0.05, "right": 0.025}
RIGHT_LIFT = np.array([0.0, 0.0, -0.013])  # the right arm meets a little lower: the peg sags less than the socket
# Both grippers tilted toward the table, mirrored: the fingers come down on the objects from outside.
QUATS = {"left": axis_quat((0.0, 1.0, 0.0), 60.0), "right": axis_quat((0.0, 1.0, 0.0), -60.0)}
SIDE = {"left": -1.0, "right": 1.0}  # each arm's side of MEET along x

PHASES = (
    ScriptedPhase("reach", 0, 120, "move the left gripper above the socket and the right gripper above the peg, open"),
    ScriptedPhase("descend", 120, 170, "lower the open grippers around the socket and the peg"),
    ScriptedPhase("grasp", 170, 220, "close the left gripper on the socket and the right gripper on the peg"),
    ScriptedPhase("lift_to_meet", 220, 285, "lift the socket and the peg and bring them face to face in the air"),
    ScriptedPhase("insert", 285, 360, "push the peg into the socket until it touches the pin"),
)
SEGMENT_NAMES = tuple(phase.name for phase in PHASES)
PLAN_STEPS = PHASES[-1].end
INSERT_START = next(phase.start for phase in PHASES if phase.name == "insert")
STEP_LIMIT = 4 * PLAN_STEPS  # as for transfer-cube: a finished vector row holds still while others run


def grasp_points(objects: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Where each arm's fingertip point closes on its object: above the object's centre (``objects``, by arm)
    at the arm's :data:`GRASP_HEIGHT`."""
    return {arm: np.array([*objects[arm][:2], GRASP_HEIGHT[arm]]) for arm in CARRIES}


def waypoint_plan(grasp: Mapping[str, np.ndarray], start: Mapping[str, Keyframe]) -> dict[str, list[Keyframe]]:
    """Each arm's keyframes up to the meeting (held there after): ``grasp`` from :func:`grasp_points`,
    ``start`` the arms' poses at step 0."""
    plan: dict[str, list[Keyframe]] = {}
    for arm, side in SIDE.items():
        quat, at = QUATS[arm], grasp[arm]
        lift = RIGHT_LIFT if arm == "right" else np.zeros(3)
        apart = MEET + lift + np.array([side * APART, 0.0, 0.0])
        plan[arm] = [
            start[arm],
            Keyframe(120, at + ABOVE, quat, OPEN),
            Keyframe(170, at, quat, OPEN),
            Keyframe(220, at, quat, CLOSED),
            Keyframe(285, apart, quat, CLOSED),
        ]
    return plan


def insertion_plan(now: Mapping[str, Keyframe], socket: np.ndarray, peg_in_hand: np.ndarray
                   ) -> dict[str, list[Keyframe]]:
    """The insertion, planned from what the grasps actually gave: the left arm holds the socket where it is;
    the right arm first lines the peg up with the socket's axis (``peg_in_hand`` is the right fingertip point
    relative to the peg's centre), then pushes it in until the peg's centre is :data:`INSERTED` from the
    socket's."""
    line_up = socket + np.array([INSERTED + LINE_UP, 0.0, 0.0]) + peg_in_hand
    inserted = socket + np.array([INSERTED, 0.0, 0.0]) + peg_in_hand
    left, right = now["left"], now["right"]
    return {"left": [left, Keyframe(PLAN_STEPS, left.pos, left.quat, CLOSED)],
            "right": [right, Keyframe(right.t + 20, line_up, right.quat, CLOSED),
                      Keyframe(right.t + 55, inserted, right.quat, CLOSED),
                      Keyframe(PLAN_STEPS, inserted, right.quat, CLOSED)]}


class _InsertionTask(OneCameraRendering, InsertionTask):
    """gym-aloha's insertion task rendering only the top camera."""


# ------------------------------------------------------------------------------------------ the task
class AlohaInsertion(aloha_sim.AlohaTask):
    """The joint insertion env as a demoforge task: segments from the scripted expert; the episode ends, as
    ``AlohaInsertion-v0``'s does, at the first step the peg touches the pin inside the socket (the env's max
    reward, 4). The contact flickers once the peg is in (it rests on the pin at the grip's give), so a state held
    for a fixed time after it would end with reward 4 or 2 by chance."""

    def __init__(self, options: Mapping[str, Any]) -> None:
        super().__init__(options, scene="insertion", task_class=_InsertionTask, step_limit=STEP_LIMIT,
                         instruction=INSTRUCTION, ends_at_success=True)

    def objects(self) -> dict[str, np.ndarray]:
        """Each arm's object position (its body's origin), by arm."""
        return {arm: self.body_position(name) for arm, (name, _geoms) in CARRIES.items()}

    def create_demo_segments(self) -> Iterator[Segment]:
        """Plan each phase from the live joint state; the grasp points are re-read until the grasp starts."""
        grasp: dict[str, np.ndarray] = {}
        plan: dict[str, list[Keyframe]] = {}
        for phase in PHASES:
            if phase.start < INSERT_START:
                grasp = grasp_points(self.objects())
                plan = waypoint_plan(grasp, self._start)
            elif phase.start == INSERT_START:
                objects = self.objects()
                plan = insertion_plan(self._current_keyframes(phase.start), objects["left"],
                                      self.tip("right") - objects["right"])
            actions = self.plan_phase(plan, phase)
            yield Segment(actions=actions, name=phase.name, target="peg+socket", instruction=phase.instruction,
                          metadata={"plan_start_step": phase.start, "plan_end_step": phase.end,
                                    "peg_grasp_xyz": rounded(grasp["right"]),
                                    "socket_grasp_xyz": rounded(grasp["left"])},
                          validator=self._validator(phase.name, grasp))

    # -- validators (read the joint env's physics after the segment's last step)
    def _validator(self, name: str, grasp: Mapping[str, np.ndarray]) -> Callable[[StepView], bool]:
        """The check for phase ``name``; ``grasp`` is where that phase's plan expected each arm's object."""
        checks: dict[str, Callable[[], bool]] = {
            "reach": lambda: self._each_arm(lambda arm: self._above(arm, grasp[arm])),
            "descend": lambda: self._each_arm(lambda arm: self._around(arm, grasp[arm])),
            "grasp": lambda: self._each_arm(self._touches_its_object),
            "lift_to_meet": lambda: self._each_arm(self._lifted_by) and self._near_meet(),
            "insert": lambda: self.env_reward() == self.max_reward,
        }
        check = checks[name]
        return lambda _view: bool(check())

    @staticmethod
    def _each_arm(check: Callable[[str], bool]) -> bool:
        return all(check(arm) for arm in CARRIES)

    def _unmoved(self, arm: str, planned: np.ndarray, tolerance: float) -> bool:
        """``arm``'s object has not been pushed across the table since its grasp point was planned."""
        return bool(np.linalg.norm(self.objects()[arm][:2] - planned[:2]) < tolerance)

    def _above(self, arm: str, planned: np.ndarray) -> bool:
        """The gripper hovers over its object, which has not been pushed."""
        tip, target = self.tip(arm), planned
        return (self._unmoved(arm, planned, 0.01) and bool(np.linalg.norm(tip[:2] - target[:2]) < 0.03)
                and bool(tip[2] > target[2] + 0.04))

    def _around(self, arm: str, planned: np.ndarray) -> bool:
        """The fingertips are at the grasp point and the object has not been knocked away."""
        return self._unmoved(arm, planned, 0.015) and bool(np.linalg.norm(self.tip(arm) - planned) < 0.04)

    def _touches_its_object(self, arm: str) -> bool:
        return self.touches(arm, CARRIES[arm][1])

    def _lifted_by(self, arm: str) -> bool:
        """``arm`` touches its object and the object is clear of the table."""
        geoms = CARRIES[arm][1]
        return self._touches_its_object(arm) and TABLE_GEOM not in touching(self.physics, geoms)

    def _near_meet(self) -> bool:
        """Peg and socket face each other near the meeting point, at most a hand's width apart."""
        objects = self.objects()
        middle = (objects["left"] + objects["right"]) / 2
        return bool(np.linalg.norm(middle[1:] - MEET[1:]) < 0.05 and abs(middle[0] - MEET[0]) < 0.05)


# ---------------------------------------------------------------------------------------- registry
aloha_sim.register_task(
    TASK_NAME, instruction=INSTRUCTION, segment_names=SEGMENT_NAMES, make_env=AlohaInsertion,
    description="ALOHA bimanual sim (gym-aloha AlohaInsertion-v0): the left arm grasps the socket, the right arm the "
                "peg; they meet in the air and insert the peg; 14 absolute joint targets, top camera.",
    objects=("peg", "socket"))
