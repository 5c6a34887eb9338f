"""Built-in task ``so101-plugin-pick-cube``: the ``lerobot-env-so101`` plugin's ``SO101PickCube-v0`` as LeRobot runs it.

Named apart from ``so101-pick-place`` (our own Menagerie scene and joint-space actions): this task records the
registry plugin's env itself, built from the plugin's own LeRobot config (``lerobot_env_so101``'s ``SO101Env``,
what ``--env.type=so101`` makes), so an export trains with ``lerobot-train`` and its checkpoint evaluates with
``lerobot-eval --env.type=so101`` with no renaming: ``observation.state`` is the env's ``agent_pos`` (14: five arm
joint angles and speeds, the gripper command in -1..1, the ``gripperframe`` site's position),
``observation.environment_state`` its ``environment_state`` (the block's position), ``action`` its native
``[dx, dy, dz, grasp]`` (metres at the config's default ``action_scale`` 1.0; grasp 0 closed .. 1 open, absolute),
10 fps, 100-step episodes. With ``image_obs`` the env replaces the block position with its ``front`` camera
(128x128), recorded as ``observation.images.front``.

The plugin's README says its scripted controller cannot complete a pick: its position-only IK (no orientation
in the action) tracks a Cartesian path from home onto a branch with the jaws about 40 degrees off vertical, where
the fixed jaw lands on the block's top. What the 4-d action does allow (measured, tools/bench_so101_plugin.py):
a step of up to a metre moves the IK target anywhere in the workspace, and the IK starts from the arm's current
angles, so the path chooses the branch. Stretching the arm out and up (its elbow flips) and jumping back above
the block leaves the wrist folded down: the jaws come within a few degrees of vertical over blocks up to about
0.3 m out (the wrist reaches its limit beyond). The expert then puts the point between the jaw tips on the
block, closes and lifts fast (a slow lift lets the cube slip: the jaws collide as convex hulls that open toward
the tips, and the env leaves its fingertip pads off, so the pinch holds the cube by its edges). Measured over
100 seeds (random block positions, one attempt each): 81 succeed, 8 of 22 with the block 0.35 m out or more; the
plugin's default scene (the block at 0.3 m) succeeds. A failed attempt is retried by the job, and only
successes become data.

The expert is reactive: every step it reads the simulator (arm angles, the IK target the env holds, the block,
the gripper) and picks its phase (stretch, reach, descend, grasp, lift, and release after a failed grasp), so
it can label states a policy chose. Each segment targets ``cube`` and is checked by a validator that reads the
simulator. Success is the env's own (``info["succeed"]``: the block 10 cm up and within 5 cm of the gripper).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Mapping
from contextlib import nullcontext
from typing import Any

import gymnasium as gym
import numpy as np

from demoforge.pipeline.reactive import Phase, reactive_segments
from demoforge.pipeline.tasks.mujoco_gl import GL_LOCK
from demoforge.pipeline.tasks.registry import (
    CameraSpec,
    TaskEntry,
    TaskInfo,
    TaskOptionError,
    check_installed,
    register,
)
from demoforge.stages.contract import RecordedObservation, Segment, StepView

NAME = "so101-plugin-pick-cube"
PLUGIN = "lerobot-env-so101"
SUPPORTED_PLUGIN = "0.4.0"
GYM_TASK = "SO101PickCube-v0"  # the plugin config's default task
FPS = 10  # the plugin config's fps: its env steps 0.1 s of simulation
EPISODE_LENGTH = 100  # the plugin config's episode_length
MAX_EPISODE_LENGTH = 1000
IMAGE_SIZE = 128  # the env's render size (GymRenderingSpec's default; the LeRobot config does not change it)
CAMERA = "front"
DEFAULTS: Mapping[str, Any] = {"random_block_position": True, "image_obs": False, "episode_length": EPISODE_LENGTH}
STATE_KEY = "observation.state"
ENV_STATE_KEY = "observation.environment_state"
ARM_JOINTS = ("shoulder_pan", "shoulder_lift", "elbow_flex", "wrist_flex", "wrist_roll")
# The plugin's flattening order (lerobot_env_so101.policy.OBS_FIELD_NAMES), written out so describe() imports no
# simulator; a test compares them.
STATE_NAMES = (*(f"qpos_{j}" for j in ARM_JOINTS), *(f"qvel_{j}" for j in ARM_JOINTS), "gripper_pose",
               "ee_x", "ee_y", "ee_z")
BLOCK_NAMES = ("block_x", "block_y", "block_z")
ACTION_NAMES = ("dx", "dy", "dz", "grasp")
TARGET = "cube"
INSTRUCTION = "pick up the cube"
INSTRUCTIONS = {
    "stretch": "stretch the arm out and bring it back above the cube with the jaws pointing down",
    "reach": "move the open gripper above the cube",
    "descend": "lower the open jaws around the cube",
    "grasp": "close the gripper on the cube",
    "lift": "lift the cube",
    "release": "open the gripper and move up",
}
SEGMENT_NAMES = tuple(INSTRUCTIONS)

# ------------------------------------------------------------------------------------------------ the expert
# Metres, radians, action units (action_scale 1.0: an action is metres). Found by measuring (the tool's sweep):
STRETCH_TO = np.array([0.5, 0.0, 0.3])  # out of reach, up: the IK straightens the arm and flips the elbow
STRETCHED_ELBOW = -1.1  # elbow_flex below this: the arm is stretched; jump back
RETURN_HEIGHT = 0.12  # the gripper site this high above the block after the stretch
RETURNED = 0.03  # the IK target this close to that point: the jump back was commanded (noise on actions moves it)
SETTLED = 0.2  # rad/s: every arm joint slower than this counts as settled
TILT_OK = np.deg2rad(30.0)  # jaws closer to vertical than this need no stretch
HIGH = 0.09  # the commanded site this high above the block: the approach has not begun
GRASP_DX = 0.001  # the point between the jaw tips goes here relative to the block's centre (along x)
HOVER = 0.06  # ... first this high above the block's centre
GRASP_DZ = -0.004  # ... then this high (the tips pinch the block's upper half)
ALIGN = 0.01  # horizontal distance of that point from its hover that ends reaching
DESCENDED = 0.008  # height above the grasp height that ends descending
GRASP_COMMAND = 0.2  # the gripper command that squeezes (0 closed .. 1 open)
OPEN = 1.0
CLOSED_BELOW = 0.5  # a gripper command below this is a closing gripper
JAW_SETTLED = 0.2  # rad/s: the jaw has stopped closing
HOLDING = 0.03  # the block's centre within this of the jaw point: it is in the jaws
LIFT_STEP = 0.1  # metres the jaw point's target rises a step while lifting
LOST = 0.05  # the block this far below the jaw point while lifting: it was dropped
NUDGE = np.array([0.0, 0.0, 1e-5])  # the env reads an action under 1e-6 as "hold where you are now"
JAW_OPEN = 1.2  # rad: the jaw joint this far open after a release


@dataclasses.dataclass(frozen=True)
class Scene:
    """What the expert and the validators read of the simulator at one step."""

    arm_q: np.ndarray
    arm_qd: np.ndarray
    tilt: float  # radians between the jaws' approach axis and straight down
    site: np.ndarray  # the gripperframe site (the point the action moves)
    jaw_point: np.ndarray  # the point between the jaw tips at the grasp opening
    block: np.ndarray
    block_start_z: float
    commanded: np.ndarray  # the IK target the env holds (accumulated deltas)
    gripper_command: float  # 0 closed .. 1 open
    jaw_speed: float

    @property
    def settled(self) -> bool:
        return float(np.max(np.abs(self.arm_qd))) < SETTLED


class PluginScene:
    """Reads :class:`Scene` from the plugin's ``SO101PickCubeGymEnv`` (its model, data and IK target)."""

    def __init__(self, env: Any) -> None:
        from lerobot_env_so101.gripper import ctrl_to_normalized
        from lerobot_env_so101.mujoco_env import grasp_point_offset

        self.env = env
        model = env.model
        self._site = model.site("gripperframe").id
        self._offset = grasp_point_offset(model, self._site)
        self._arm_q = np.array([model.joint(j).qposadr[0] for j in ARM_JOINTS])
        self._arm_d = np.array([model.joint(j).dofadr[0] for j in ARM_JOINTS])
        self._jaw_d = model.joint("gripper").dofadr[0]
        self._gripper_ctrl = model.actuator("gripper").id
        self._gripper_range = model.actuator("gripper").ctrlrange.copy()
        self._to_normalized = ctrl_to_normalized

    def read(self) -> Scene:
        data, env = self.env.data, self.env
        rotation = data.site_xmat[self._site].reshape(3, 3)
        site = np.array(data.site_xpos[self._site], dtype=np.float64)
        approach = rotation[:, 0]  # the site's x axis runs out of the gripper along the jaws
        return Scene(
            arm_q=np.array(data.qpos[self._arm_q]), arm_qd=np.array(data.qvel[self._arm_d]),
            tilt=float(np.arccos(np.clip(-approach[2], -1.0, 1.0))), site=site,
            jaw_point=site + rotation @ self._offset, block=np.array(data.sensor("block_pos").data, dtype=np.float64),
            block_start_z=float(env._z_init), commanded=np.array(env._target_ee_pos, dtype=np.float64),
            gripper_command=float(self._to_normalized(data.ctrl[self._gripper_ctrl], self._gripper_range)),
            jaw_speed=abs(float(data.qvel[self._jaw_d])))


