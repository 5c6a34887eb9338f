"""The built-in task "aloha-transfer-cube": gym-aloha's bimanual cube handover with a scripted expert.

The joint-controlled env (14 absolute joint targets) has no expert, so each segment is planned as
end-effector waypoints in the mocap variant of the same scene (the ACT recipe): that copy is synced to the
joint env's live state, driven along the waypoints through its weld constraints, and the joint positions it
passes through become the segment's actions in the joint env. Syncing at every segment start makes the
plan lazy: each segment starts from the pose and cube position the previous one actually left.
"""

from __future__ import annotations


# Offscreen rendering on a headless machine; must be chosen before dm_control is imported.

import collections  # noqa: E402
from collections.abc import Callable, Iterator, Mapping  # noqa: E402
from dataclasses import dataclass  # noqa: E402
from typing import Any  # noqa: E402

import gymnasium as gym  # noqa: E402
import mujoco as mj  # noqa: E402
import numpy as np  # noqa: E402
from dm_control import mujoco as dm_mujoco  # noqa: E402
from dm_control.rl import control  # noqa: E402
from gym_aloha.constants import (  # noqa: E402
    ASSETS_DIR,
    DT,
    JOINTS,
    normalize_puppet_gripper_position,
)
from gym_aloha.env import AlohaEnv  # noqa: E402
from gym_aloha.tasks.sim import TransferCubeTask  # noqa: E402
from gym_aloha.tasks.sim_end_effector import BimanualViperXEndEffectorTask  # noqa: E402
from gymnasium.wrappers import TimeLimit  # noqa: E402

from demoforge.pipeline.tasks.mujoco_gl import GL_LOCK  # noqa: E402
from demoforge.pipeline.tasks.randomization import SceneRandomization  # noqa: E402
from demoforge.pipeline.tasks.registry import (  # noqa: E402
    CameraSpec,
    TaskEntry,
    TaskInfo,
    TaskOptionError,
    depth_camera,
    fingerprint_options,
    register,
)
from demoforge.stages.contract import RecordedObservation, Segment, StepView  # noqa: E402

TASK_NAME = "aloha-transfer-cube"
ADDED_OPTIONS: dict[str, Any] = {"depth": False}  # options added later: left out of fingerprints when default
DEFAULTS: dict[str, Any] = {"image_height": 224, "image_width": 224, "shadows": False, **ADDED_OPTIONS}
MIN_SIZE, MAX_SIZE = 32, 1080
CAMERA = "top"
DEPTH_CAMERA = "top_depth"  # registry.depth_camera's name for it
FPS = 50
INSTRUCTION = "transfer the cube from the right arm to the left arm"
ARMS = ("left", "right")
CUBE_GEOM = "red_box"
TABLE_GEOM = "table"
FINGERS = {arm: (f"vx300s_{arm}/10_left_gripper_finger", f"vx300s_{arm}/10_right_gripper_finger")
           for arm in ARMS}
# The shipped weld is too soft under mujoco 3.8 (the arm sags off the mocap target and drops grasps).
WELD_SOLIMP = (0.95, 0.99)

# ------------------------------------------------------------------------------------ the waypoint plan
MEET = np.array([0.0, 0.5, 0.25])  # where the right arm presents the cube to the left arm
OPEN, CLOSED = 1.0, 0.0  # normalized gripper commands
GRASP_OFFSET = np.zeros(3)  # fingertip point at the cube centre; lower, the fingers drag on the table
HOLD_RADIUS = 0.03  # a held cube's centre is this close to the gripper's fingertip point
LEFT_READY = np.array([-0.1, 0.0, 0.0])  # left fingertips relative to the presented cube, before/after
LEFT_GRASP = np.array([0.01, 0.0, 0.0])  # ... and while grasping it


def _axis_quat(axis: tuple[float, float, float], degrees: float) -> np.ndarray:
    quat = np.zeros(4)
    mj.mju_axisAngle2Quat(quat, np.asarray(axis, dtype=float), np.deg2rad(degrees))
    return quat


