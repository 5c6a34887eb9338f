"""Built-in task ``robosuite-lift``: robosuite 1.5.2's Lift (robomimic's "lift" task) with a reactive expert.

The env is built as robomimic's datasets were recorded: the Panda arm with robosuite's own operational-space
controller (``OSC_POSE``, delta end-effector actions in [-1, 1]: 5 cm and 0.5 rad a step at full scale, then
the gripper, -1 open and +1 closed), 20 Hz, horizon 500, cameras ``agentview`` and ``robot0_eye_in_hand``
(84x84). The recorded features carry robomimic's observation names: ``observation.state`` is
``robot0_eef_pos``, ``robot0_eef_quat`` and ``robot0_gripper_qpos``; ``observation.environment_state`` is the
env's ``object-state`` (``cube_pos``, ``cube_quat``, ``gripper_to_cube_pos``). Images are stored upright
(robosuite renders in OpenGL's bottom-up convention; they are flipped once, as LeRobot videos are viewed).

Each reset with a seed reseeds the env's generator (``env.rng``: the cube's size, its placement and the robot's
initial-joint noise are drawn from it) and reloads the model as the constructor does, so episode ``seed`` is the
scene a plain ``robosuite.make(..., seed=seed, hard_reset=False)`` gives at its first reset. The expert decides
from each observation (turn to the cube's yaw and reach above it, descend, close, lift); its phases are the
segments, each targeting ``cube``, each checked by a validator that reads the simulator. Success is robosuite's
own ``_check_success`` (the cube 4 cm above the table); the
episode ends at the first step where it holds.
"""

from __future__ import annotations

import dataclasses
import logging
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterator, Mapping
from contextlib import nullcontext
from typing import Any

import gymnasium as gym
import numpy as np

from demoforge.pipeline.reactive import Phase, reactive_segments
from demoforge.pipeline.tasks.mujoco_gl import ANTIALIAS, GL_LOCK
from demoforge.pipeline.tasks.registry import (
    CameraSpec,
    TaskDefinitionError,
    TaskEntry,
    TaskInfo,
    TaskOptionError,
    register,
)
from demoforge.stages.contract import RecordedObservation, Segment, StepView
from demoforge.stages.task_protocol import Pose

NAME = "robosuite-lift"
SUPPORTED_ROBOSUITE = "1.5.2"
FPS = 20  # robomimic's control frequency
HORIZON = 500  # robomimic's Lift horizon
CAMERAS = ("agentview", "robot0_eye_in_hand")  # the cameras robomimic's image datasets record
DEFAULTS: Mapping[str, Any] = {"camera": ",".join(CAMERAS), "image_size": 84, "max_steps": HORIZON, ANTIALIAS: True}
IMAGE_SIZE_RANGE = (32, 512)
STATE_KEY = "observation.state"
ENV_STATE_KEY = "observation.environment_state"
STATE_PARTS = (("robot0_eef_pos", ("x", "y", "z")), ("robot0_eef_quat", ("x", "y", "z", "w")),
               ("robot0_gripper_qpos", ("right", "left")))
OBJECT_PARTS = (("cube_pos", ("x", "y", "z")), ("cube_quat", ("x", "y", "z", "w")),
                ("gripper_to_cube_pos", ("x", "y", "z")))
ACTION_NAMES = ("dx", "dy", "dz", "droll", "dpitch", "dyaw", "gripper")
SEGMENT_NAMES = ("reach", "grasp", "lift")
TARGET = "cube"
INSTRUCTION = "lift the cube"
INSTRUCTIONS = {"reach": "move the open gripper around the cube", "grasp": "close the gripper on the cube",
                "lift": "lift the cube off the table"}
# The expert's thresholds (metres): the gripper site within NEAR of the cube's centre counts as around it;
# ABOVE is the height it approaches from until it is within ALIGN of the cube horizontally.
NEAR, ALIGN, ABOVE, LIFT_TO = 0.012, 0.012, 0.06, 0.12
OSC_SCALE = 0.05  # robosuite's OSC_POSE output_max for position: metres per unit of action
OSC_TURN = 0.5  # its output_max for rotation: radians per unit of action
FACING = 0.08  # radians of yaw error the expert descends with
CLOSED_ON_CUBE = 0.05  # finger gap (m) below which closed fingers hold the cube (the cube is 4-4.4 cm wide)


def _names(parts: tuple[tuple[str, tuple[str, ...]], ...]) -> tuple[str, ...]:
    return tuple(f"{key}.{axis}" for key, axes in parts for axis in axes)


STATE_NAMES, OBJECT_NAMES = _names(STATE_PARTS), _names(OBJECT_PARTS)