def _delta(move: np.ndarray) -> np.ndarray:
    """A position action that moves the IK target by ``move``, never one the env reads as "hold here"."""
    return move if float(np.linalg.norm(move)) >= 1e-5 else NUDGE


class PluginPickExpert:
    """Reactive: :meth:`decide` reads the scene (never its own history) and returns the action and its phase."""

    def __init__(self, scene: PluginScene) -> None:
        self.scene = scene

    def decide(self, observation: Any) -> tuple[np.ndarray, Phase]:
        s = self.scene.read()
        name, move, grasp = self.plan(s)
        action = np.array([*_delta(move), grasp], dtype=np.float32)
        return action, Phase(name, INSTRUCTIONS[name], TARGET)

    @staticmethod
    def plan(s: Scene) -> tuple[str, np.ndarray, float]:
        """The phase, the move of the IK target (metres) and the gripper command for scene ``s``."""
        block = s.block
        hover = block + np.array([GRASP_DX, 0.0, HOVER])
        grasp_at = block + np.array([GRASP_DX, 0.0, GRASP_DZ])
        in_jaws = float(np.linalg.norm(s.jaw_point - block)) < HOLDING
        near = s.jaw_point[2] - block[2] < LOST  # a closed gripper away from the block is just opened below
        if s.gripper_command < CLOSED_BELOW and near:  # closing or closed at the block
            lifted = block[2] > s.block_start_z + 0.005
            if lifted or (in_jaws and s.jaw_speed < JAW_SETTLED and s.gripper_command <= GRASP_COMMAND + 1e-6):
                return "lift", np.array([0.0, 0.0, LIFT_STEP]), GRASP_COMMAND
            if in_jaws:
                return "grasp", np.zeros(3), GRASP_COMMAND
            return "release", block + np.array([0.0, 0.0, 0.1]) - s.jaw_point, OPEN
        return_to = block + np.array([0.0, 0.0, RETURN_HEIGHT])
        returned = float(np.linalg.norm(s.commanded - return_to)) < RETURNED  # the jump back was commanded
        if returned and not s.settled:
            return "stretch", return_to - s.commanded, OPEN  # on the way back from the stretch: hold the jump
        if s.arm_q[2] < STRETCHED_ELBOW:
            return "stretch", return_to - s.commanded, OPEN  # stretched: jump back above the block
        if not returned and s.commanded[2] > block[2] + HIGH and s.tilt > TILT_OK:
            return "stretch", STRETCH_TO - s.commanded, OPEN
        if float(np.linalg.norm(s.jaw_point[:2] - hover[:2])) > ALIGN and s.jaw_point[2] > grasp_at[2] + DESCENDED:
            return "reach", hover - s.jaw_point, OPEN
        if s.jaw_point[2] > grasp_at[2] + DESCENDED and not (s.settled and s.jaw_point[2] < block[2] + 0.02):
            return "descend", grasp_at - s.jaw_point, OPEN
        return "grasp", np.zeros(3), GRASP_COMMAND


