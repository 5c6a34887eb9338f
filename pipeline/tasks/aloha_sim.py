"""What gym-aloha's two bimanual tasks share: the one-camera joint env, the end-effector planning copy of the
scene, waypoint keyframes, and a task wrapper whose subclasses add only their plan and their checks.

The joint-controlled envs (14 absolute joint targets) have no expert, so each segment is planned as
end-effector waypoints in the mocap variant of the same scene (the ACT recipe): that copy is synced to the
joint env's live state, driven along the waypoints through its weld constraints, and the joint positions it
passes through become the segment's actions in the joint env. Syncing at every segment start makes the
plan lazy: each segment starts from the pose and object positions the previous one actually left.
"""

from __future__ import annotations

import collections
import functools
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import mujoco as mj
import numpy as np
from dm_control import mujoco as dm_mujoco
from dm_control.rl import control
from gym_aloha.constants import ASSETS_DIR, DT, JOINTS, normalize_puppet_gripper_position
from gym_aloha.env import AlohaEnv
from gym_aloha.tasks.sim_end_effector import BimanualViperXEndEffectorTask
from gymnasium.wrappers import TimeLimit

from demoforge.pipeline.tasks.mujoco_gl import ANTIALIAS, GL_LOCK, set_antialias
from demoforge.pipeline.tasks.randomization import SceneRandomization
from demoforge.pipeline.tasks.registry import (
    CameraSpec,
    TaskEntry,
    TaskInfo,
    TaskOptionError,
    depth_camera,
    fingerprint_options,
    register,
)
from demoforge.stages.contract import RecordedObservation

DEFAULTS: dict[str, Any] = {"image_height": 224, "image_width": 224, "shadows": False, "depth": False,
                            ANTIALIAS: True}
MIN_SIZE, MAX_SIZE = 32, 1080
CAMERA = "top"
DEPTH_CAMERA = "top_depth"  # registry.depth_camera's name for it
FPS = 50
ARMS = ("left", "right")
TABLE_GEOM = "table"
FINGERS = {arm: (f"vx300s_{arm}/10_left_gripper_finger", f"vx300s_{arm}/10_right_gripper_finger")
           for arm in ARMS}
# The shipped weld is too soft under mujoco 3.8 (the arm sags off the mocap target and drops grasps).
WELD_SOLIMP = (0.95, 0.99)
OPEN, CLOSED = 1.0, 0.0  # normalized gripper commands
APPEARANCE = frozenset({"image_height", "image_width", "shadows", "depth", ANTIALIAS})  # options rerender may change


def axis_quat(axis: tuple[float, float, float], degrees: float) -> np.ndarray:
    quat = np.zeros(4)
    mj.mju_axisAngle2Quat(quat, np.asarray(axis, dtype=float), np.deg2rad(degrees))
    return quat


# ---------------------------------------------------------------------------------------- keyframes
@dataclass(frozen=True)
class Keyframe:
    """Where one arm's mocap (its fingertip point) should be at step ``t``, and its gripper command."""

    t: int
    pos: np.ndarray
    quat: np.ndarray
    grip: float


def _slerp(q0: np.ndarray, q1: np.ndarray, u: float) -> np.ndarray:
    """Spherical interpolation along the short arc (mocap quaternions are sign-ambiguous)."""
    q1 = q1 if float(np.dot(q0, q1)) >= 0.0 else -q1
    dot = min(float(np.dot(q0, q1)), 1.0)
    angle = np.arccos(dot)
    if angle < 1e-6:
        out = q0 + u * (q1 - q0)
    else:
        out = (np.sin((1 - u) * angle) * q0 + np.sin(u * angle) * q1) / np.sin(angle)
    return out / np.linalg.norm(out)


def interpolate(frames: list[Keyframe], t: float) -> Keyframe:
    """The pose at step ``t`` between the surrounding keyframes (held after the last one)."""
    if t <= frames[0].t:
        return frames[0]
    for a, b in zip(frames, frames[1:]):
        if t <= b.t:
            u = (t - a.t) / (b.t - a.t)
            return Keyframe(int(t), a.pos + u * (b.pos - a.pos), _slerp(a.quat, b.quat, u),
                            a.grip + u * (b.grip - a.grip))
    return frames[-1]


