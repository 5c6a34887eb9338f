"""What every robosuite task shares: the env as robomimic recorded it, seeded as robosuite seeds it, wrapped in
the task protocol; a task module adds only its expert, its features and its checks (a :class:`RobosuiteSpec`).

The env is built as robomimic's datasets were recorded: the Panda arm with robosuite's own operational-space
controller (``OSC_POSE``, delta end-effector actions in [-1, 1]: 5 cm and 0.5 rad a step at full scale, then
the gripper, -1 open and +1 closed), 20 Hz, cameras ``agentview`` and ``robot0_eye_in_hand`` (84x84 by default).
Images are stored upright (robosuite renders in OpenGL's bottom-up convention; they are flipped once).

Each reset with a seed reseeds the env's generator (``env.rng``: object sizes, placements and the robot's
initial-joint noise are drawn from it) and reloads the model as the constructor does, so episode ``seed`` is the
scene a plain ``robosuite.make(..., seed=seed, hard_reset=False)`` gives at its first reset. A randomized
episode reloads before its scene is drawn (``SceneRandomization.before_draw``), so the draw lands on the model
the episode runs.
"""

from __future__ import annotations

import dataclasses
import logging
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterator, Mapping
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym
import numpy as np

from demoforge.pipeline.reactive import ReactiveExpert, reactive_segments
from demoforge.pipeline.tasks.mujoco_gl import ANTIALIAS, GL_LOCK
from demoforge.pipeline.tasks.randomization import SceneRandomization
from demoforge.pipeline.tasks.registry import (
    CameraSpec,
    TaskEntry,
    TaskInfo,
    TaskOptionError,
    check_installed,
    register,
)
from demoforge.stages.contract import RecordedObservation, Segment, StepView
from demoforge.stages.task_protocol import Pose

SUPPORTED_ROBOSUITE = "1.5.2"
FPS = 20  # robomimic's control frequency
CAMERAS = ("agentview", "robot0_eye_in_hand")  # the cameras robomimic's image datasets record
FIXED_CAMERAS = ("agentview",)  # of those, the one not carried by the robot (what camera randomization moves)
IMAGE_SIZE_RANGE = (32, 512)
STATE_KEY = "observation.state"
ENV_STATE_KEY = "observation.environment_state"
ROBOT_PARTS = (("robot0_eef_pos", ("x", "y", "z")), ("robot0_eef_quat", ("x", "y", "z", "w")),
               ("robot0_gripper_qpos", ("right", "left")))  # robomimic's proprioception keys
ACTION_NAMES = ("dx", "dy", "dz", "droll", "dpitch", "dyaw", "gripper")
OSC_SCALE = 0.05  # robosuite's OSC_POSE output_max for position: metres per unit of action
OSC_TURN = 0.5  # its output_max for rotation: radians per unit of action
ROBOT_ROOTS = ("robot0_*", "mount0_*", "gripper0_*")

Parts = tuple[tuple[str, tuple[str, ...]], ...]


def lifted_from_the_grasp(segment: str, target: str | None) -> str | None:
    """The multiply reference of every robomimic task's segments: a segment moves with its target, except
    ``lift``, which goes up from wherever the grasp ended (no reference object)."""
    return None if segment == "lift" else target