# ------------------------------------------------------------------------------------------- options
def _cameras(options: Mapping[str, Any]) -> tuple[str, ...]:
    raw = str(options["camera"]).strip()
    return () if raw == "none" else tuple(c.strip() for c in raw.split(",") if c.strip())


def check_version() -> None:
    import importlib.metadata

    try:
        installed = importlib.metadata.version("robosuite")
    except importlib.metadata.PackageNotFoundError:
        raise TaskDefinitionError(f"robosuite is not installed; {NAME} needs robosuite=={SUPPORTED_ROBOSUITE} "
                                  "(bash tools/setup.sh installs it)") from None
    if installed != SUPPORTED_ROBOSUITE:
        raise TaskDefinitionError(f"robosuite {installed} is installed; {NAME} is written for robosuite=="
                                  f"{SUPPORTED_ROBOSUITE}: pip install --no-deps robosuite=={SUPPORTED_ROBOSUITE}")


def check(options: Mapping[str, Any]) -> None:
    cameras = _cameras(options)
    if [c for c in cameras if c not in CAMERAS] or len(set(cameras)) != len(cameras) or \
            (not cameras and str(options["camera"]).strip() != "none"):
        raise TaskOptionError(f"{NAME} option 'camera' must be one or more of {', '.join(CAMERAS)} "
                              f"(comma-separated, each once) or none; got {options['camera']!r}")
    low, high = IMAGE_SIZE_RANGE
    if not low <= options["image_size"] <= high:
        raise TaskOptionError(f"{NAME} option 'image_size' must be in {low}..{high}, got {options['image_size']!r}")
    if not 1 <= options["max_steps"] <= HORIZON:
        raise TaskOptionError(f"{NAME} option 'max_steps' must be in 1..{HORIZON} (robomimic's horizon), got "
                              f"{options['max_steps']!r}")
    if not isinstance(options[ANTIALIAS], bool):
        raise TaskOptionError(f"{NAME} option 'antialias' must be true or false, got {options[ANTIALIAS]!r}")
    check_version()


def describe(options: Mapping[str, Any]) -> TaskInfo:
    size = int(options["image_size"])
    return TaskInfo(
        name=NAME, description="robosuite Lift (robomimic's lift): a Panda with OSC_POSE delta control lifts a "
                               "cube; a reactive expert (reach, grasp, lift)",
        instruction=INSTRUCTION, fps=FPS, action_shape=(len(ACTION_NAMES),),
        state_shapes={STATE_KEY: (len(STATE_NAMES),), ENV_STATE_KEY: (len(OBJECT_NAMES),)},
        cameras=tuple(CameraSpec(c, size, size) for c in _cameras(options)), segment_names=SEGMENT_NAMES,
        options=dict(options), action_names=ACTION_NAMES, robot_type="panda", labels_any_state=True,
        feature_names={STATE_KEY: STATE_NAMES, ENV_STATE_KEY: OBJECT_NAMES, "action": ACTION_NAMES})


# ------------------------------------------------------------------------------------------ the env
def env_kwargs(options: Mapping[str, Any]) -> dict[str, Any]:
    """The arguments of ``robosuite.make("Lift", **kwargs)`` for these options (a test builds a plain env with
    them). ``hard_reset=False``: a reset restores the loaded model's state instead of recompiling the XML."""
    from robosuite.controllers import load_composite_controller_config

    cameras, size = list(_cameras(options)), int(options["image_size"])
    return {"robots": "Panda", "controller_configs": load_composite_controller_config(controller="BASIC",
                                                                                      robot="Panda"),
            "has_renderer": False, "has_offscreen_renderer": bool(cameras), "use_camera_obs": bool(cameras),
            "camera_names": cameras or "agentview", "camera_heights": size, "camera_widths": size,
            "control_freq": FPS, "horizon": int(options["max_steps"]), "ignore_done": False,
            "reward_shaping": False, "hard_reset": False}


# robosuite's logger says these on every import and env build; none concerns a Panda with OSC_POSE, and a CLI
# run would print them all. Its other warnings and errors pass.
_IRRELEVANT = ("setup_macros.py", "macro file", "robosuite_models", "mink-based whole-body IK",
               "but the robot does not have this component")


def _quiet_robosuite(record: logging.LogRecord) -> bool:
    return record.levelno >= logging.WARNING and not any(s in record.getMessage() for s in _IRRELEVANT)


logging.getLogger("robosuite_logs").addFilter(_quiet_robosuite)  # before robosuite is imported: its import logs


def make_lift(options: Mapping[str, Any], seed: int | None = None) -> Any:
    import robosuite

    return robosuite.make("Lift", seed=seed, **env_kwargs(options))