# --------------------------------------------------------------------------------------------- options
def check_plugin() -> None:
    """The plugin is installed at the version this task is written for; a clear error otherwise."""
    check_installed(PLUGIN, SUPPORTED_PLUGIN, NAME, missing=f"pip install {PLUGIN}=={SUPPORTED_PLUGIN}",
                    install=f"pip install {PLUGIN}=={SUPPORTED_PLUGIN}")


def check(options: Mapping[str, Any]) -> None:
    length = options["episode_length"]
    if not 1 <= length <= MAX_EPISODE_LENGTH:
        raise TaskOptionError(f"{NAME} option 'episode_length' must be in 1..{MAX_EPISODE_LENGTH} (LeRobot's "
                              f"--env.episode_length; its default is {EPISODE_LENGTH}), got {length!r}")
    check_plugin()


def describe(options: Mapping[str, Any]) -> TaskInfo:
    image_obs = bool(options["image_obs"])
    # With image_obs the plugin's env drops the block position for the camera (LeRobot then gives no env state)
    states = {STATE_KEY: (len(STATE_NAMES),)} | ({} if image_obs else {ENV_STATE_KEY: (len(BLOCK_NAMES),)})
    names = {STATE_KEY: STATE_NAMES, "action": ACTION_NAMES} | ({} if image_obs else {ENV_STATE_KEY: BLOCK_NAMES})
    return TaskInfo(
        name=NAME, description=f"lerobot-env-so101's {GYM_TASK} (LeRobot's --env.type=so101): an SO-101 with "
                               "position-only IK picks a 4 cm cube; a reactive expert (stretch, reach, descend, "
                               "grasp, lift)",
        instruction=INSTRUCTION, fps=FPS, action_shape=(len(ACTION_NAMES),), state_shapes=states,
        cameras=(CameraSpec(CAMERA, IMAGE_SIZE, IMAGE_SIZE),) if image_obs else (), segment_names=SEGMENT_NAMES,
        options=dict(options), action_names=ACTION_NAMES, robot_type="so101", labels_any_state=True,
        feature_names=names)