@dataclass(frozen=True)
class RobosuiteSpec:
    """One robosuite task: which env, what its expert does, what is recorded and checked."""

    name: str  # the demoforge task name, e.g. "robosuite-can"
    env_name: str  # robosuite.make's environment, e.g. "PickPlace"
    description: str
    instruction: str
    horizon: int  # robomimic's horizon for the task: the bound of option max_steps
    segment_names: tuple[str, ...]
    object_parts: Parts  # observation keys -> axis names, recorded as observation.environment_state
    objects: Callable[[Any], Mapping[str, Pose]]  # robosuite env -> each target's world pose (multiply)
    make_expert: Callable[[], ReactiveExpert]
    validator: Callable[[Any, str], bool]  # (robosuite env, segment name) -> that segment's end state holds
    instructions: Mapping[str, str]  # per segment
    reference: Callable[[str, str | None], str | None] = lifted_from_the_grasp
    env_args: Mapping[str, Any] = field(default_factory=dict)  # further robosuite.make arguments
    state_parts: Parts = ROBOT_PARTS
    object_roots: tuple[str, ...] = ("*_main",)  # the root bodies of the task's objects (colours, physics)
    table_roots: tuple[str, ...] = ("table",)  # the root bodies of the furniture (a colour group)
    init_limit: float = 1.5  # the widest placement widening (randomize.init.scale) the task's scene allows

    @property
    def defaults(self) -> dict[str, Any]:
        return {"camera": ",".join(CAMERAS), "image_size": 84, "max_steps": self.horizon, ANTIALIAS: True}


def names(parts: Parts) -> tuple[str, ...]:
    return tuple(f"{key}.{axis}" for key, axes in parts for axis in axes)


# ------------------------------------------------------------------------------------------- options
def cameras(options: Mapping[str, Any]) -> tuple[str, ...]:
    raw = str(options["camera"]).strip()
    return () if raw == "none" else tuple(c.strip() for c in raw.split(",") if c.strip())


def check_version(task: str) -> None:
    check_installed("robosuite", SUPPORTED_ROBOSUITE, task, missing="bash tools/setup.sh installs it",
                    install=f"pip install --no-deps robosuite=={SUPPORTED_ROBOSUITE}")


def check(spec: RobosuiteSpec, options: Mapping[str, Any]) -> None:
    chosen = cameras(options)
    if [c for c in chosen if c not in CAMERAS] or len(set(chosen)) != len(chosen) or \
            (not chosen and str(options["camera"]).strip() != "none"):
        raise TaskOptionError(f"{spec.name} option 'camera' must be one or more of {', '.join(CAMERAS)} "
                              f"(comma-separated, each once) or none; got {options['camera']!r}")
    low, high = IMAGE_SIZE_RANGE
    if not low <= options["image_size"] <= high:
        raise TaskOptionError(f"{spec.name} option 'image_size' must be in {low}..{high}, got "
                              f"{options['image_size']!r}")
    if not 1 <= options["max_steps"] <= spec.horizon:
        raise TaskOptionError(f"{spec.name} option 'max_steps' must be in 1..{spec.horizon} (robomimic's horizon), "
                              f"got {options['max_steps']!r}")
    if not isinstance(options[ANTIALIAS], bool):
        raise TaskOptionError(f"{spec.name} option 'antialias' must be true or false, got {options[ANTIALIAS]!r}")
    check_version(spec.name)


def describe(spec: RobosuiteSpec, options: Mapping[str, Any]) -> TaskInfo:
    size = int(options["image_size"])
    state, objects = names(spec.state_parts), names(spec.object_parts)
    return TaskInfo(
        name=spec.name, description=spec.description, instruction=spec.instruction, fps=FPS,
        action_shape=(len(ACTION_NAMES),), state_shapes={STATE_KEY: (len(state),), ENV_STATE_KEY: (len(objects),)},
        cameras=tuple(CameraSpec(c, size, size) for c in cameras(options)), segment_names=spec.segment_names,
        options=dict(options), action_names=ACTION_NAMES, robot_type="panda", labels_any_state=True,
        feature_names={STATE_KEY: state, ENV_STATE_KEY: objects, "action": ACTION_NAMES})


# ------------------------------------------------------------------------------------------ the env
def env_kwargs(spec: RobosuiteSpec, options: Mapping[str, Any]) -> dict[str, Any]:
    """The arguments of ``robosuite.make(spec.env_name, **kwargs)`` for these options (a test builds a plain env
    with them). ``hard_reset=False``: a reset restores the loaded model's state instead of recompiling the XML."""
    from robosuite.controllers import load_composite_controller_config

    chosen, size = list(cameras(options)), int(options["image_size"])
    return {"robots": "Panda", "controller_configs": load_composite_controller_config(controller="BASIC",
                                                                                      robot="Panda"),
            "has_renderer": False, "has_offscreen_renderer": bool(chosen), "use_camera_obs": bool(chosen),
            "camera_names": chosen or "agentview", "camera_heights": size, "camera_widths": size,
            "control_freq": FPS, "horizon": int(options["max_steps"]), "ignore_done": False,
            "reward_shaping": False, "hard_reset": False, **spec.env_args}


