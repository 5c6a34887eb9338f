"""Built-in task ``robosuite-stack``: robosuite 1.5.2's Stack (MimicGen's "stack" task: the red cube onto the
green one) with a reactive expert.

The env, cameras, controller, seeding and poses are every robosuite task's (pipeline/tasks/robosuite_env.py).
Recorded: ``observation.state`` is ``robot0_eef_pos``, ``robot0_eef_quat`` and ``robot0_gripper_qpos``;
``observation.environment_state`` is the env's ``object-state`` in robosuite's order (``cubeA_pos``,
``cubeA_quat``, ``cubeB_pos``, ``cubeB_quat``, ``cubeA_to_cubeB``, ``gripper_to_cubeA``, ``gripper_to_cubeB``);
horizon 400 as MimicGen's Stack.

Both cubes lie at random places and yaws on the table (cubeA 4 cm, cubeB 5 cm). The expert decides from each
observation: it turns the fingers to cubeA's faces (choosing the pair of faces whose fingers stay clear of cubeB),
reaches around it from above, closes, lifts it above cubeB's top, carries it over cubeB, lowers it onto cubeB
and lets go. Its phases are the segments (target ``cubeA`` until it is lifted, then ``cubeB``), each checked by a
validator that reads the simulator. Success is robosuite's own ``_check_success`` (cubeA off the table, touching
cubeB, not grasped); the episode ends at the first step where it holds.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from demoforge.pipeline.reactive import Phase
from demoforge.pipeline.tasks.robosuite_env import OSC_SCALE, OSC_TURN, RobosuiteSpec, body_pose, \
    register_robosuite, yaw
from demoforge.stages.task_protocol import Pose

NAME = "robosuite-stack"
HORIZON = 400  # MimicGen's Stack horizon
SEGMENT_NAMES = ("reach", "grasp", "lift", "align", "place", "release")
TARGETS = {"reach": "cubeA", "grasp": "cubeA", "lift": "cubeA", "align": "cubeB", "place": "cubeB",
           "release": "cubeB"}
INSTRUCTION = "stack the red cube on the green cube"
INSTRUCTIONS = {"reach": "move the open gripper around the red cube", "grasp": "close the gripper on the red cube",
                "lift": "lift the red cube above the green one", "align": "carry the red cube over the green cube",
                "place": "lower the red cube onto the green cube", "release": "let go of the red cube"}
OBJECT_PARTS = (("cubeA_pos", ("x", "y", "z")), ("cubeA_quat", ("x", "y", "z", "w")),
                ("cubeB_pos", ("x", "y", "z")), ("cubeB_quat", ("x", "y", "z", "w")),
                ("cubeA_to_cubeB", ("x", "y", "z")), ("gripper_to_cubeA", ("x", "y", "z")),
                ("gripper_to_cubeB", ("x", "y", "z")))
BODIES = {"cubeA": "cubeA_main", "cubeB": "cubeB_main"}

# The cubes' half sizes (robosuite's Stack) and the table's top height.
HALF_A, HALF_B, TABLE = 0.02, 0.025, 0.8
ON_B = HALF_A + HALF_B  # cubeA's centre above cubeB's when resting on it
# The expert's tolerances and heights (metres). The grip site aims at cubeA's centre.
AROUND, ALIGN, ABOVE = 0.024, 0.012, 0.06  # the grip site within AROUND of cubeA's centre is around it
LOW = 0.006  # the grip site around cubeA and this close above its centre: close the fingers
FACING = 0.08  # radians of yaw error the expert descends with
CLEAR = 0.04  # cubeA's bottom this far above cubeB's top while carried
OVER, STILL_OVER = 0.008, 0.02  # over cubeB: lowering starts within OVER and goes on within STILL_OVER
PRESS = 0.01  # lowering aims this far into cubeB: the contact stops it
SETTLED = 0.005  # cubeA within this of resting on cubeB (and within STILL_OVER of its axis): let go
CLOSED_ON_CUBE, CLOSING = 0.05, 0.075  # finger gaps (joint travel, m): closed on the 4 cm cube; closing
STILL = 0.01  # finger speed below which the fingers have stopped closing
LIFTED = 0.003  # cubeA this far above its resting height is off the table


def _wrap(angle: float, period: float) -> float:
    return float((angle + period / 2) % period - period / 2)


def _on_b(a: np.ndarray, b: np.ndarray) -> bool:
    """cubeA (centre ``a``) over cubeB (centre ``b``) and within SETTLED of resting on it."""
    return float(np.linalg.norm(a[:2] - b[:2])) < STILL_OVER and abs(float(a[2] - b[2]) - ON_B) < SETTLED


def _grasp_turn(observation: Mapping[str, np.ndarray]) -> float:
    """How far the gripper must turn about z to face cubeA's sides with its x axis along the line to cubeB: the
    fingers (which spread along its y axis) then close on the pair of faces beside that line, and open they
    straddle cubeA beside cubeB, never above it."""
    a, b = observation["cubeA_pos"], observation["cubeB_pos"]
    toward_b = float(np.arctan2(b[1] - a[1], b[0] - a[0]))
    faces = yaw(observation["cubeA_quat"])
    heading = min((faces, faces + np.pi / 2), key=lambda h: abs(_wrap(h - toward_b, np.pi)))
    return _wrap(heading - yaw(observation["robot0_eef_quat"]), np.pi)


class StackExpert:
    """Reactive: from the observation alone, it picks its phase and the action. cubeA is held when the fingers
    have closed on it (or it is already off the table: the fingers jiggle as it lifts)."""

    def decide(self, observation: Mapping[str, np.ndarray]) -> tuple[np.ndarray, Phase]:
        name, target, grip = self._plan(observation)
        move = np.clip((target - observation["robot0_eef_pos"]) / OSC_SCALE, -1.0, 1.0)
        turn = np.clip(_grasp_turn(observation) / OSC_TURN, -1.0, 1.0) if name == "reach" else 0.0
        action = np.concatenate([move, [0.0, 0.0, turn, grip]]).astype(np.float32)
        return action, Phase(name, INSTRUCTIONS[name], TARGETS[name])

    @staticmethod
    def _plan(observation: Mapping[str, np.ndarray]) -> tuple[str, np.ndarray, float]:
        eef, a, b = observation["robot0_eef_pos"], observation["cubeA_pos"], observation["cubeB_pos"]
        qpos, qvel = observation["robot0_gripper_qpos"], observation["robot0_gripper_qvel"]
        gap, still = float(qpos[0] - qpos[1]), float(np.max(np.abs(qvel))) < STILL
        offset = eef - a
        around = float(np.linalg.norm(offset)) < AROUND
        off_b = float(np.linalg.norm(a[:2] - b[:2]))
        if _on_b(a, b):
            return "release", eef.copy(), -1.0
        if around and gap < CLOSED_ON_CUBE and (still or a[2] > TABLE + HALF_A + LIFTED):
            carry = b[2] + ON_B + CLEAR
            over = eef + np.array([b[0] - a[0], b[1] - a[1], 0.0])
            if off_b < OVER or (off_b < STILL_OVER and a[2] < carry - 0.01):
                return "place", over + [0.0, 0.0, b[2] + ON_B - PRESS - a[2]], 1.0
            if a[2] < carry - 0.02 and off_b > STILL_OVER:
                return "lift", np.array([eef[0], eef[1], eef[2] + carry - a[2]]), 1.0
            return "align", over + [0.0, 0.0, carry - a[2]], 1.0
        if around and (float(offset[2]) < LOW or gap < CLOSING):
            return "grasp", np.array([a[0], a[1], eef[2]]), 1.0  # closing, it keeps centring over cubeA
        # above cubeA within ALIGN (or on the way down, within twice that: the descent drifts a little)
        wide = ALIGN if offset[2] > ABOVE / 2 else 2 * ALIGN
        aligned = float(np.linalg.norm(offset[:2])) < wide and abs(_grasp_turn(observation)) < FACING
        return "reach", a + [0.0, 0.0, 0.0 if aligned else ABOVE], -1.0


def _validator(env: Any, name: str) -> bool:
    """Each phase's end state, read from the simulator: the gripper around cubeA, cubeA grasped (robosuite's own
    contact check), lifted above cubeB's top, carried over cubeB, lowered onto it (within SETTLED of resting
    there: it is let go as it arrives), and robosuite's success once let go (touching cubeB, not grasped)."""
    a, b = body_pose(env, BODIES["cubeA"]).position, body_pose(env, BODIES["cubeB"]).position
    grasped = bool(env._check_grasp(gripper=env.robots[0].gripper, object_geoms=env.cubeA))
    if name == "reach":
        grip = env.sim.data.site_xpos[env.robots[0].eef_site_id["right"]]
        return bool(np.linalg.norm(grip - a) < AROUND)
    if name == "grasp":
        return grasped
    if name == "lift":
        return grasped and a[2] > b[2] + ON_B
    if name == "align":
        return grasped and float(np.linalg.norm(a[:2] - b[:2])) < STILL_OVER
    if name == "place":
        return _on_b(a, b)
    return bool(env._check_success())


