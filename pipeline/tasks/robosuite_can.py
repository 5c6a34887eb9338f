"""Built-in task ``robosuite-can``: robosuite 1.5.2's PickPlace with only the can (robomimic's "can" task,
robosuite's ``PickPlaceCan``) and a reactive expert.

The env, cameras, controller, seeding and poses are every robosuite task's (pipeline/tasks/robosuite_env.py);
the env is ``robosuite.make("PickPlace", single_object_mode=2, object_type="can", ...)``. Recorded:
``observation.state`` is ``robot0_eef_pos``, ``robot0_eef_quat`` and ``robot0_gripper_qpos``;
``observation.environment_state`` is the env's ``object-state`` in robosuite's order (``Can_to_robot0_eef_pos``,
``Can_to_robot0_eef_quat``, ``Can_pos``, ``Can_quat``: robomimic's ``object`` for Can; robosuite gives the two
relative parts as zeros on an episode's first observation); horizon 500 as robomimic's Can.

The can stands at a random place and yaw in one bin; it goes into one fixed compartment of the other bin. The
expert decides from each observation: it reaches around the can from above, closes on it, lifts it clear of the
bins' walls, carries it over its compartment, lowers it there and lets go, pulling up once open. Its phases are
the segments (target ``can`` until it is lifted, then ``bin``), each checked by a validator that reads the
simulator. Success is robosuite's own ``_check_success`` (the can in its compartment, the gripper over 4 cm from
it); the episode ends at the first step where it holds.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from demoforge.pipeline.reactive import Phase
from demoforge.pipeline.tasks.robosuite_env import OSC_SCALE, RobosuiteSpec, body_pose, register_robosuite
from demoforge.stages.task_protocol import Pose

NAME = "robosuite-can"
HORIZON = 500  # robomimic's Can horizon
SEGMENT_NAMES = ("reach", "grasp", "lift", "transport", "place", "release")
TARGETS = {"reach": "can", "grasp": "can", "lift": "can", "transport": "bin", "place": "bin", "release": "bin"}
INSTRUCTION = "put the can into its compartment of the other bin"
INSTRUCTIONS = {"reach": "move the open gripper around the can", "grasp": "close the gripper on the can",
                "lift": "lift the can out of the bin", "transport": "carry the can over its compartment",
                "place": "lower the can into the compartment", "release": "let go of the can"}
OBJECT_PARTS = (("Can_to_robot0_eef_pos", ("x", "y", "z")), ("Can_to_robot0_eef_quat", ("x", "y", "z", "w")),
                ("Can_pos", ("x", "y", "z")), ("Can_quat", ("x", "y", "z", "w")))
ENV_ARGS = {"single_object_mode": 2, "object_type": "can"}
CAN_BODY = "Can_main"

# The scene (robosuite's BinsArena and PickPlace defaults). The compartment is fixed and not observed: the expert
# knows it (robosuite's ``target_bin_placements`` for the can; its bounds are ``not_in_bin``'s).
GOAL_XY = np.array([0.1975, 0.4025])
GOAL_HALF = np.array([0.0975, 0.1225])  # the compartment's half extents
GOAL_TOP = 0.9  # robosuite counts the can in its compartment below this height (the walls' top)
RESTING = 0.86  # the can's centre standing on a bin's floor
# The expert's heights and tolerances (metres). The grip site aims GRIP_DZ above the can's centre: lower, the
# fingertips meet the bin's floor.
GRIP_DZ = 0.01
NEAR, AROUND, ALIGN, ABOVE = 0.015, 0.03, 0.012, 0.08
CARRY = 1.03  # the can's centre while carried: its bottom clears the walls (0.9)
OVER, STILL_OVER = 0.02, 0.04  # over the compartment: lowering starts within OVER and goes on within STILL_OVER
LET_GO = 0.885  # the can's centre below this in its compartment: open the gripper (and press it down)
# Finger gaps (the two finger joints' travel, m): open; closed on the can (it holds at about 0.05); closing.
OPEN, CLOSED_ON_CAN, CLOSING = 0.07, 0.066, 0.075
STILL = 0.03  # finger speed below which the fingers have stopped closing
LIFTED = 0.003  # the can this far above the floor is off it
PRESS = 0.01  # letting go, the arm pushes this far down


class CanExpert:
    """Reactive: from the observation alone, it picks its phase and the action. The can is held when the
    fingers have closed on it around the grasp point (or it is already off the floor: the fingers jiggle as it
    lifts)."""

    def decide(self, observation: Mapping[str, np.ndarray]) -> tuple[np.ndarray, Phase]:
        name, target, grip = self._plan(observation)
        move = np.clip((target - observation["robot0_eef_pos"]) / OSC_SCALE, -1.0, 1.0)
        action = np.concatenate([move, [0.0, 0.0, 0.0, grip]]).astype(np.float32)
        return action, Phase(name, INSTRUCTIONS[name], TARGETS[name])

    @staticmethod
    def _plan(observation: Mapping[str, np.ndarray]) -> tuple[str, np.ndarray, float]:
        eef, can = observation["robot0_eef_pos"], observation["Can_pos"]
        qpos, qvel = observation["robot0_gripper_qpos"], observation["robot0_gripper_qvel"]
        gap, still = float(qpos[0] - qpos[1]), float(np.max(np.abs(qvel))) < STILL
        offset = eef - (can + np.array([0.0, 0.0, GRIP_DZ]))
        around = float(np.linalg.norm(offset)) < AROUND
        grip_at = eef - can  # the grip site relative to the can, kept while the can is carried
        # in its compartment: let go, unless it is still held on its way down to LET_GO
        if _in_goal(can) and not (around and gap < OPEN - 0.01 and can[2] > LET_GO):
            # open while pressing the can down (holding still, the arm springs back and lifts it), then pull up
            return "release", eef - [0.0, 0.0, PRESS] if gap < OPEN else np.array([eef[0], eef[1], CARRY]), -1.0
        if around and gap < CLOSED_ON_CAN and (still or can[2] > RESTING + LIFTED):
            off_goal = float(np.linalg.norm(can[:2] - GOAL_XY))
            over = np.array([*(GOAL_XY + grip_at[:2]), 0.0])
            if off_goal < OVER or (off_goal < STILL_OVER and can[2] < CARRY - 0.02):
                return "place", over + [0.0, 0.0, RESTING + grip_at[2]], 1.0
            if can[2] < CARRY - 0.04 and off_goal > 0.05:
                return "lift", np.array([eef[0], eef[1], CARRY + grip_at[2]]), 1.0
            return "transport", over + [0.0, 0.0, CARRY + grip_at[2]], 1.0
        if around and (float(np.linalg.norm(offset)) < NEAR or gap < CLOSING):
            return "grasp", eef.copy(), 1.0
        # above the can within ALIGN (or on the way down, within twice that: the descent drifts a little)
        aligned = float(np.linalg.norm(offset[:2])) < (ALIGN if offset[2] > ABOVE / 2 else 2 * ALIGN)
        return "reach", can + [0.0, 0.0, GRIP_DZ + (0.0 if aligned else ABOVE)], -1.0


def _in_goal(can: np.ndarray) -> bool:
    """The can within its compartment's bounds, below the walls' top (robosuite's ``not_in_bin`` negated)."""
    return bool(np.all(np.abs(can[:2] - GOAL_XY) < GOAL_HALF) and can[2] < GOAL_TOP)


def _validator(env: Any, name: str) -> bool:
    """Each phase's end state, read from the simulator: the gripper around the can, the can grasped (robosuite's
    own contact check), lifted clear of the walls, carried over its compartment, lowered into it, and robosuite's
    success once let go."""
    can = body_pose(env, CAN_BODY).position
    grasped = bool(env._check_grasp(gripper=env.robots[0].gripper, object_geoms=env.objects[env.object_id]))
    if name == "reach":
        grip = env.sim.data.site_xpos[env.robots[0].eef_site_id["right"]]
        return bool(np.linalg.norm(grip - can - [0.0, 0.0, GRIP_DZ]) < AROUND)
    if name == "grasp":
        return grasped
    if name == "lift":
        return grasped and can[2] > GOAL_TOP + 0.05
    if name == "transport":
        return grasped and float(np.linalg.norm(can[:2] - GOAL_XY)) < STILL_OVER
    if name == "place":
        return not env.not_in_bin(can, env.object_id)
    return bool(env._check_success())


def _objects(env: Any) -> dict[str, Pose]:
    """The can's position, upright (its yaw left out: the can is round, and its random yaw would turn a grasp
    moved with it by up to half a turn for nothing), and the fixed compartment it goes into (robosuite's
    placement for it, on the bin's floor)."""
    return {"can": Pose(body_pose(env, CAN_BODY).position),
            "bin": Pose(np.array(env.target_bin_placements[env.object_id], dtype=np.float64))}


SPEC = RobosuiteSpec(
    name=NAME, env_name="PickPlace", env_args=ENV_ARGS, instruction=INSTRUCTION, horizon=HORIZON,
    segment_names=SEGMENT_NAMES,
    description="robosuite PickPlaceCan (robomimic's can): a Panda with OSC_POSE delta control moves a can from "
                "one bin into a compartment of another; a reactive expert (reach, grasp, lift, transport, place, "
                "release)",
    object_parts=OBJECT_PARTS, objects=_objects, make_expert=CanExpert, validator=_validator,
    instructions=INSTRUCTIONS,
    # reaching and grasping move with the can, carrying and placing with the (fixed) compartment; lifting goes up
    # from wherever the grasp was
    object_roots=(CAN_BODY,), table_roots=("bin1", "bin2"),
    init_limit=1.0)  # the can is placed anywhere in its bin already: a wider range puts it in the walls
ENTRY = register_robosuite(SPEC)