# robosuite's logger says these on every import and env build; none concerns a Panda with OSC_POSE, and a CLI
# run would print them all. Its other warnings and errors pass.
_IRRELEVANT = ("setup_macros.py", "macro file", "robosuite_models", "mink-based whole-body IK",
               "but the robot does not have this component")


def _quiet_robosuite(record: logging.LogRecord) -> bool:
    return record.levelno >= logging.WARNING and not any(s in record.getMessage() for s in _IRRELEVANT)


logging.getLogger("robosuite_logs").addFilter(_quiet_robosuite)  # before robosuite is imported: its import logs


def make_suite_env(spec: RobosuiteSpec, options: Mapping[str, Any], seed: int | None = None) -> Any:
    import robosuite

    return robosuite.make(spec.env_name, seed=seed, **env_kwargs(spec, options))


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


def samplers(env: Any) -> list[Any]:
    """The env's placement samplers: its initializer and, for a composite one, each of its parts."""
    found, pending = [], [getattr(env, "placement_initializer", None)]
    while pending:
        sampler = pending.pop()
        if sampler is not None:
            found.append(sampler)
            pending.extend(getattr(sampler, "samplers", {}).values())
    return found


def reseed(env: Any, seed: int) -> None:
    """Put the env where ``robosuite.make(..., seed=seed)`` leaves it for its first reset: its generator seeded,
    then drawn from by the model load (object sizes) and the internal reset (placement, initial-joint noise)
    the constructor runs; robosuite's own hard reset does exactly that load and internal reset. Samplers kept
    across loads (Lift's) hold the generator they were built with: they get the new one."""
    env.rng = np.random.default_rng(seed)
    for sampler in samplers(env):
        sampler.rng = env.rng
    env.hard_reset = True
    try:
        free_renderer(env)  # the reload makes a new sim and render context
        env.reset()
    finally:
        env.hard_reset = False


# ------------------------------------------------------------------------------------- orientation
def yaw(quaternion_xyzw: np.ndarray) -> float:
    """The heading of a body's x axis about the world's z (quaternion x, y, z, w, as robosuite observes it)."""
    x, y, z, w = (float(v) for v in quaternion_xyzw)
    return float(np.arctan2(2 * (x * y + z * w), 1 - 2 * (y * y + z * z)))


def rotation(quaternion_wxyz: np.ndarray) -> np.ndarray:
    import mujoco

    matrix = np.zeros(9)
    mujoco.mju_quat2Mat(matrix, np.asarray(quaternion_wxyz, dtype=np.float64))
    return matrix.reshape(3, 3)


def quaternion(matrix: np.ndarray) -> np.ndarray:
    import mujoco

    result = np.zeros(4)
    mujoco.mju_mat2Quat(result, np.asarray(matrix, dtype=np.float64).reshape(-1))
    return result


def _axis_angle_matrix(vector: np.ndarray) -> np.ndarray:
    import mujoco

    angle = float(np.linalg.norm(vector))
    result = np.array([1.0, 0.0, 0.0, 0.0])
    if angle > 1e-12:
        mujoco.mju_axisAngle2Quat(result, vector / angle, angle)
    return rotation(result)


def _matrix_axis_angle(matrix: np.ndarray) -> np.ndarray:
    import mujoco

    velocity = np.zeros(3)  # mju_quat2Vel: the rotation vector of a quaternion (over dt=1)
    mujoco.mju_quat2Vel(velocity, quaternion(matrix), 1.0)
    return velocity


