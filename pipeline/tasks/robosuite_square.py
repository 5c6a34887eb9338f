"""Built-in task ``robosuite-square``: robosuite 1.5.2's NutAssemblySquare (robomimic's "square" task) with a
reactive expert.

The env, cameras, controller, seeding and poses are every robosuite task's (pipeline/tasks/robosuite_env.py).
Recorded: ``observation.state`` is ``robot0_eef_pos``, ``robot0_eef_quat`` and ``robot0_gripper_qpos``;
``observation.environment_state`` is the env's ``object-state`` in robosuite's order
(``SquareNut_to_robot0_eef_pos``, ``SquareNut_to_robot0_eef_quat``, ``SquareNut_pos``, ``SquareNut_quat``: robomimic's
``object`` for Square); horizon 500 as robomimic's multi-human Square (400 for its proficient-human one).

The nut lies at a random yaw with its handle pointing anywhere. The expert decides from each observation: it
turns the fingers across the handle and grasps it, lifts the nut clear of the peg, carries it over the square
peg while turning it to one of the peg's headings (the handle toward the robot or sideways: pointing away would
put the gripper out of the arm's reach), lowers it down the peg and lets go. Its phases are the segments (target
``nut`` until it is lifted, then ``peg``), each checked by a validator that reads the simulator. Success is
robosuite's own ``_check_success`` (the nut around the peg, near the table, the gripper away from it); the
episode ends at the first step where it holds.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from demoforge.pipeline.reactive import Phase
from demoforge.pipeline.tasks.robosuite_env import (
    OSC_SCALE,
    OSC_TURN,
    RobosuiteSpec,
    body_pose,
    quaternion,
    register_robosuite,
    rotation,
    yaw,
)
from demoforge.stages.task_protocol import Pose

NAME = "robosuite-square"
HORIZON = 500  # robomimic's Square horizon (its multi-human datasets; as robosuite-lift's 500)
SEGMENT_NAMES = ("reach", "grasp", "lift", "align", "insert", "release")
TARGETS = {"reach": "nut", "grasp": "nut", "lift": "nut", "align": "peg", "insert": "peg", "release": "peg"}
INSTRUCTION = "put the square nut on the square peg"
INSTRUCTIONS = {"reach": "move the open gripper around the nut's handle", "grasp": "close the gripper on the handle",
                "lift": "lift the nut clear of the peg", "align": "carry the nut over the square peg and turn it "
                "to the peg's sides", "insert": "lower the nut down the peg", "release": "let go of the nut"}
OBJECT_PARTS = (("SquareNut_to_robot0_eef_pos", ("x", "y", "z")),
                ("SquareNut_to_robot0_eef_quat", ("x", "y", "z", "w")),
                ("SquareNut_pos", ("x", "y", "z")), ("SquareNut_quat", ("x", "y", "z", "w")))
NUT_BODY, PEG_BODY = "SquareNut_main", "peg1"

# The scene (robosuite's PegsArena and square-nut.xml). The peg is fixed and is not observed: the expert knows it.
PEG_XY = np.array([0.23, 0.1])
PEG_TOP = 0.95  # its top face's height
NUT_HALF = 0.01  # half the nut's thickness
GRASP_AT = 0.065  # along the nut's x axis: the handle's outer part (it runs 0.044..0.079), fingers clear of the ring
# The expert's heights (metres, the nut's centre unless said) and tolerances.
HOVER = 0.05  # the gripper waits this far above the grasp point until aligned over it
GRIP_DZ = 0.006  # the grip site this far above the handle's middle: fingertips off the table
CLEAR = PEG_TOP + NUT_HALF + 0.005  # below this (and not over the peg) the nut is lifted straight up
CARRY = 1.0  # the nut is carried at this height
INSERT_TO, RELEASE_BELOW = 0.875, 0.885  # lowered toward INSERT_TO; let go below RELEASE_BELOW (success: < 0.87)
ON_PEG = 0.01  # the nut's centre within this of the peg's axis, below CLEAR: its hole is around the peg
OVER, OVER_TURN = 0.003, 0.05  # aligned over the peg: lowering starts (and goes on within 0.008 m and 0.1 rad)
OPEN, CLOSED_ON_HANDLE, EMPTY = 0.07, 0.034, 0.02  # finger gaps (m): open; closed on the 3.2 cm handle; on nothing
REACH_GAIN, CARRY_GAIN = 2.0, 0.6  # action per metre of error (in OSC_SCALE units): OSC stops short; a load swings
Q7_RANGE = 2.5  # radians: the wrist joint (limits +-2.9) stays within this
HEADINGS = (np.pi / 2, np.pi, -np.pi / 2)  # the nut's headings over the peg (its x axis: the handle)


def _wrap(angle: float) -> float:
    return float((angle + np.pi) % (2 * np.pi) - np.pi)


def _down(heading: float) -> np.ndarray:
    """The grip site's orientation pointing straight down with its x axis (the fingers' closing axis) at
    ``heading``."""
    x, z = np.array([np.cos(heading), np.sin(heading), 0.0]), np.array([0.0, 0.0, -1.0])
    return np.column_stack([x, np.cross(z, x), z])


def _turn_toward(heading: float, site: np.ndarray) -> np.ndarray:
    """The axis-angle (world frame) that turns the site's orientation ``site`` to :func:`_down` ``(heading)``."""
    import mujoco

    velocity = np.zeros(3)
    mujoco.mju_quat2Vel(velocity, quaternion(_down(heading) @ site.T), 1.0)
    return velocity