def _without_multisampling(xml: str) -> str:
    """robosuite's XML processor hook: the model's offscreen renders drawn with ``offsamples`` 0."""
    root = ET.fromstring(xml)
    visual = root.find("visual")
    if visual is None:
        visual = ET.SubElement(root, "visual")
    quality = visual.find("quality")
    if quality is None:
        quality = ET.SubElement(visual, "quality")
    quality.set("offsamples", "0")
    return ET.tostring(root, encoding="unicode")


def free_renderer(env: Any) -> None:
    """Free the env's offscreen GL objects with its own context current (robosuite leaves them to the garbage
    collector, which frees them in whatever context is current then: another env's, or the one a model reload
    just made). Call with :data:`GL_LOCK` held."""
    context = getattr(env.sim, "_render_context_offscreen", None) if env.sim is not None else None
    if context is not None:
        context.gl_ctx.make_current()
        context.con.free()
        context.gl_ctx.free()
        env.sim._render_context_offscreen = None


def reseed(env: Any, seed: int) -> None:
    """Put the env where ``robosuite.make(..., seed=seed)`` leaves it for its first reset: its generator seeded,
    then drawn from by the model load (the cube's size) and the internal reset (placement, initial-joint noise)
    the constructor runs; robosuite's own hard reset does exactly that load and internal reset."""
    env.rng = np.random.default_rng(seed)
    env.placement_initializer.rng = env.rng  # kept across model loads: it holds the generator it was built with
    env.hard_reset = True
    try:
        free_renderer(env)  # the reload makes a new sim and render context
        env.reset()
    finally:
        env.hard_reset = False


def _yaw(quaternion: np.ndarray) -> float:
    """The heading of a body's x axis about the world's z (quaternion x, y, z, w, as robosuite gives it)."""
    x, y, z, w = (float(v) for v in quaternion)
    return float(np.arctan2(2 * (x * y + z * w), 1 - 2 * (y * y + z * z)))


def _yaw_error(observation: Mapping[str, np.ndarray]) -> float:
    """How far the gripper must turn about z to face the cube's sides (modulo a quarter turn: a cube)."""
    turn = _yaw(observation["cube_quat"]) - _yaw(observation["robot0_eef_quat"])
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


def _rotation(quaternion_wxyz: np.ndarray) -> np.ndarray:
    import mujoco

    matrix = np.zeros(9)
    mujoco.mju_quat2Mat(matrix, np.asarray(quaternion_wxyz, dtype=np.float64))
    return matrix.reshape(3, 3)


def _quaternion(matrix: np.ndarray) -> np.ndarray:
    import mujoco

    quaternion = np.zeros(4)
    mujoco.mju_mat2Quat(quaternion, np.asarray(matrix, dtype=np.float64).reshape(-1))
    return quaternion


def _axis_angle_matrix(rotation: np.ndarray) -> np.ndarray:
    import mujoco

    angle = float(np.linalg.norm(rotation))
    quaternion = np.array([1.0, 0.0, 0.0, 0.0])
    if angle > 1e-12:
        mujoco.mju_axisAngle2Quat(quaternion, rotation / angle, angle)
    return _rotation(quaternion)


def _matrix_axis_angle(matrix: np.ndarray) -> np.ndarray:
    import mujoco

    velocity = np.zeros(3)  # mju_quat2Vel: the rotation vector of a quaternion (over dt=1)
    mujoco.mju_quat2Vel(velocity, _quaternion(matrix), 1.0)
    return velocity


class LiftPoses:
    """What ``demoforge multiply`` reads and commands of robosuite's Panda (stages/task_protocol.py
    ``TaskPoses``). OSC_POSE takes a delta from the pose reached: the position moves by ``action[:3]`` x 5 cm,
    the orientation turns by the axis-angle ``action[3:6]`` x 0.5 rad, both in the robot's base frame (the world's
    axes in Lift: the base is not rotated), each clipped to [-1, 1]. The end effector is robosuite's grip site,
    the pose OSC controls."""

    follows_plan = False  # a reactive expert

    def __init__(self, env: Any) -> None:
        self.env = env

    def _site(self) -> tuple[np.ndarray, np.ndarray]:
        data, site = self.env.sim.data, self.env.robots[0].eef_site_id["right"]
        return np.array(data.site_xpos[site], dtype=np.float64), np.array(data.site_xmat[site]).reshape(3, 3)

    def eef_pose(self) -> Pose:
        position, matrix = self._site()
        return Pose(position, _quaternion(matrix))

    def object_poses(self) -> dict[str, Pose]:
        data, body = self.env.sim.data, self.env.cube_body_id
        return {TARGET: Pose(np.array(data.body_xpos[body]), np.array(data.body_xquat[body]))}

    def reference(self, segment: str, target: str | None) -> str | None:
        return None if segment == "lift" else target  # lifting goes up from wherever the grasp was

    def gripper(self, action: np.ndarray) -> float:
        return float(np.asarray(action, dtype=np.float64).reshape(-1)[6])

    def commanded_pose(self, action: np.ndarray) -> Pose:
        values = np.clip(np.asarray(action, dtype=np.float64).reshape(-1), -1.0, 1.0)
        position, matrix = self._site()
        turned = _axis_angle_matrix(values[3:6] * OSC_TURN) @ matrix
        return Pose(position + values[:3] * OSC_SCALE, _quaternion(turned))

    def action_toward(self, pose: Pose, gripper: float) -> np.ndarray:
        position, matrix = self._site()
        turn = _matrix_axis_angle(_rotation(pose.quaternion) @ matrix.T)
        move = np.concatenate([(pose.position - position) / OSC_SCALE, turn / OSC_TURN])
        return np.append(np.clip(move, -1.0, 1.0), np.clip(gripper, -1.0, 1.0)).astype(np.float32)


