"""Built-in task ``robosuite-lift``: robosuite 1.5.2's Lift (robomimic's "lift" task) with a reactive expert.

The env, cameras, controller, seeding and poses are every robosuite task's (pipeline/tasks/robosuite_env.py).
Recorded: ``observation.state`` is ``robot0_eef_pos``, ``robot0_eef_quat`` and ``robot0_gripper_qpos``;
``observation.environment_state`` is the env's ``object-state`` (``cube_pos``, ``cube_quat``,
``gripper_to_cube_pos``); horizon 500 as robomimic's Lift. The expert decides from each observation (turn to the
cube's yaw and reach above it, descend, close, lift); its phases are the segments, each targeting ``cube``, each
checked by a validator that reads the simulator. Success is robosuite's own ``_check_success`` (the cube 4 cm
above the table); the episode ends at the first step where it holds.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from demoforge.pipeline.reactive import Phase
from demoforge.pipeline.tasks.robosuite_env import (
    OSC_SCALE,
    OSC_TURN,
    RobosuiteSpec,
    body_pose,
    register_robosuite,
    yaw,
)
from demoforge.stages.task_protocol import Pose

NAME = "robosuite-lift"
HORIZON = 500  # robomimic's Lift horizon
SEGMENT_NAMES = ("reach", "grasp", "lift")
TARGET = "cube"
INSTRUCTION = "lift the cube"
INSTRUCTIONS = {"reach": "move the open gripper around the cube", "grasp": "close the gripper on the cube",
                "lift": "lift the cube off the table"}
OBJECT_PARTS = (("cube_pos", ("x", "y", "z")), ("cube_quat", ("x", "y", "z", "w")),
                ("gripper_to_cube_pos", ("x", "y", "z")))
# The expert's thresholds (metres): the gripper site within NEAR of the cube's centre counts as around it;
# ABOVE is the height it approaches from until it is within ALIGN of the cube horizontally.
NEAR, ALIGN, ABOVE, LIFT_TO = 0.012, 0.012, 0.06, 0.12
FACING = 0.08  # radians of yaw error the expert descends with
CLOSED_ON_CUBE = 0.05  # finger gap (m) below which closed fingers hold the cube (the cube is 4-4.4 cm wide)


def _yaw_error(observation: Mapping[str, np.ndarray]) -> float:
    """How far the gripper must turn about z to face the cube's sides (modulo a quarter turn: a cube)."""
    turn = yaw(observation["cube_quat"]) - yaw(observation["robot0_eef_quat"])
    return float((turn + np.pi / 4) % (np.pi / 2) - np.pi / 4)


class LiftExpert:
    """Reactive: from the observation alone, it picks its phase (reach, grasp, lift) and the action. Reaching,
    it turns the gripper to the cube's yaw (robosuite places the cube at a random yaw: fingers closing across
    its diagonal slip) and stays above it until aligned."""

    def decide(self, observation: Mapping[str, np.ndarray]) -> tuple[np.ndarray, Phase]:
        name, target, grip = self._plan(observation)
        move = np.clip((target - observation["robot0_eef_pos"]) / OSC_SCALE, -1.0, 1.0)
        turn = np.clip(_yaw_error(observation) / OSC_TURN, -1.0, 1.0) if name == "reach" else 0.0
        action = np.concatenate([move, [0.0, 0.0, turn, grip]]).astype(np.float32)
        return action, Phase(name, INSTRUCTIONS[name], TARGET)

    @staticmethod
    def _plan(observation: Mapping[str, np.ndarray]) -> tuple[str, np.ndarray, float]:
        eef, cube = observation["robot0_eef_pos"], observation["cube_pos"]
        qpos, qvel = observation["robot0_gripper_qpos"], observation["robot0_gripper_qvel"]
        gap = float(qpos[0] - qpos[1])
        offset = eef - cube
        around = float(np.linalg.norm(offset)) < 2 * NEAR
        if around and gap < CLOSED_ON_CUBE and float(np.max(np.abs(qvel))) < 0.01:
            return "lift", np.array([cube[0], cube[1], cube[2] + LIFT_TO]), 1.0
        if around and (float(np.linalg.norm(offset)) < NEAR or gap < CLOSED_ON_CUBE + 0.02):
            return "grasp", eef.copy(), 1.0
        aligned = float(np.linalg.norm(offset[:2])) < ALIGN and abs(_yaw_error(observation)) < FACING
        return "reach", np.array([cube[0], cube[1], cube[2] + (0.0 if aligned else ABOVE)]), -1.0


def _validator(env: Any, name: str) -> bool:
    """Each phase's end state, read from the simulator: the gripper around the cube, the cube grasped
    (robosuite's own contact check), the cube lifted."""
    if name == "reach":
        grip = env.sim.data.site_xpos[env.robots[0].eef_site_id["right"]]
        return bool(np.linalg.norm(grip - env.sim.data.body_xpos[env.cube_body_id]) < 2 * NEAR)
    if name == "grasp":
        return bool(env._check_grasp(gripper=env.robots[0].gripper, object_geoms=env.cube))
    return bool(env._check_success())


def _objects(env: Any) -> dict[str, Pose]:
    return {TARGET: body_pose(env, env.cube.root_body)}


SPEC = RobosuiteSpec(
    name=NAME, env_name="Lift", instruction=INSTRUCTION, horizon=HORIZON, segment_names=SEGMENT_NAMES,
    description="robosuite Lift (robomimic's lift): a Panda with OSC_POSE delta control lifts a cube; a reactive "
                "expert (reach, grasp, lift)",
    object_parts=OBJECT_PARTS, objects=_objects, make_expert=LiftExpert, validator=_validator,
    instructions=INSTRUCTIONS)
ENTRY = register_robosuite(SPEC)