def _upright(yaw_angle: float) -> np.ndarray:
    return np.array([np.cos(yaw_angle / 2), 0.0, 0.0, np.sin(yaw_angle / 2)])


def _objects(env: Any) -> dict[str, Pose]:
    """Each cube's position, upright. cubeA keeps its yaw modulo a quarter turn (a cube looks the same turned by
    one: a grasp moved with it then turns by at most a quarter turn, not half); cubeB none (whatever its yaw,
    cubeA goes on its top: the moved placing need not turn at all)."""
    a, b = body_pose(env, BODIES["cubeA"]), body_pose(env, BODIES["cubeB"])
    faces = _wrap(yaw(a.quaternion[[1, 2, 3, 0]]), np.pi / 2)
    return {"cubeA": Pose(a.position, _upright(faces)), "cubeB": Pose(b.position)}


SPEC = RobosuiteSpec(
    name=NAME, env_name="Stack", instruction=INSTRUCTION, horizon=HORIZON, segment_names=SEGMENT_NAMES,
    description="robosuite Stack (MimicGen's stack): a Panda with OSC_POSE delta control stacks a red cube on a "
                "green one; a reactive expert (reach, grasp, lift, align, place, release)",
    object_parts=OBJECT_PARTS, objects=_objects, make_expert=StackExpert, validator=_validator,
    instructions=INSTRUCTIONS)  # multiply: grasping moves with cubeA, placing with cubeB, lifting from the grasp
ENTRY = register_robosuite(SPEC)