def body_pose(env: Any, body: str) -> Pose:
    """A body's world pose (quaternion w, x, y, z)."""
    data, index = env.sim.data, env.sim.model.body_name2id(body)
    return Pose(np.array(data.body_xpos[index], dtype=np.float64), np.array(data.body_xquat[index], dtype=np.float64))


class OscPoses:
    """What ``demoforge multiply`` reads and commands of robosuite's Panda (stages/task_protocol.py
    ``TaskPoses``). OSC_POSE takes a delta from the pose reached: the position moves by ``action[:3]`` x 5 cm,
    the orientation turns by the axis-angle ``action[3:6]`` x 0.5 rad, both in the robot's base frame (the world's
    axes: robomimic's tasks do not rotate the base), each clipped to [-1, 1]. The end effector is robosuite's
    grip site, the pose OSC controls."""

    follows_plan = False  # a reactive expert

    def __init__(self, env: Any, spec: RobosuiteSpec) -> None:
        self.env, self.task_spec = env, spec

    def _site(self) -> tuple[np.ndarray, np.ndarray]:
        data, site = self.env.sim.data, self.env.robots[0].eef_site_id["right"]
        return np.array(data.site_xpos[site], dtype=np.float64), np.array(data.site_xmat[site]).reshape(3, 3)

    def eef_pose(self) -> Pose:
        position, matrix = self._site()
        return Pose(position, quaternion(matrix))

    def object_poses(self) -> dict[str, Pose]:
        return dict(self.task_spec.objects(self.env))

    def reference(self, segment: str, target: str | None) -> str | None:
        return self.task_spec.reference(segment, target)

    def gripper(self, action: np.ndarray) -> float:
        return float(np.asarray(action, dtype=np.float64).reshape(-1)[6])

    def commanded_pose(self, action: np.ndarray) -> Pose:
        values = np.clip(np.asarray(action, dtype=np.float64).reshape(-1), -1.0, 1.0)
        position, matrix = self._site()
        turned = _axis_angle_matrix(values[3:6] * OSC_TURN) @ matrix
        return Pose(position + values[:3] * OSC_SCALE, quaternion(turned))

    def action_toward(self, pose: Pose, gripper: float) -> np.ndarray:
        position, matrix = self._site()
        turn = _matrix_axis_angle(rotation(pose.quaternion) @ matrix.T)
        move = np.concatenate([(pose.position - position) / OSC_SCALE, turn / OSC_TURN])
        return np.append(np.clip(move, -1.0, 1.0), np.clip(gripper, -1.0, 1.0)).astype(np.float32)