PICK_QUAT = _axis_quat((0.0, 1.0, 0.0), -60.0)  # right gripper tilted down toward the table
MEET_QUAT = _axis_quat((1.0, 0.0, 0.0), -90.0)  # left gripper rolled: fingers cross the right's, the
# finger gym-aloha checks for contact ends up below the cube, where gravity keeps it touching


@dataclass(frozen=True)
class Keyframe:
    """Where one arm's mocap (its fingertip point) should be at step ``t``, and its gripper command."""

    t: int
    pos: np.ndarray
    quat: np.ndarray
    grip: float


@dataclass(frozen=True)
class Phase:
    """One segment of the timeline: steps ``[start, end)``.

    ``tracks_cube`` re-reads the cube on the table; ``measures_handoff`` re-reads where the right gripper
    holds it, so the left arm aims at the cube rather than at a nominal point.
    """

    name: str
    start: int
    end: int
    instruction: str
    tracks_cube: bool = False
    measures_handoff: bool = False


PHASES = (
    Phase("reach_above_cube", 0, 90, "move the right gripper above the cube and open it", True),
    Phase("descend", 90, 130, "lower the open right gripper around the cube", True),
    Phase("grasp", 130, 170, "close the right gripper on the cube"),
    Phase("lift_to_meet", 170, 200, "lift the cube toward the meeting point"),
    Phase("move_to_meet", 200, 260, "bring both grippers to the meeting point", measures_handoff=True),
    Phase("handover", 260, 310, "close the left gripper on the cube, then open the right gripper"),
    Phase("retreat", 310, 400, "pull both arms apart with the cube in the left gripper"),
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


# ------------------------------------------------------------------------------------- physics helpers
def _rounded(vector: np.ndarray) -> list[float]:
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


def cube_touchers(physics: Any) -> set[str]:
    """Names of the geoms in contact with the cube."""
    model, data = physics.model, physics.data
    cube = model.name2id(CUBE_GEOM, "geom")
    touching: set[str] = set()
    for i in range(data.ncon):
        pair = (int(data.contact[i].geom1), int(data.contact[i].geom2))
        if cube in pair:
            other = pair[1] if pair[0] == cube else pair[0]
            touching.add(model.id2name(other, "geom"))
    return touching


def cube_position(physics: Any) -> np.ndarray:
    return np.array(physics.named.data.xpos["box"])


# --------------------------------------------------------------------------------- the joint env
class _OneCameraTransferCubeTask(TransferCubeTask):
    """gym-aloha's transfer task rendering only the top camera at the configured size.

    The shipped task renders three 480x640 cameras every step and keeps one; that dominates step time.
    """

    def __init__(self, height: int, width: int) -> None:
        super().__init__()
        self._size = (height, width)
        self._camera: dm_mujoco.Camera | None = None

    def get_observation(self, physics: Any) -> collections.OrderedDict:
        obs = collections.OrderedDict()
        obs["qpos"] = self.get_qpos(physics)
        obs["qvel"] = self.get_qvel(physics)
        obs["env_state"] = self.get_env_state(physics)
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


class _OneCameraAlohaEnv(AlohaEnv):
    """``AlohaTransferCube-v0`` with one rendered camera and shadows chosen by option."""

    def __init__(self, height: int, width: int, shadows: bool) -> None:
        self._shadows = shadows
        super().__init__(task="transfer_cube", obs_type="pixels_agent_pos", observation_height=height,
                         observation_width=width, visualization_height=height, visualization_width=width)

    def _make_env_task(self, task_name: str) -> control.Environment:
        physics = dm_mujoco.Physics.from_xml_path(str(ASSETS_DIR / "bimanual_viperx_transfer_cube.xml"))
        configure_rendering(physics, self.observation_height, self.observation_width, self._shadows)
        task = _OneCameraTransferCubeTask(self.observation_height, self.observation_width)
        return control.Environment(physics, task, float("inf"), control_timestep=DT, n_sub_steps=None,
                                   flat_observation=False)


def configure_rendering(physics: Any, height: int, width: int, shadows: bool) -> None:
    """Size the offscreen buffer for the image and turn shadows off (software shadows cost ~10x on CPU)."""
    glob = physics.model.vis.global_
    glob.offwidth, glob.offheight = max(int(glob.offwidth), width), max(int(glob.offheight), height)
    if not shadows:
        physics.model.light_castshadow[:] = 0


# ------------------------------------------------------------------------------- the end-effector sim
class EndEffectorSim:
    """The mocap-driven copy of the scene that turns end-effector keyframes into joint trajectories."""

    def __init__(self) -> None:
        path = ASSETS_DIR / "bimanual_viperx_end_effector_transfer_cube.xml"
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
class AlohaTransferCube(gym.Wrapper):
    """The joint env as a demoforge task: segments from the scripted expert, success decided at plan end.

    The underlying env terminates as soon as the left gripper holds the cube; here the episode runs on
    (``terminated`` stays False, ``info["is_success"]`` reports it) so the plan's retreat is recorded too.
    """

    def __init__(self, options: Mapping[str, Any]) -> None:
        height, width = int(options["image_height"]), int(options["image_width"])
        super().__init__(TimeLimit(_OneCameraAlohaEnv(height, width, bool(options["shadows"])),
                                   max_episode_steps=STEP_LIMIT))
        self._size = (height, width)
        self.depth = bool(options["depth"])
        self._planner = EndEffectorSim()
        self._start: dict[str, Keyframe] = {}
        self._closed = False

    @property
    def physics(self) -> Any:
        """The joint env's dm_control physics (the state validators and planning read)."""
        return self.env.unwrapped._env.physics

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None
              ) -> tuple[Any, dict[str, Any]]:
        observation, info = self.env.reset(seed=seed, options=options)
        self._start = self._current_keyframes(0)
        return observation, info

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        observation, reward, _terminated, truncated, info = self.env.step(np.asarray(action))
        info = dict(info, is_success=bool(reward == self.max_reward))
        return observation, float(reward), False, bool(truncated), info

    @property
    def max_reward(self) -> int:
        return int(self.env.unwrapped._env.task.max_reward)

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._planner.close()
            self.env.unwrapped._env.task.close_camera()
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

    def create_demo_segments(self) -> Iterator[Segment]:
        """Plan each phase from the live joint state when the executor asks for it."""
        cube, handoff = cube_position(self.physics), MEET
        for phase in PHASES:
            if phase.tracks_cube:
                cube = cube_position(self.physics)
            if phase.measures_handoff:
                handoff = MEET + cube_position(self.physics) - self._tip("right")
            plan = waypoint_plan(cube, handoff, self._start)
            now = self._current_keyframes(phase.start)
            frames = {arm: segment_keyframes(plan[arm], now[arm], phase.end) for arm in ARMS}
            self._planner.sync(self.physics)
            actions = self._planner.rollout(frames, phase.start, phase.end)
            yield Segment(actions=actions, name=phase.name, target="cube", instruction=phase.instruction,
                          metadata={"plan_start_step": phase.start, "plan_end_step": phase.end,
                                    "cube_xyz": _rounded(cube), "handoff_xyz": _rounded(handoff)},
                          validator=self._validator(phase.name, cube))

    def _tip(self, arm: str) -> np.ndarray:
        """``arm``'s fingertip point (where its mocap would sit)."""
        return tcp_pose(self.physics, arm, self._planner.offsets)[0]

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
            "retreat": lambda: self._lifted_by("left") and not self._touches("right"),
        }
        check = checks[name]
        return lambda _view: bool(check())

    def _above_cube(self, planned: np.ndarray) -> bool:
        """The open right gripper hovers over the cube, which has not been pushed."""
        tip = self._tip("right")
        cube = cube_position(self.physics)
        return (np.linalg.norm(cube[:2] - planned[:2]) < 0.01 and np.linalg.norm(tip[:2] - cube[:2]) < 0.03
                and tip[2] > cube[2] + 0.04)

    def _around_cube(self, planned: np.ndarray) -> bool:
        """The right fingertips are at the cube and the cube has not been knocked away."""
        tip = self._tip("right")
        cube = cube_position(self.physics)
        return np.linalg.norm(cube - planned) < 0.015 and np.linalg.norm(tip - cube) < 0.04

    def _touches(self, arm: str) -> bool:
        return bool(cube_touchers(self.physics) & set(FINGERS[arm]))

    def _holds(self, arm: str) -> bool:
        """``arm``'s fingers touch the cube and it sits between them (one finger's contact may flicker)."""
        near = np.linalg.norm(cube_position(self.physics) - self._tip(arm)) < HOLD_RADIUS
        return self._touches(arm) and bool(near)

    def _lifted_by(self, arm: str) -> bool:
        """``arm`` holds the cube clear of the table."""
        return (self._holds(arm) and TABLE_GEOM not in cube_touchers(self.physics)
                and cube_position(self.physics)[2] > 0.05)

    def _near_meet(self) -> bool:
        return bool(np.linalg.norm(cube_position(self.physics) - MEET) < 0.08)

    # -- the rest of the task protocol
    def demo_success(self, observation: Any, info: Mapping[str, Any]) -> bool:
        """Success at plan end: the left gripper holds the cube off the table (the env's max reward)."""
        return int(self.env.unwrapped._env.task.get_reward(self.physics)) == self.max_reward

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
        return INSTRUCTION