def segment_keyframes(plan: list[Keyframe], now: Keyframe, end: int) -> list[Keyframe]:
    """The plan between ``now.t`` and ``end``, starting from the arm's actual pose instead of the planned one."""
    inner = [k for k in plan if now.t < k.t < end]
    return [now, *inner, interpolate(plan, end)]


@dataclass(frozen=True)
class ScriptedPhase:
    """One segment of a timeline: steps ``[start, end)``, with the instruction it is recorded with."""

    name: str
    start: int
    end: int
    instruction: str


# ------------------------------------------------------------------------------------- physics helpers
def rounded(vector: np.ndarray) -> list[float]:
    """A JSON-safe copy for segment metadata."""
    return [round(float(v), 5) for v in vector]


def _weld_offsets(model: Any) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Each arm's weld relpose (mocap -> gripper_link), from the end-effector model's equality data."""
    return {arm: (np.array(model.eq_data[i, 3:6]), np.array(model.eq_data[i, 6:10]))
            for i, arm in enumerate(ARMS)}


def tcp_pose(physics: Any, arm: str, offsets: Mapping[str, tuple[np.ndarray, np.ndarray]]
             ) -> tuple[np.ndarray, np.ndarray]:
    """The mocap pose that holds ``arm``'s gripper exactly where it is (zero weld error)."""
    rel_pos, rel_quat = offsets[arm]
    body = f"vx300s_{arm}/gripper_link"
    link_pos = np.array(physics.named.data.xpos[body])
    link_quat = np.array(physics.named.data.xquat[body])
    inverse, quat, rot = np.zeros(4), np.zeros(4), np.zeros(9)
    mj.mju_negQuat(inverse, rel_quat)
    mj.mju_mulQuat(quat, link_quat, inverse)
    mj.mju_quat2Mat(rot, quat)
    return link_pos - rot.reshape(3, 3) @ rel_pos, quat


def commanded_grips(physics: Any) -> dict[str, float]:
    """Each gripper's current normalized position target (the joint env's finger actuator controls)."""
    ctrl = physics.data.ctrl
    return {"left": float(normalize_puppet_gripper_position(ctrl[6])),
            "right": float(normalize_puppet_gripper_position(ctrl[14]))}


def touching(physics: Any, geoms: Iterable[str]) -> set[str]:
    """Names of the geoms in contact with any of ``geoms`` (those themselves left out)."""
    model, data = physics.model, physics.data
    ids = {model.name2id(name, "geom") for name in geoms}
    found: set[str] = set()
    for i in range(data.ncon):
        pair = (int(data.contact[i].geom1), int(data.contact[i].geom2))
        for mine, other in (pair, pair[::-1]):
            if mine in ids and other not in ids:
                found.add(model.id2name(other, "geom"))
    return found


def configure_rendering(physics: Any, height: int, width: int, shadows: bool, antialias: bool) -> None:
    """Size the offscreen buffer for the image, turn shadows off (software shadows cost ~10x on CPU) and
    multisampling off when asked (mujoco_gl.ANTIALIAS)."""
    set_antialias(physics.model, antialias)
    glob = physics.model.vis.global_
    glob.offwidth, glob.offheight = max(int(glob.offwidth), width), max(int(glob.offheight), height)
    if not shadows:
        physics.model.light_castshadow[:] = 0