class RobosuiteLiftTask(gym.Env):
    """robosuite's Lift as a gymnasium env with the task protocol (observations stay robosuite's dicts)."""

    metadata: dict[str, Any] = {"render_modes": []}

    def __init__(self, options: Mapping[str, Any]) -> None:
        self._cameras = _cameras(options)
        self._gl = GL_LOCK if self._cameras else nullcontext()
        with self._gl:
            self.suite_env = make_lift(options)
            if not options[ANTIALIAS]:
                self.suite_env.set_xml_processor(_without_multisampling)
                reseed(self.suite_env, 0)  # reloads the model through the processor
        low, high = self.suite_env.action_spec
        self.action_space = gym.spaces.Box(low.astype(np.float32), high.astype(np.float32), dtype=np.float32)
        self.observation_space = gym.spaces.Dict({})
        self.expert = LiftExpert()
        self._last: Any = None

    # -- gym API
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Any, dict]:
        super().reset(seed=seed)
        with self._gl:
            if seed is not None:
                reseed(self.suite_env, seed)
            self._current()
            self._last = self.suite_env.reset()
        return self._last, {}

    def _current(self) -> None:
        """Make this env's GL context current: robosuite's render does not (several envs share a thread's GL)."""
        context = getattr(self.suite_env.sim, "_render_context_offscreen", None)
        if context is not None:
            context.gl_ctx.make_current()

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict]:
        with self._gl:
            self._current()
            observation, reward, done, info = self.suite_env.step(np.asarray(action, dtype=np.float64))
        self._last = observation
        success = bool(self.suite_env._check_success())
        return observation, float(reward), success, bool(done and not success), {**info, "success": success}

    def close(self) -> None:
        with self._gl:
            free_renderer(self.suite_env)
            self.suite_env.close()

    # -- task protocol
    def create_demo_segments(self) -> Iterator[Segment]:
        for segment in reactive_segments(self.expert, lambda: self._last):
            yield dataclasses.replace(segment, validator=self._validator(segment.name))

    def _validator(self, name: str) -> Callable[[StepView], bool]:
        """Each phase's end state, read from the simulator: the gripper around the cube, the cube grasped
        (robosuite's own contact check), the cube lifted."""
        env = self.suite_env

        def check(_view: StepView) -> bool:
            if name == "reach":
                grip = env.sim.data.site_xpos[env.robots[0].eef_site_id["right"]]
                return bool(np.linalg.norm(grip - env.sim.data.body_xpos[env.cube_body_id]) < 2 * NEAR)
            if name == "grasp":
                return bool(env._check_grasp(gripper=env.robots[0].gripper, object_geoms=env.cube))
            return bool(env._check_success())
        return check

    def demo_record(self, observation: Mapping[str, np.ndarray]) -> RecordedObservation:
        state = np.concatenate([observation[key] for key, _ in STATE_PARTS]).astype(np.float32)
        objects = np.concatenate([observation[key] for key, _ in OBJECT_PARTS]).astype(np.float32)
        images = {c: np.ascontiguousarray(observation[f"{c}_image"][::-1]) for c in self._cameras}
        return RecordedObservation(state={STATE_KEY: state, ENV_STATE_KEY: objects}, images=images)

    def demo_success(self, observation: Any, info: Mapping[str, Any]) -> bool:
        return bool(self.suite_env._check_success())

    def demo_hold_action(self) -> np.ndarray:
        return np.zeros(len(ACTION_NAMES), dtype=np.float32)

    def demo_instruction(self) -> str:
        return INSTRUCTION

    def demo_poses(self) -> LiftPoses:
        return LiftPoses(self.suite_env)


ENTRY = register(TaskEntry(name=NAME, defaults=DEFAULTS, describe=describe, make_env=RobosuiteLiftTask,
                           check=check, appearance_options=frozenset({"camera", "image_size", ANTIALIAS})))