# ---------------------------------------------------------------------------------------- registry
def check_options(options: Mapping[str, Any]) -> None:
    """Image sizes must be renderable and small enough for an offscreen buffer."""
    for key in ("image_height", "image_width"):
        value = options[key]
        if not MIN_SIZE <= value <= MAX_SIZE:
            raise TaskOptionError(f"task {TASK_NAME!r} option {key!r} must be in {MIN_SIZE}..{MAX_SIZE}, "
                                  f"got {value!r}")


def _cameras(height: int, width: int, depth: bool) -> tuple[CameraSpec, ...]:
    rgb = CameraSpec(CAMERA, height, width)
    return (rgb, depth_camera(rgb)) if depth else (rgb,)


def describe(options: Mapping[str, Any]) -> TaskInfo:
    return TaskInfo(
        name=TASK_NAME,
        description="ALOHA bimanual sim (gym-aloha AlohaTransferCube-v0): the right arm picks up the cube "
                    "and hands it to the left arm; 14 absolute joint targets, top camera.",
        instruction=INSTRUCTION, fps=FPS, action_shape=(len(JOINTS),),
        state_shapes={"observation.state": (len(JOINTS),)},
        cameras=_cameras(int(options["image_height"]), int(options["image_width"]), bool(options["depth"])),
        segment_names=SEGMENT_NAMES, options=fingerprint_options(options, ADDED_OPTIONS), action_names=tuple(JOINTS),
        robot_type="aloha")


def make_env(options: Mapping[str, Any]) -> gym.Env:
    return AlohaTransferCube(options)


APPEARANCE = frozenset({"image_height", "image_width", "shadows", "depth"})  # options rerender may change
SCENE = SceneRandomization(
    model=lambda env: env.get_wrapper_attr("physics").model.ptr,
    color_groups={"table": ("table",), "robot": ("vx300s_*",), "objects": ("box",)},
    cameras=(CAMERA,), bodies=("box",))

register(TaskEntry(name=TASK_NAME, defaults=DEFAULTS, describe=describe, make_env=make_env,
                   check=check_options, randomization=SCENE,
                     appearance_options=APPEARANCE))