# --------------------------------------------------------------------------------- the joint env
class OneCameraRendering:
    """A gym-aloha task mixin rendering only the top camera at the configured size.

    The shipped tasks render three 480x640 cameras every step and keep one; that dominates step time.
    """

    def __init__(self, height: int, width: int) -> None:
        super().__init__()
        self._size = (height, width)
        self._camera: dm_mujoco.Camera | None = None

    def get_observation(self, physics: Any) -> collections.OrderedDict:
        obs = collections.OrderedDict()
        obs["qpos"] = self.get_qpos(physics)  # type: ignore[attr-defined]  # gym-aloha's task base class
        obs["qvel"] = self.get_qvel(physics)  # type: ignore[attr-defined]
        obs["env_state"] = self.get_env_state(physics)  # type: ignore[attr-defined]
        with GL_LOCK:
            obs["images"] = {CAMERA: self._camera_of(physics).render()}
        return obs

    def _camera_of(self, physics: Any) -> dm_mujoco.Camera:
        """One camera for the episode's physics, kept across frames: ``physics.render`` builds a new camera
        (and allocates a scene of ~1,000 geoms) every frame, about 12% of a step here; the image is the same
        (each render updates the whole scene from the physics)."""
        camera = self._camera
        if camera is None or camera._physics is not physics:  # noqa: SLF001 (dm_control keeps no public handle)
            self.close_camera()
            height, width = self._size
            camera = self._camera = dm_mujoco.Camera(physics=physics, height=height, width=width, camera_id=CAMERA)
        return camera

    def close_camera(self) -> None:
        if self._camera is not None:
            self._camera._scene.free()  # noqa: SLF001 (what physics.render does with its camera)
            self._camera = None


class OneCameraAlohaEnv(AlohaEnv):
    """gym-aloha's ``AlohaEnv`` for ``scene`` ("transfer_cube" or "insertion") with one rendered camera,
    shadows and multisampling chosen by option; ``task_class`` is the scene's gym-aloha task with
    :class:`OneCameraRendering`."""

    def __init__(self, scene: str, task_class: type, height: int, width: int, shadows: bool,
                 antialias: bool) -> None:
        self._shadows, self._antialias = shadows, antialias
        self._task_class = task_class
        super().__init__(task=scene, obs_type="pixels_agent_pos", observation_height=height,
                         observation_width=width, visualization_height=height, visualization_width=width)

    def _make_env_task(self, task_name: str) -> control.Environment:
        physics = dm_mujoco.Physics.from_xml_path(str(ASSETS_DIR / f"bimanual_viperx_{task_name}.xml"))
        configure_rendering(physics, self.observation_height, self.observation_width, self._shadows,
                            self._antialias)
        task = self._task_class(self.observation_height, self.observation_width)
        return control.Environment(physics, task, float("inf"), control_timestep=DT, n_sub_steps=None,
                                   flat_observation=False)


# ------------------------------------------------------------------------------- the end-effector sim
class EndEffectorSim:
    """The mocap-driven copy of ``scene`` that turns end-effector keyframes into joint trajectories."""

    def __init__(self, scene: str) -> None:
        path = ASSETS_DIR / f"bimanual_viperx_end_effector_{scene}.xml"
        self.physics = dm_mujoco.Physics.from_xml_path(str(path))
        self.physics.model.eq_solimp[:, :2] = WELD_SOLIMP
        self.offsets = _weld_offsets(self.physics.model)
        self.substeps = int(round(DT / float(self.physics.model.opt.timestep)))
        self._task = BimanualViperXEndEffectorTask()

    def sync(self, joint: Any) -> None:
        """Copy the joint env's full dynamic state, with each mocap placed on its gripper (no weld pull).

        Starting from reset data keeps the result a function of the joint state alone (determinism).
        """
        src, dst = joint.data, self.physics.data
        with self.physics.reset_context():
            dst.qpos[:] = src.qpos
            dst.qvel[:] = src.qvel
            dst.qacc_warmstart[:] = src.qacc_warmstart
            for i, arm in enumerate(ARMS):
                dst.mocap_pos[i], dst.mocap_quat[i] = tcp_pose(joint, arm, self.offsets)

    def rollout(self, frames: Mapping[str, list[Keyframe]], start: int, end: int) -> np.ndarray:
        """Drive the mocaps along ``frames`` for steps ``[start, end)``; returns the (steps, 14) joint actions.

        Step ``t`` commands the pose planned for ``t + 1`` so the first action already moves.
        """
        actions = np.empty((end - start, len(JOINTS)), dtype=np.float32)
        for row, t in enumerate(range(start, end)):
            left, right = (interpolate(frames[arm], t + 1) for arm in ARMS)
            command = np.concatenate([left.pos, left.quat, [left.grip], right.pos, right.quat, [right.grip]])
            self._task.before_step(command, self.physics)
            self.physics.step(self.substeps)
            qpos = self.physics.data.qpos
            actions[row] = np.concatenate([qpos[0:6], [left.grip], qpos[8:14], [right.grip]])
        return actions

    def close(self) -> None:
        self.physics.free()