class RobosuiteTask(gym.Env):
    """A robosuite env as a gymnasium env with the task protocol (observations stay robosuite's dicts)."""

    metadata: dict[str, Any] = {"render_modes": []}

    def __init__(self, spec: RobosuiteSpec, options: Mapping[str, Any]) -> None:
        self.task_spec = spec
        self._cameras = cameras(options)
        self._gl = GL_LOCK if self._cameras else nullcontext()
        with self._gl:
            self.suite_env = make_suite_env(spec, options)
            if not options[ANTIALIAS]:
                self.suite_env.set_xml_processor(_without_multisampling)
                reseed(self.suite_env, 0)  # reloads the model through the processor
        low, high = self.suite_env.action_spec
        self.action_space = gym.spaces.Box(low.astype(np.float32), high.astype(np.float32), dtype=np.float32)
        self.observation_space = gym.spaces.Dict({})
        self.expert = spec.make_expert()
        self._last: Any = None
        self._loaded: int | None = None  # the seed whose model a randomized scene loaded before its draw
        self._nominal_ranges: dict[int, tuple[Any, np.ndarray, np.ndarray]] = {}

    # -- gym API
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Any, dict]:
        super().reset(seed=seed)
        with self._gl:
            if seed is not None and seed != self._loaded:
                reseed(self.suite_env, seed)
            self._loaded = None
            self._current()
            self._last = self.suite_env.reset()
        return self._last, {}

    def load(self, seed: int) -> None:
        """Load the model episode ``seed`` runs, ahead of its reset (a randomized scene draws on it)."""
        with self._gl:
            reseed(self.suite_env, seed)
        self._loaded = seed

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

    def widen_placement(self, scale: float) -> dict[str, Any]:
        """Widen each placement sampler's x and y ranges about their centres by ``scale`` (from the ranges the
        task was built with, however often this is called)."""
        widened: dict[str, Any] = {}
        for sampler in samplers(self.suite_env):
            if not hasattr(sampler, "x_range"):
                continue
            kept = self._nominal_ranges.get(id(sampler))
            if kept is None or kept[0] is not sampler:
                kept = self._nominal_ranges[id(sampler)] = (sampler, np.array(sampler.x_range, dtype=np.float64),
                                                            np.array(sampler.y_range, dtype=np.float64))
            _, x_range, y_range = kept
            sampler.x_range = list(x_range.mean() + (x_range - x_range.mean()) * scale)
            sampler.y_range = list(y_range.mean() + (y_range - y_range.mean()) * scale)
            widened[str(sampler.name)] = {"x_range": sampler.x_range, "y_range": sampler.y_range}
        return widened

    # -- task protocol
    def create_demo_segments(self) -> Iterator[Segment]:
        for segment in reactive_segments(self.expert, lambda: self._last):
            yield dataclasses.replace(segment, validator=self._validator(segment.name))

    def _validator(self, name: str) -> Callable[[StepView], bool]:
        env, validator = self.suite_env, self.task_spec.validator
        return lambda _view: bool(validator(env, name))

    def demo_record(self, observation: Mapping[str, np.ndarray]) -> RecordedObservation:
        state = np.concatenate([observation[key] for key, _ in self.task_spec.state_parts]).astype(np.float32)
        objects = np.concatenate([observation[key] for key, _ in self.task_spec.object_parts]).astype(np.float32)
        images = {c: np.ascontiguousarray(observation[f"{c}_image"][::-1]) for c in self._cameras}
        return RecordedObservation(state={STATE_KEY: state, ENV_STATE_KEY: objects}, images=images)

    def demo_success(self, observation: Any, info: Mapping[str, Any]) -> bool:
        return bool(self.suite_env._check_success())

    def demo_hold_action(self) -> np.ndarray:
        return np.zeros(len(ACTION_NAMES), dtype=np.float32)

    def demo_instruction(self) -> str:
        return self.task_spec.instruction

    def demo_poses(self) -> OscPoses:
        return OscPoses(self.suite_env, self.task_spec)


# ---------------------------------------------------------------------------------- randomization
def _task(env: gym.Env) -> RobosuiteTask:
    task = env.unwrapped
    assert isinstance(task, RobosuiteTask)
    return task


def scene(spec: RobosuiteSpec) -> SceneRandomization:
    """What may vary per episode: lights, colours (table, robot, objects), the fixed camera, the objects'
    friction, mass and damping, and the placement ranges robosuite samples objects from (widened)."""
    return SceneRandomization(
        model=lambda env: _task(env).suite_env.sim.model._model,
        color_groups={"table": spec.table_roots, "robot": ROBOT_ROOTS, "objects": spec.object_roots},
        cameras=lambda env: [c for c in _task(env)._cameras if c in FIXED_CAMERAS] or list(FIXED_CAMERAS),
        bodies=spec.object_roots, init=lambda env, scale: _task(env).widen_placement(scale),
        before_draw=lambda env, seed: _task(env).load(seed),
        limits={"randomize.init.scale": spec.init_limit})


def register_robosuite(spec: RobosuiteSpec) -> TaskEntry:
    """Register ``spec`` as a built-in task: its options, description, env and scene randomization."""
    return register(TaskEntry(
        name=spec.name, defaults=spec.defaults, describe=lambda options: describe(spec, options),
        make_env=lambda options: RobosuiteTask(spec, options), check=lambda options: check(spec, options),
        randomization=scene(spec), appearance_options=frozenset({"camera", "image_size", ANTIALIAS})))