def _nut_turn(nut_heading: float, q7: float, before: float = 0.0) -> float:
    """The smallest turn of the held nut (the wrist turns with it) to a heading over the peg that keeps the wrist
    joint in range, after the wrist first turns by ``before``. A turn about the world's z turns joint 7 back."""
    turns = sorted((_wrap(h - nut_heading) for h in HEADINGS), key=abs)
    return next((t for t in turns if abs(q7 - before - t) < Q7_RANGE), turns[0])


def _grasp_turn(nut_heading: float, site_heading: float, q7: float) -> float:
    """The wrist's turn that puts the fingers across the handle (two ways, half a turn apart): the one that turns
    least over the whole task, keeping the wrist joint in range."""
    def cost(turn: float) -> tuple[bool, float]:
        then = _nut_turn(nut_heading, q7, turn)
        return abs(q7 - turn - then) >= Q7_RANGE, abs(turn) + abs(then)

    options = [_wrap(nut_heading + np.pi / 2 + k * np.pi - site_heading) for k in (0, 1)]
    return min(options, key=cost)


@dataclass(frozen=True)
class _Seen:
    """What the expert reads of one observation."""

    eef: np.ndarray
    site: np.ndarray  # the grip site's orientation (3x3)
    nut: np.ndarray
    nut_rotation: np.ndarray
    q7: float
    gap: float
    closing: bool

    @staticmethod
    def of(observation: Mapping[str, np.ndarray]) -> _Seen:
        qpos, qvel = observation["robot0_gripper_qpos"], observation["robot0_gripper_qvel"]
        site = observation["robot0_eef_quat_site"]
        nut = observation["SquareNut_quat"]
        return _Seen(eef=np.asarray(observation["robot0_eef_pos"], dtype=np.float64),
                     site=rotation(np.array([site[3], site[0], site[1], site[2]])),
                     nut=np.asarray(observation["SquareNut_pos"], dtype=np.float64),
                     nut_rotation=rotation(np.array([nut[3], nut[0], nut[1], nut[2]])),
                     q7=float(observation["robot0_joint_pos"][6]), gap=float(qpos[0] - qpos[1]),
                     closing=float(qvel[0]) < -0.005)

    @property
    def nut_heading(self) -> float:
        return float(np.arctan2(self.nut_rotation[1, 0], self.nut_rotation[0, 0]))

    @property
    def site_heading(self) -> float:
        return float(np.arctan2(self.site[1, 0], self.site[0, 0]))

    @property
    def grasp_point(self) -> np.ndarray:
        return self.nut + self.nut_rotation @ np.array([GRASP_AT, 0.0, 0.0])