# ------------------------------------------------------------------------------------------ the task
class AlohaTask(gym.Wrapper):
    """A gym-aloha joint env as a demoforge task; a subclass plans segments and says what they check.

    The underlying env terminates as soon as its reward is maximal. With ``ends_at_success`` so does the task;
    without, the episode runs on (``terminated`` stays False, ``info["is_success"]`` reports it) so the whole
    plan is recorded and success is decided at its end. ``step_limit`` is the episode's step limit (above the
    plan's length, so a finished vector row can hold still while others run).
    """

    def __init__(self, options: Mapping[str, Any], *, scene: str, task_class: type, step_limit: int,
                 instruction: str, ends_at_success: bool = False) -> None:
        height, width = int(options["image_height"]), int(options["image_width"])
        joint = OneCameraAlohaEnv(scene, task_class, height, width, bool(options["shadows"]),
                                  bool(options[ANTIALIAS]))
        super().__init__(TimeLimit(joint, max_episode_steps=step_limit))
        self._size = (height, width)
        self._instruction = instruction
        self._ends_at_success = ends_at_success
        self.depth = bool(options["depth"])
        self._planner = EndEffectorSim(scene)
        self._start: dict[str, Keyframe] = {}
        self._closed = False

    @property
    def control_env(self) -> Any:
        """gym-aloha's dm_control environment under the gymnasium API (its physics and its task)."""
        unwrapped: Any = self.env.unwrapped
        return unwrapped._env

    @property
    def physics(self) -> Any:
        """The joint env's dm_control physics (the state validators and planning read)."""
        return self.control_env.physics

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None
              ) -> tuple[Any, dict[str, Any]]:
        observation, info = self.env.reset(seed=seed, options=options)
        self._start = self._current_keyframes(0)
        return observation, info

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        observation, reward, _terminated, truncated, info = self.env.step(np.asarray(action))
        success = bool(reward == self.max_reward)
        return observation, float(reward), self._ends_at_success and success, bool(truncated), \
            dict(info, is_success=success)

    @property
    def max_reward(self) -> int:
        return int(self.control_env.task.max_reward)

    def env_reward(self) -> int:
        """gym-aloha's reward for the joint env's current state."""
        return int(self.control_env.task.get_reward(self.physics))

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._planner.close()
            self.control_env.task.close_camera()
            self.physics.free()
        super().close()

    # -- planning
    def _current_keyframes(self, t: int) -> dict[str, Keyframe]:
        grips = commanded_grips(self.physics)
        keyframes = {}
        for arm in ARMS:
            pos, quat = tcp_pose(self.physics, arm, self._planner.offsets)
            keyframes[arm] = Keyframe(t, pos, quat, grips[arm])
        return keyframes

    def plan_phase(self, plan: Mapping[str, list[Keyframe]], phase: ScriptedPhase) -> np.ndarray:
        """The joint actions of ``phase``: ``plan`` rolled out from the arms' live poses in the synced copy."""
        now = self._current_keyframes(phase.start)
        frames = {arm: segment_keyframes(plan[arm], now[arm], phase.end) for arm in ARMS}
        self._planner.sync(self.physics)
        return self._planner.rollout(frames, phase.start, phase.end)

    def tip(self, arm: str) -> np.ndarray:
        """``arm``'s fingertip point (where its mocap would sit)."""
        return tcp_pose(self.physics, arm, self._planner.offsets)[0]

    def body_position(self, body: str) -> np.ndarray:
        return np.array(self.physics.named.data.xpos[body])

    def touches(self, arm: str, geoms: Iterable[str]) -> bool:
        """``arm``'s fingers touch one of ``geoms``."""
        return bool(touching(self.physics, geoms) & set(FINGERS[arm]))

    # -- the rest of the task protocol
    def demo_success(self, observation: Any, info: Mapping[str, Any]) -> bool:
        """Success at plan end: the env's own maximum reward."""
        return self.env_reward() == self.max_reward

    def demo_hold_action(self) -> np.ndarray:
        """The current joint targets, so a finished row stays where it is."""
        ctrl = self.physics.data.ctrl
        grips = commanded_grips(self.physics)
        return np.concatenate([ctrl[0:6], [grips["left"]], ctrl[8:14], [grips["right"]]]).astype(np.float32)

    def demo_record(self, observation: Mapping[str, Any]) -> RecordedObservation:
        """The joint positions and the top camera; with ``depth``, also its depth in metres, rendered now by
        dm_control from the state the observation was taken in (the executor records right after a step)."""
        images = {CAMERA: np.asarray(observation["pixels"][CAMERA], dtype=np.uint8)}
        if self.depth:
            height, width = self._size
            with GL_LOCK:
                images[DEPTH_CAMERA] = np.asarray(self.physics.render(height=height, width=width, camera_id=CAMERA,
                                                                      depth=True), dtype=np.float32)
        return RecordedObservation(
            state={"observation.state": np.asarray(observation["agent_pos"], dtype=np.float32)}, images=images)

    def demo_instruction(self) -> str:
        return self._instruction