def lerobot_config(options: Mapping[str, Any]) -> Any:
    """The plugin's LeRobot env config for these options: what ``--env.type=so101`` with the same
    ``--env.random_block_position``, ``--env.image_obs`` and ``--env.episode_length`` builds."""
    from lerobot_env_so101.configuration_so101 import SO101Env

    return SO101Env(task=GYM_TASK, fps=FPS, episode_length=int(options["episode_length"]),
                    image_obs=bool(options["image_obs"]),
                    random_block_position=bool(options["random_block_position"]))


def make_plugin_env(options: Mapping[str, Any]) -> gym.Env:
    """The env exactly as LeRobot's config makes it (its gym id, kwargs and step limit)."""
    import lerobot_env_so101  # noqa: F401 - registers lerobot_env_so101/ with gymnasium

    config = lerobot_config(options)
    return gym.make(config.gym_id, disable_env_checker=config.disable_env_checker, **config.gym_kwargs)


# ----------------------------------------------------------------------------------------------- the task
class So101PluginPickCube(gym.Wrapper):
    """The plugin's env as a demoforge task: the reactive expert's segments; the env's success ends the episode."""

    def __init__(self, options: Mapping[str, Any]) -> None:
        self._image_obs = bool(options["image_obs"])
        self._gl = GL_LOCK if self._image_obs else nullcontext()  # the env renders in reset and step
        super().__init__(make_plugin_env(options))
        self.scene = PluginScene(self.env.unwrapped)
        self.expert = PluginPickExpert(self.scene)
        self._last: Any = None

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Any, dict]:
        with self._gl:
            self._last, info = self.env.reset(seed=seed, options=options)
        return self._last, info

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict]:
        with self._gl:
            self._last, reward, terminated, truncated, info = self.env.step(np.asarray(action, dtype=np.float32))
        return self._last, float(reward), terminated, truncated, info

    def close(self) -> None:
        with self._gl:
            self.env.close()

    # -- task protocol
    def create_demo_segments(self) -> Iterator[Segment]:
        for segment in reactive_segments(self.expert, lambda: self._last):
            yield dataclasses.replace(segment, validator=self._validator(segment.name))

    def _validator(self, name: str) -> Callable[[StepView], bool]:
        """What each phase must leave, read from the simulator when it ends."""
        def check(view: StepView) -> bool:
            s = self.scene.read()
            resting = abs(s.block[2] - s.block_start_z) < 0.005  # the block is still down on the table
            if name in ("stretch", "release"):
                return resting and s.gripper_command > CLOSED_BELOW
            if name == "reach":
                return resting and float(np.linalg.norm(s.jaw_point[:2] - s.block[:2])) < HOLDING
            if name == "descend":
                return resting and float(np.linalg.norm(s.jaw_point - s.block)) < HOLDING
            if name == "grasp":
                return float(np.linalg.norm(s.jaw_point - s.block)) < HOLDING
            return bool(view.info.get("succeed"))  # lift: it ends with the env's success, or the cube was dropped
        return check

    def demo_record(self, observation: Mapping[str, Any]) -> RecordedObservation:
        state = {STATE_KEY: np.asarray(observation["agent_pos"], dtype=np.float32)}
        if self._image_obs:
            return RecordedObservation(state=state, images={CAMERA: np.asarray(observation["pixels"][CAMERA])})
        return RecordedObservation(state={**state,
                                          ENV_STATE_KEY: np.asarray(observation["environment_state"], np.float32)})

    def demo_success(self, observation: Any, info: Mapping[str, Any]) -> bool:
        return bool(info.get("succeed", False))

    def demo_hold_action(self) -> np.ndarray:
        """No motion (the env holds the pose it reached) and the gripper as commanded."""
        return np.array([0.0, 0.0, 0.0, self.scene.read().gripper_command], dtype=np.float32)

    def demo_instruction(self) -> str:
        return INSTRUCTION


ENTRY = register(TaskEntry(name=NAME, defaults=DEFAULTS, describe=describe, make_env=So101PluginPickCube,
                           check=check))