class SquareExpert:
    """Reactive: from the observation alone, it picks its phase and the action (a move toward a target point and
    a turn toward a heading, the gripper open or closed). A missed grasp or a nut dropped off the peg sends it
    back to reaching."""

    def decide(self, observation: Mapping[str, np.ndarray]) -> tuple[np.ndarray, Phase]:
        seen = _Seen.of(observation)
        name, target, heading, grip, gain = self._plan(seen)
        move = np.clip(gain * (target - seen.eef) / OSC_SCALE, -1.0, 1.0)
        turn = np.clip(_turn_toward(heading, seen.site) / OSC_TURN, -1.0, 1.0)
        action = np.concatenate([move, turn, [grip]]).astype(np.float32)
        return action, Phase(name, INSTRUCTIONS[name], TARGETS[name])

    @staticmethod
    def _plan(seen: _Seen) -> tuple[str, np.ndarray, float, float, float]:
        eef, nut, heading = seen.eef, seen.nut, seen.site_heading
        offset = eef - seen.grasp_point
        apart = float(np.linalg.norm(offset[:2]))
        clamped = apart < 0.02 and abs(offset[2]) < 0.025 and EMPTY < seen.gap < 0.045
        off_peg = float(np.linalg.norm(nut[:2] - PEG_XY))
        on_peg = off_peg < ON_PEG and nut[2] < CLEAR
        if on_peg and (nut[2] < RELEASE_BELOW or not clamped):
            return "release", eef + [0.0, 0.0, HOVER if seen.gap > 0.05 else 0.0], heading, -1.0, 1.0
        if clamped and (seen.gap < CLOSED_ON_HANDLE or not seen.closing):
            turn = _nut_turn(seen.nut_heading, seen.q7)
            c, s = np.cos(turn), np.sin(turn)
            held = eef - nut  # where the gripper holds the nut: turned with it, over the peg
            over = np.array([PEG_XY[0] + c * held[0] - s * held[1], PEG_XY[1] + s * held[0] + c * held[1], held[2]])
            if on_peg or (off_peg < OVER and abs(turn) < OVER_TURN) or \
                    (off_peg < 0.008 and abs(turn) < 0.1 and nut[2] < CARRY - 0.01):
                return "insert", over + [0.0, 0.0, INSERT_TO], heading + turn, 1.0, CARRY_GAIN
            if nut[2] < CLEAR:
                return "lift", np.array([eef[0], eef[1], held[2] + CARRY]), heading, 1.0, REACH_GAIN
            return "align", over + [0.0, 0.0, CARRY], heading + turn, 1.0, CARRY_GAIN
        facing = heading + _grasp_turn(seen.nut_heading, heading, seen.q7)
        at = seen.grasp_point + [0.0, 0.0, GRIP_DZ]
        if (apart < 0.006 and abs(eef[2] - at[2]) < 0.01) or \
                (apart < 0.015 and abs(offset[2]) < 0.025 and (seen.gap < OPEN + 0.005 or seen.closing)):
            return "grasp", at, facing, 1.0, REACH_GAIN
        ready = apart < 0.006 and abs(facing - heading) < 0.08 and seen.gap > OPEN
        going_down = apart < 0.012 and eef[2] < at[2] + HOVER - 0.01
        return "reach", at + [0.0, 0.0, 0.0 if ready or going_down else HOVER], facing, -1.0, REACH_GAIN


# ---------------------------------------------------------------------------------------------- checks
def _nut(env: Any) -> tuple[np.ndarray, np.ndarray]:
    pose = body_pose(env, NUT_BODY)
    return pose.position, rotation(pose.quaternion)


def _held(env: Any) -> bool:
    return bool(env._check_grasp(gripper=env.robots[0].gripper, object_geoms=env.nuts[env.nut_id]))


def _validator(env: Any, name: str) -> bool:
    """Each phase's end state, read from the simulator: the grip site at the handle's grasp point; the nut
    grasped (robosuite's own contact check); lifted clear of the peg; over the peg and turned to its sides;
    around the peg, low; robosuite's success."""
    position, matrix = _nut(env)
    peg = np.array(env.sim.data.body_xpos[env.peg1_body_id])
    off_peg = float(np.linalg.norm(position[:2] - peg[:2]))
    if name == "reach":
        site = env.sim.data.site_xpos[env.robots[0].eef_site_id["right"]]
        return bool(np.linalg.norm(site - position - matrix @ np.array([GRASP_AT, 0.0, GRIP_DZ])) < 0.015)
    if name == "grasp":
        return _held(env)
    if name == "lift":
        return _held(env) and bool(position[2] > PEG_TOP + NUT_HALF)
    if name == "align":
        misturn = _wrap(4 * float(np.arctan2(matrix[1, 0], matrix[0, 0]))) / 4  # the peg is square
        return _held(env) and off_peg < 0.008 and abs(misturn) < 0.1 and bool(position[2] > PEG_TOP + NUT_HALF)
    if name == "insert":
        return off_peg < ON_PEG and bool(position[2] < RELEASE_BELOW + 0.005)
    return bool(env._check_success())


def _objects(env: Any) -> dict[str, Pose]:
    return {"nut": body_pose(env, NUT_BODY), "peg": body_pose(env, PEG_BODY)}


SPEC = RobosuiteSpec(
    name=NAME, env_name="NutAssemblySquare", instruction=INSTRUCTION, horizon=HORIZON, segment_names=SEGMENT_NAMES,
    description="robosuite NutAssemblySquare (robomimic's square): a Panda with OSC_POSE delta control puts the "
                "square nut on the square peg; a reactive expert (reach, grasp, lift, align, insert, release)",
    object_parts=OBJECT_PARTS, objects=_objects, make_expert=SquareExpert, validator=_validator,
    instructions=INSTRUCTIONS)
ENTRY = register_robosuite(SPEC)