# ---------------------------------------------------------------------------------------- registry
def check_options(task: str, options: Mapping[str, Any]) -> None:
    """Image sizes must be renderable and small enough for an offscreen buffer."""
    for key in ("image_height", "image_width"):
        value = options[key]
        if not MIN_SIZE <= value <= MAX_SIZE:
            raise TaskOptionError(f"task {task!r} option {key!r} must be in {MIN_SIZE}..{MAX_SIZE}, got {value!r}")


def cameras(options: Mapping[str, Any]) -> tuple[CameraSpec, ...]:
    rgb = CameraSpec(CAMERA, int(options["image_height"]), int(options["image_width"]))
    return (rgb, depth_camera(rgb)) if bool(options["depth"]) else (rgb,)


def register_task(name: str, *, description: str, instruction: str, segment_names: tuple[str, ...],
                  make_env: Callable[[Mapping[str, Any]], gym.Env], objects: tuple[str, ...],
                  added_options: Mapping[str, Any] | None = None) -> None:
    """Register a gym-aloha task: the shared options and features (14 joint targets, ``top``, 50 fps) and a scene
    whose table, robot and ``objects`` (root bodies) change colour, whose top camera moves and whose ``objects``
    change physics. ``added_options`` are options added after stores were written (left out of fingerprints
    when at their default)."""
    added = {ANTIALIAS: True, **(added_options or {})}

    def describe(options: Mapping[str, Any]) -> TaskInfo:
        return TaskInfo(name=name, description=description, instruction=instruction, fps=FPS,
                        action_shape=(len(JOINTS),), state_shapes={"observation.state": (len(JOINTS),)},
                        cameras=cameras(options), segment_names=segment_names,
                        options=fingerprint_options(options, added), action_names=tuple(JOINTS), robot_type="aloha")

    scene = SceneRandomization(
        model=lambda env: env.get_wrapper_attr("physics").model.ptr,
        color_groups={"table": ("table",), "robot": ("vx300s_*",), "objects": objects},
        cameras=(CAMERA,), bodies=objects)
    register(TaskEntry(name=name, defaults=DEFAULTS, describe=describe, make_env=make_env,
                       check=functools.partial(check_options, name), randomization=scene,
                       appearance_options=APPEARANCE))
