"""The built-in task "so101-pick-place": MuJoCo Menagerie's SO-101 arm picks a cube up and places it on a target.

The robot is the SO-101 most LeRobot users own, recorded as ``lerobot-record`` records a real SO-101 follower
(LeRobot 0.6's ``so101_follower`` with ``use_degrees=True``, its default): ``observation.state`` and ``action``
are the six ``<motor>.pos`` values, the five body joints in degrees from the middle of each joint's range and
the gripper in 0..100 (0 closed, 100 open) over its range; cameras ``front`` and ``wrist``; 30 fps.

The model comes from the ``so101-nexus`` package (its copy of Menagerie's ``robotstudio_so101``, Apache-2.0;
the ``mujoco-menagerie`` package on the registry downloads models from GitHub at first use). The tabletop
scene (table, cube, target, front camera, lights) is added here with MuJoCo's ``MjSpec``.

The expert is reactive (it decides from the state alone, so it can label states a policy chose): a phase from
what the scene shows (is the cube held, over the target, on the table), a fingertip waypoint a bounded step
toward the phase's goal, and inverse kinematics from MuJoCo's own Jacobians (damped least squares on the
gripper site; :class:`ArmIk`) for the joint targets.

``demoforge multiply`` reads the fingertip, cube and target poses and converts target fingertip poses into
actions by inverse kinematics with the ``mink`` library (:class:`So101Poses`, :class:`MinkIk`).
"""

from __future__ import annotations

from collections.abc import Mapping
from importlib import metadata
from pathlib import Path
from typing import Any

import gymnasium as gym
import mujoco
import numpy as np
from gymnasium.wrappers import TimeLimit

from demoforge.pipeline.reactive import Phase, reactive_segments
from demoforge.pipeline.tasks.mujoco_gl import ANTIALIAS, GL_LOCK, set_antialias
from demoforge.pipeline.tasks.randomization import SceneRandomization
from demoforge.pipeline.tasks.registry import (
    CameraSpec,
    TaskEntry,
    TaskInfo,
    TaskOptionError,
    fingerprint_options,
    register,
)
from demoforge.stages.contract import RecordedObservation
from demoforge.stages.task_protocol import Pose

TASK_NAME = "so101-pick-place"
MODEL_PACKAGE = "so101-nexus"
MODEL_FILE = "so101_nexus/assets/SO101_menagerie/so101.xml"
ADDED_OPTIONS: dict[str, Any] = {ANTIALIAS: True}  # options added later: left out of fingerprints when default
DEFAULTS: dict[str, Any] = {"image_height": 480, "image_width": 640, "shadows": False, "max_steps": 450,
                            **ADDED_OPTIONS}
MIN_SIZE, MAX_SIZE = 32, 1080
FPS = 30
SUBSTEPS = 7  # physics steps per frame: 1/210 s, just under the model's own 0.005 s
MAX_STEPS = 1000  # the step limit's limit; the default (450: 15 s) is 6 times what the expert needs
INSTRUCTION = "pick up the cube and place it on the target"

# LeRobot's so101_follower motor names, in its order; the features are "<motor>.pos"
MOTORS = ("shoulder_pan", "shoulder_lift", "elbow_flex", "wrist_flex", "wrist_roll", "gripper")
FEATURE_NAMES = tuple(f"{m}.pos" for m in MOTORS)
ARM_JOINTS = MOTORS[:5]
CAMERAS = ("front", "wrist")
WRIST_CAMERA = "wrist_cam"  # the model's camera on the wrist, recorded as "wrist"
SITE = "gripperframe"  # the fingertip point between the jaws; its z axis points from the wrist to the tips
FIXED_JAW = "gripper"  # the bodies whose geoms touch a held cube
MOVING_JAW = "moving_jaw_so101_v1"

# ------------------------------------------------------------------------------------------------ the scene
CUBE_HALF = 0.015  # a 3 cm cube
CUBE_MASS = 0.02
CUBE_RANGE = ((0.17, 0.27), (-0.12, 0.12))  # the cube's start (x, y) in metres; the robot faces +x from (0, 0)
TARGET_RANGE = ((0.17, 0.27), (-0.12, 0.12))
MIN_TRAVEL = 0.08  # the target is at least this far from the cube's start
YAW_RANGE = np.deg2rad(40.0)  # the cube's start yaw, +- this
TARGET_RADIUS = 0.025  # the target disc; success: the cube's centre within this of the target's centre
HOME_TIP = np.array([0.21, 0.0, 0.10])  # the fingertips at the start: above the middle of the workspace
HOME_GUESS = np.array([0.0, -0.36, 0.19, 1.6, 0.0])  # radians near that pose (the IK starts from here)
FRONT_POS, FRONT_LOOK_AT, FRONT_FOVY = (0.52, 0.0, 0.3), (0.16, 0.0, 0.04), 55.0  # the front camera


def model_path() -> Path:
    """The Menagerie SO-101 MJCF from the ``so101-nexus`` package; a clear error naming the package if absent."""
    try:
        path = Path(str(metadata.distribution(MODEL_PACKAGE).locate_file(MODEL_FILE)))
    except metadata.PackageNotFoundError:
        raise TaskOptionError(f"task {TASK_NAME!r} needs the SO-101 model from the {MODEL_PACKAGE!r} package "
                              f"(pip install {MODEL_PACKAGE}; tools/setup.sh installs it)") from None
    if not path.is_file():
        raise TaskOptionError(f"task {TASK_NAME!r}: the {MODEL_PACKAGE!r} package has no {MODEL_FILE} "
                              f"(looked in {path.parent}); reinstall it: pip install --force-reinstall {MODEL_PACKAGE}")
    return path


def _look_at(pos: tuple[float, ...], target: tuple[float, ...]) -> list[float]:
    """``xyaxes`` of a camera at ``pos`` looking at ``target`` with the world's z up."""
    forward = np.asarray(target, float) - np.asarray(pos, float)
    forward /= np.linalg.norm(forward)
    right = np.cross(forward, (0.0, 0.0, 1.0))
    right /= np.linalg.norm(right)
    up = np.cross(right, forward)
    return [*right, *up]


def build_model(height: int, width: int, shadows: bool) -> mujoco.MjModel:
    """The SO-101 on a table with a cube, a target disc, a front camera and lights."""
    spec = mujoco.MjSpec.from_file(str(model_path()))
    spec.option.timestep = 1.0 / (FPS * SUBSTEPS)
    glob = spec.visual.global_
    glob.offwidth, glob.offheight = max(int(glob.offwidth), width), max(int(glob.offheight), height)
    spec.add_texture(name="sky", type=mujoco.mjtTexture.mjTEXTURE_SKYBOX, builtin=mujoco.mjtBuiltin.mjBUILTIN_GRADIENT,
                     rgb1=[0.8, 0.84, 0.88], rgb2=[0.4, 0.45, 0.5], width=64, height=384)
    world = spec.worldbody
    world.add_light(name="top", pos=[0.3, 0.0, 1.2], dir=[0.0, 0.0, -1.0], type=mujoco.mjtLightType.mjLIGHT_DIRECTIONAL,
                    diffuse=[0.7, 0.7, 0.7], castshadow=shadows)
    world.add_light(name="side", pos=[0.5, -0.6, 0.8], dir=[-0.3, 0.6, -0.8], diffuse=[0.3, 0.3, 0.3],
                    castshadow=False)
    world.add_geom(name="floor", type=mujoco.mjtGeom.mjGEOM_PLANE, size=[2.0, 2.0, 0.05], pos=[0.0, 0.0, -0.75],
                   rgba=[0.35, 0.37, 0.4, 1.0])
    world.add_geom(name="table", type=mujoco.mjtGeom.mjGEOM_BOX, size=[0.45, 0.4, 0.02], pos=[0.2, 0.0, -0.02],
                   rgba=[0.62, 0.5, 0.36, 1.0], friction=[1.0, 0.005, 0.0001])
    world.add_geom(name="target", type=mujoco.mjtGeom.mjGEOM_CYLINDER, size=[TARGET_RADIUS, 0.0005, 0.0],
                   pos=[0.2, 0.1, 0.0005], rgba=[0.1, 0.65, 0.25, 1.0], contype=0, conaffinity=0)
    cube = world.add_body(name="cube", pos=[0.2, 0.0, CUBE_HALF])
    cube.add_freejoint(name="cube_joint")
    cube.add_geom(name="cube", type=mujoco.mjtGeom.mjGEOM_BOX, size=[CUBE_HALF] * 3, mass=CUBE_MASS,
                  rgba=[0.85, 0.15, 0.12, 1.0], friction=[1.5, 0.01, 0.001], condim=4)
    world.add_camera(name="front", pos=list(FRONT_POS), fovy=FRONT_FOVY, xyaxes=_look_at(FRONT_POS, FRONT_LOOK_AT))
    return spec.compile()


# --------------------------------------------------------------------------------------------- units
class Units:
    """LeRobot's so101_follower units (``use_degrees=True``) and the model's radians, both ways.

    Body joints: degrees from the middle of the joint's range (the model's ranges are symmetric about its zero,
    so degrees = rad2deg(qpos)); the gripper: 0..100 over its range, 0 at the closed end.
    """

    def __init__(self, model: mujoco.MjModel) -> None:
        ranges = np.array([model.jnt_range[model.joint(m).id] for m in MOTORS])
        self.low, self.high = ranges[:, 0], ranges[:, 1]
        self.middle = (self.low + self.high) / 2

    def to_lerobot(self, qpos: np.ndarray) -> np.ndarray:
        out = np.rad2deg(np.asarray(qpos, float) - self.middle)
        out[5] = 100.0 * (qpos[5] - self.low[5]) / (self.high[5] - self.low[5])
        return out.astype(np.float32)

    def to_radians(self, values: np.ndarray) -> np.ndarray:
        values = np.asarray(values, float)
        out = np.deg2rad(values) + self.middle
        out[5] = self.low[5] + np.clip(values[5], 0.0, 100.0) / 100.0 * (self.high[5] - self.low[5])
        return np.clip(out, self.low, self.high)


# ------------------------------------------------------------------------------------------ kinematics
JAW_WEIGHT, DOWN_WEIGHT = 0.3, 0.05  # metres of position error one radian of orientation error is worth
class ArmIk:
    """Joint angles that put the gripper site at a position with its tips pointing down and its jaws at a yaw.

    Damped least squares on MuJoCo's site Jacobian (``mj_jacSite``) over the five arm joints, in a scratch
    ``MjData`` so the simulation is untouched. With the tips pointing down, the five joints fix the pose
    exactly (pan and the three pitches place the tip, the roll turns the jaws about the vertical)."""

    def __init__(self, model: mujoco.MjModel) -> None:
        self.model = model
        self.data = mujoco.MjData(model)
        self.site = model.site(SITE).id
        self.dofs = np.array([model.jnt_dofadr[model.joint(j).id] for j in ARM_JOINTS])
        self.qadr = np.array([model.jnt_qposadr[model.joint(j).id] for j in ARM_JOINTS])
        self.low = model.jnt_range[[model.joint(j).id for j in ARM_JOINTS], 0]
        self.high = model.jnt_range[[model.joint(j).id for j in ARM_JOINTS], 1]

    @staticmethod
    def down_rotation(yaw: float) -> np.ndarray:
        """The site frame with z pointing down and the jaws closing along (cos yaw, sin yaw, 0)."""
        x = np.array([np.cos(yaw), np.sin(yaw), 0.0])
        z = np.array([0.0, 0.0, -1.0])
        return np.column_stack([x, np.cross(z, x), z])

    def solve(self, start: np.ndarray, position: np.ndarray, yaw: float, iterations: int = 60
              ) -> tuple[np.ndarray, float]:
        """Arm joint angles from ``start`` (5 values) toward the pose; returns them and the position error (m)."""
        data, model = self.data, self.model
        q = np.array(start, dtype=float)
        target = self.down_rotation(yaw)
        jacp, jacr = np.zeros((3, model.nv)), np.zeros((3, model.nv))
        error = np.inf
        for _ in range(iterations):
            data.qpos[self.qadr] = q
            mujoco.mj_kinematics(model, data)
            mujoco.mj_comPos(model, data)
            rot = data.site_xmat[self.site].reshape(3, 3)
            e_pos = position - data.site_xpos[self.site]
            # The jaws' closing axis matters most; pointing straight down is a preference the SO-101's wrist
            # cannot always meet (its flex limit), so it weighs less and the tips tilt where they must.
            e_rot = JAW_WEIGHT * np.cross(rot[:, 0], target[:, 0]) + DOWN_WEIGHT * np.cross(rot[:, 2], target[:, 2])
            error = float(np.linalg.norm(e_pos))
            if error < 1e-4 and float(np.linalg.norm(e_rot)) < 1e-4:
                break
            mujoco.mj_jacSite(model, data, jacp, jacr, self.site)
            jac = np.vstack([jacp[:, self.dofs], jacr[:, self.dofs]])
            err = np.concatenate([e_pos, e_rot])
            step = jac.T @ np.linalg.solve(jac @ jac.T + 1e-4 * np.eye(6), err)
            q = np.clip(q + step, self.low, self.high)
        return q, error


def _scaled(bounds: tuple[float, float], scale: float) -> tuple[float, float]:
    """``bounds`` widened by ``scale`` about their middle."""
    middle, half = (bounds[0] + bounds[1]) / 2, (bounds[1] - bounds[0]) / 2
    return middle - half * scale, middle + half * scale


# --------------------------------------------------------------------------------------------- the env
class So101PickPlaceEnv(gym.Env):
    """The SO-101 tabletop scene under gymnasium: actions and observations in LeRobot's so101_follower units.

    Observation: ``{"agent_pos": (6,) float32, "pixels": {"front": (H, W, 3), "wrist": (H, W, 3)}}``. The episode
    terminates on success: the cube rests on the target, out of the gripper, and the gripper has moved up off it.
    """

    metadata = {"render_modes": ["rgb_array"], "render_fps": FPS}

    def __init__(self, height: int, width: int, shadows: bool, antialias: bool) -> None:
        super().__init__()
        self.model = build_model(height, width, shadows)
        set_antialias(self.model, antialias)
        self.data = mujoco.MjData(self.model)
        self.units = Units(self.model)
        self.ik = ArmIk(self.model)
        self._size = (height, width)
        self._renderer: mujoco.Renderer | None = None
        self._cube_joint = self.model.joint("cube_joint")
        self._target_geom = self.model.geom("target").id
        self._cube_geom = self.model.geom("cube").id
        self._cube_body = self.model.body("cube").id
        self._fixed_jaw, self._moving_jaw = self.model.body(FIXED_JAW).id, self.model.body(MOVING_JAW).id
        self._table_geom = self.model.geom("table").id
        self._camera_ids = {"front": self.model.camera("front").id, "wrist": self.model.camera(WRIST_CAMERA).id}
        self.home = self._home_pose()
        self.start_range_scale = 1.0  # the cube's start range about its centre (randomize.init.scale widens it)
        # LeRobot's units: each joint's range in degrees, the gripper 0..100 (commands beyond are clipped)
        low, high = self.units.to_lerobot(self.units.low), self.units.to_lerobot(self.units.high)
        self.action_space = gym.spaces.Box(low=np.array([*low[:5], 0.0], np.float32),
                                           high=np.array([*high[:5], 100.0], np.float32))
        image = gym.spaces.Box(0, 255, (height, width, 3), np.uint8)
        self.observation_space = gym.spaces.Dict({
            "agent_pos": gym.spaces.Box(-np.inf, np.inf, (6,), np.float32),
            "pixels": gym.spaces.Dict({name: image for name in CAMERAS})})

    def _home_pose(self) -> np.ndarray:
        """The start pose (radians): the open gripper above the middle of the workspace, tips down."""
        arm, _error = self.ik.solve(HOME_GUESS, HOME_TIP, np.pi, iterations=200)
        return np.array([*arm, self.units.to_radians(np.array([0, 0, 0, 0, 0, OPEN]))[5]])

    # -- gymnasium
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None
              ) -> tuple[dict[str, Any], dict[str, Any]]:
        super().reset(seed=seed)
        rng = self.np_random
        model, data = self.model, self.data
        mujoco.mj_resetData(model, data)
        cube_xy = np.array([rng.uniform(*_scaled(CUBE_RANGE[0], self.start_range_scale)),
                            rng.uniform(*_scaled(CUBE_RANGE[1], self.start_range_scale))])
        while True:
            target_xy = np.array([rng.uniform(*TARGET_RANGE[0]), rng.uniform(*TARGET_RANGE[1])])
            if np.linalg.norm(target_xy - cube_xy) >= MIN_TRAVEL:
                break
        yaw = rng.uniform(-YAW_RANGE, YAW_RANGE) * self.start_range_scale
        data.qpos[:6] = self.home
        data.ctrl[:6] = self.home
        adr = self._cube_joint.qposadr[0]
        data.qpos[adr:adr + 3] = [*cube_xy, CUBE_HALF]
        data.qpos[adr + 3:adr + 7] = [np.cos(yaw / 2), 0.0, 0.0, np.sin(yaw / 2)]
        model.geom_pos[self._target_geom][:2] = target_xy
        mujoco.mj_forward(model, data)
        return self._observation(), {"is_success": False}

    def step(self, action: Any) -> tuple[dict[str, Any], float, bool, bool, dict[str, Any]]:
        action = np.asarray(action, dtype=float)
        if action.shape != (6,) or not np.isfinite(action).all():
            raise ValueError(f"an so101 action is 6 finite values ({', '.join(FEATURE_NAMES)}), got {action!r:.120}")
        self.data.ctrl[:6] = self.units.to_radians(action)
        mujoco.mj_step(self.model, self.data, nstep=SUBSTEPS)
        success = self.success()
        return self._observation(), float(success), success, False, {"is_success": success}

    def _observation(self) -> dict[str, Any]:
        return {"agent_pos": self.units.to_lerobot(self.data.qpos[:6]), "pixels": self.render_cameras()}

    def render_cameras(self) -> dict[str, np.ndarray]:
        with GL_LOCK:
            if self._renderer is None:
                height, width = self._size
                self._renderer = mujoco.Renderer(self.model, height=height, width=width)
            frames = {}
            for name in CAMERAS:
                self._renderer.update_scene(self.data, camera=self._camera_ids[name])
                frames[name] = np.array(self._renderer.render(), dtype=np.uint8, copy=True)
            return frames

    def render(self) -> np.ndarray:
        return self.render_cameras()["front"]

    def close(self) -> None:
        if self._renderer is not None:
            with GL_LOCK:
                self._renderer.close()
            self._renderer = None
        super().close()

    # -- the scene, read by the expert, the success check and validators
    def cube_pose(self) -> tuple[np.ndarray, float]:
        """The cube's centre and its yaw (radians)."""
        quat = self.data.xquat[self._cube_body]
        yaw = float(np.arctan2(2 * (quat[0] * quat[3] + quat[1] * quat[2]), 1 - 2 * (quat[2] ** 2 + quat[3] ** 2)))
        return np.array(self.data.xpos[self._cube_body]), yaw

    def target_xy(self) -> np.ndarray:
        return np.array(self.model.geom_pos[self._target_geom][:2])

    def tip(self) -> np.ndarray:
        return np.array(self.data.site_xpos[self.ik.site])

    def cube_contacts(self) -> set[str]:
        """What touches the cube: "fixed_jaw", "moving_jaw", "table" or "other"."""
        found: set[str] = set()
        for contact in self.data.contact[:self.data.ncon]:
            pair = (int(contact.geom1), int(contact.geom2))
            if self._cube_geom not in pair:
                continue
            other = pair[1] if pair[0] == self._cube_geom else pair[0]
            body = int(self.model.geom_bodyid[other])
            if other == self._table_geom:
                found.add("table")
            elif body == self._fixed_jaw:
                found.add("fixed_jaw")
            elif body == self._moving_jaw:
                found.add("moving_jaw")
            else:
                found.add("other")
        return found

    def held(self) -> bool:
        """Both jaws touch the cube."""
        return {"fixed_jaw", "moving_jaw"} <= self.cube_contacts()

    def cube_on_target(self, lifted_by: float = 0.012) -> bool:
        """The cube's centre is over the target disc and the cube is down (its centre at most ``lifted_by`` above
        its resting height: a cube a jaw tips while letting go is still down)."""
        cube, _yaw = self.cube_pose()
        return bool(np.linalg.norm(cube[:2] - self.target_xy()) < TARGET_RADIUS and cube[2] < CUBE_HALF + lifted_by)

    def success(self) -> bool:
        """The cube rests flat on the target, nothing of the arm touches it, and the tips are 4 cm above its top."""
        cube, _yaw = self.cube_pose()
        free = not (self.cube_contacts() - {"table"})
        return self.cube_on_target(lifted_by=0.004) and free and bool(self.tip()[2] > cube[2] + CUBE_HALF + 0.04)


# ------------------------------------------------------------------------------------------ the expert
OPEN, CLOSED = 60.0, 0.0  # gripper commands (LeRobot's 0..100): open wide enough for the cube, then squeeze
HOVER = 0.07  # fingertips this high above the cube's centre while reaching, and above the table while carrying
GRASP_DEPTH = 0.003  # fingertips this far below the cube's centre when closing
SPEED = 0.008  # metres the fingertip waypoint leads the fingertips per frame (0.24 m/s)
ALIGNED = 0.015  # fingertips within this of the cube's (x, y): reaching is over, descending corrects the rest

PHASES: dict[str, Phase] = {name: Phase(name, instruction, "cube") for name, instruction in (
    ("reach", "move the open gripper above the cube"),
    ("descend", "lower the open gripper around the cube"),
    ("grasp", "close the gripper on the cube"),
    ("lift", "lift the cube off the table"),
    ("carry", "carry the cube above the target"),
    ("place", "lower the cube onto the target"),
    ("release", "open the gripper to let go of the cube"),
    ("retreat", "move the gripper up and away from the cube"),
)}
SEGMENT_NAMES = tuple(PHASES)


class So101Expert:
    """The reactive expert: :meth:`decide` reads the scene, never its own history (it can label any state)."""

    def __init__(self, env: So101PickPlaceEnv) -> None:
        self.env = env

    def _grasp_yaw(self, cube_yaw: float, now: float) -> float:
        """The jaw yaw closest to the current one that closes across two faces of the cube."""
        options = [cube_yaw + k * np.pi / 2 for k in range(-4, 5)]
        return float(min(options, key=lambda y: abs(y - now)))

    def decide(self, observation: Any) -> tuple[np.ndarray, Phase]:
        env = self.env
        cube, cube_yaw = env.cube_pose()
        tip = env.tip()
        gripper = float(env.units.to_lerobot(env.data.qpos[:6])[5])
        target = env.target_xy()
        held = env.held()
        grasp_point = np.array([cube[0], cube[1], cube[2] - GRASP_DEPTH])
        jaw_yaw = self._grasp_yaw(cube_yaw, self._current_jaw_yaw())
        if env.cube_on_target():
            if held or gripper < OPEN - 10.0:
                name, goal, grip = "release", tip, OPEN
            else:
                name, goal, grip = "retreat", np.array([*tip[:2], cube[2] + HOVER + 0.03]), OPEN
        elif held:
            carry_z = HOVER + CUBE_HALF
            offset = tip[:2] - cube[:2]  # where the tips hold the cube
            off_target = float(np.linalg.norm(cube[:2] - target))
            # Over the target, or already on the way down close to it (placing corrects (x, y) as it lowers)
            if off_target < ALIGNED / 2 or (off_target < ALIGNED and cube[2] < carry_z - 0.01):
                name, goal = "place", np.array([*(target + offset), tip[2] - (cube[2] - CUBE_HALF) + 0.002])
            elif cube[2] < carry_z - 0.045 and off_target > 0.03:
                name, goal = "lift", np.array([*tip[:2], carry_z])
            else:
                name, goal = "carry", np.array([*(target + offset), carry_z])
            grip = CLOSED
        else:
            aligned = np.linalg.norm(tip[:2] - grasp_point[:2]) < ALIGNED
            closing = gripper < OPEN - 5.0
            if aligned and (tip[2] < grasp_point[2] + 0.006) and not (closing and gripper < 5.0):
                name, goal, grip = "grasp", grasp_point, CLOSED
            elif aligned and not closing:
                name, goal, grip = "descend", grasp_point, OPEN
            else:
                hover = np.array([grasp_point[0], grasp_point[1], cube[2] + HOVER])
                goal = hover if tip[2] > cube[2] + HOVER - 0.03 else np.array([*tip[:2], cube[2] + HOVER])
                name, grip = "reach", OPEN
        waypoint = tip + np.clip(goal - tip, -SPEED, SPEED)
        yaw = jaw_yaw if name in ("reach", "descend", "grasp") else self._current_jaw_yaw()
        arm, _error = env.ik.solve(env.data.qpos[:5], waypoint, yaw)
        action = env.units.to_lerobot(np.array([*arm, 0.0]))
        action[5] = grip
        return action, PHASES[name]

    def _current_jaw_yaw(self) -> float:
        rot = self.env.data.site_xmat[self.env.ik.site].reshape(3, 3)
        return float(np.arctan2(rot[1, 0], rot[0, 0]))


# ------------------------------------------------------------------------------------------ the task
class So101PickPlace(gym.Wrapper):
    """The SO-101 env as a demoforge task: the reactive expert's segments; success ends the episode."""

    def __init__(self, options: Mapping[str, Any]) -> None:
        height, width = int(options["image_height"]), int(options["image_width"])
        scene = So101PickPlaceEnv(height, width, bool(options["shadows"]), bool(options[ANTIALIAS]))
        super().__init__(TimeLimit(scene, max_episode_steps=int(options["max_steps"])))
        self.scene: So101PickPlaceEnv = self.env.unwrapped  # type: ignore[assignment]
        self.expert = So101Expert(self.scene)
        self._last: Any = None
        self._poses: So101Poses | None = None

    @property
    def physics_model(self) -> Any:
        return self.scene.model

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None
              ) -> tuple[Any, dict[str, Any]]:
        self._last, info = self.env.reset(seed=seed, options=options)
        return self._last, info

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        self._last, reward, terminated, truncated, info = self.env.step(action)
        return self._last, float(reward), terminated, truncated, info

    def create_demo_segments(self) -> Any:
        return reactive_segments(self.expert, lambda: self._last)

    def demo_record(self, observation: Mapping[str, Any]) -> RecordedObservation:
        return RecordedObservation(state={"observation.state": np.asarray(observation["agent_pos"], np.float32)},
                                   images={name: observation["pixels"][name] for name in CAMERAS})

    def demo_success(self, observation: Any, info: Mapping[str, Any]) -> bool:
        return bool(info.get("is_success", False))

    def demo_hold_action(self) -> np.ndarray:
        """The current joint targets, so a finished row stays where it is."""
        return self.scene.units.to_lerobot(np.array(self.scene.data.ctrl[:6]))

    def demo_instruction(self) -> str:
        return INSTRUCTION

    def demo_poses(self) -> So101Poses:
        """The poses ``demoforge multiply`` reads and commands (one object per env: its IK solver is reused)."""
        if self._poses is None:
            self._poses = So101Poses(self.scene)
        return self._poses


# ------------------------------------------------------------------------------------------ multiply
class MinkIk:
    """Joint angles that put the fingertip site at a pose: differential inverse kinematics with ``mink`` (a
    quadratic program per iteration, the joint limits as constraints), iterated to convergence from the arm's
    current angles, in ``mink``'s own scratch data (the simulation is untouched).

    Five joints cannot reach every orientation at a position: the orientation is weighed per axis of the site
    frame (its z axis points to the tips): the roll about the tips (the jaws' yaw) nearly as much as a
    position error, the tilt of the tips less, so the position wins where both cannot be met."""

    POSITION_COST = 1.0
    ORIENTATION_COST = (0.05, 0.05, 0.3)  # the site's x, y (tilt) and z (the jaws' roll about the tips)
    ITERATIONS = 40
    CONVERGED = 1e-7  # radians: the largest joint change of an iteration that ends the solve
    DAMPING = 1e-4

    def __init__(self, model: mujoco.MjModel) -> None:
        import mink  # here: describe() and the expert need no QP solver

        self._mink = mink
        self.configuration = mink.Configuration(model)
        self.task = mink.FrameTask(SITE, "site", position_cost=self.POSITION_COST,
                                   orientation_cost=np.array(self.ORIENTATION_COST))
        self.limits = [mink.ConfigurationLimit(model)]
        self.qadr = np.array([model.jnt_qposadr[model.joint(j).id] for j in ARM_JOINTS])
        self.site = model.site(SITE).id

    def forward(self, arm: np.ndarray) -> Pose:
        """The fingertip site's pose for arm joint angles ``arm`` (5 values, radians)."""
        q = self.configuration.data.qpos.copy()
        q[self.qadr] = arm
        self.configuration.update(q)
        return self._site_pose()

    def _site_pose(self) -> Pose:
        data = self.configuration.data
        quaternion = np.empty(4)
        mujoco.mju_mat2Quat(quaternion, data.site_xmat[self.site])
        return Pose(np.array(data.site_xpos[self.site]), quaternion)

    def solve(self, start: np.ndarray, pose: Pose) -> np.ndarray:
        """Arm joint angles (5, radians) from ``start`` toward ``pose``: the weighted nearest where it is out of
        reach."""
        mink = self._mink
        q = self.configuration.data.qpos.copy()
        q[self.qadr] = start
        self.configuration.update(q)
        self.task.set_target(mink.SE3.from_rotation_and_translation(mink.SO3(wxyz=pose.quaternion), pose.position))
        for _ in range(self.ITERATIONS):
            velocity = mink.solve_ik(self.configuration, [self.task], 1.0, "daqp", damping=self.DAMPING,
                                     limits=self.limits)
            self.configuration.integrate_inplace(velocity, 1.0)
            if float(np.max(np.abs(velocity[self.qadr]))) < self.CONVERGED:
                break
        return np.array(self.configuration.data.qpos[self.qadr])


class So101Poses:
    """What ``demoforge multiply`` reads and commands of the SO-101 (stages/task_protocol.py ``TaskPoses``).

    The arm is joint-space: an action is the five joint targets (and the gripper) in LeRobot's units, so the
    pose it commands is the fingertip site's pose at those angles (forward kinematics), and the action toward a
    pose is inverse kinematics (:class:`MinkIk`, from the arm's current angles). As the expert's own waypoint
    does, the commanded fingertip leads the fingertip by at most ``MAX_STEP`` per axis: a far pose is approached
    over several frames (multiply's interpolation counts them), not in one jump the position servos would
    overshoot. The cube's reach, descent, grasp and lift move with the cube; carrying, placing, releasing and
    retreating move with the target disc."""

    follows_plan = False  # a reactive expert: its segments end where its phase changes, not on request
    TARGET = "target"
    WITH_TARGET = frozenset({"carry", "place", "release", "retreat"})
    MAX_STEP = 0.012  # metres per axis per frame (the expert's waypoint leads by SPEED, 0.008)

    def __init__(self, scene: So101PickPlaceEnv) -> None:
        self.scene = scene
        self.ik = MinkIk(scene.model)

    def eef_pose(self) -> Pose:
        data = self.scene.data
        quaternion = np.empty(4)
        mujoco.mju_mat2Quat(quaternion, data.site_xmat[self.scene.ik.site])
        return Pose(np.array(data.site_xpos[self.scene.ik.site]), quaternion)

    def object_poses(self) -> dict[str, Pose]:
        body = self.scene.data.body("cube")
        target = np.array(self.scene.model.geom_pos[self.scene.model.geom(self.TARGET).id], dtype=np.float64)
        return {"cube": Pose(np.array(body.xpos), np.array(body.xquat)), self.TARGET: Pose(target)}

    def reference(self, segment: str, target: str | None) -> str | None:
        return self.TARGET if segment in self.WITH_TARGET else target

    def gripper(self, action: np.ndarray) -> float:
        return float(np.asarray(action, dtype=np.float64).reshape(-1)[5])

    def commanded_pose(self, action: np.ndarray) -> Pose:
        radians = self.scene.units.to_radians(np.asarray(action, dtype=np.float64).reshape(-1))
        return self.ik.forward(radians[:5])

    def action_toward(self, pose: Pose, gripper: float) -> np.ndarray:
        tip = self.scene.tip()
        near = Pose(tip + np.clip(pose.position - tip, -self.MAX_STEP, self.MAX_STEP), pose.quaternion)
        arm = self.ik.solve(np.array(self.scene.data.qpos[:5]), near)
        action = self.scene.units.to_lerobot(np.array([*arm, 0.0]))
        action[5] = np.clip(gripper, 0.0, 100.0)
        return action


# ---------------------------------------------------------------------------------------- registry
def check_options(options: Mapping[str, Any]) -> None:
    for key, (low, high) in (("image_height", (MIN_SIZE, MAX_SIZE)), ("image_width", (MIN_SIZE, MAX_SIZE)),
                             ("max_steps", (1, MAX_STEPS))):
        value = options[key]
        if not low <= value <= high:
            raise TaskOptionError(f"task {TASK_NAME!r} option {key!r} must be in {low}..{high}, got {value!r}")


def describe(options: Mapping[str, Any]) -> TaskInfo:
    height, width = int(options["image_height"]), int(options["image_width"])
    return TaskInfo(
        name=TASK_NAME,
        description="SO-101 arm (MuJoCo Menagerie) picks a 3 cm cube up and places it on a target disc; "
                    "LeRobot so101_follower features (<motor>.pos, degrees, gripper 0-100), front and wrist "
                    "cameras, 30 fps.",
        instruction=INSTRUCTION, fps=FPS, action_shape=(6,), state_shapes={"observation.state": (6,)},
        cameras=tuple(CameraSpec(name, height, width) for name in CAMERAS), segment_names=SEGMENT_NAMES,
        options=fingerprint_options(options, ADDED_OPTIONS), action_names=FEATURE_NAMES, robot_type="so_follower",
        labels_any_state=True,
        feature_names={"observation.state": FEATURE_NAMES, "action": FEATURE_NAMES})


def make_env(options: Mapping[str, Any]) -> gym.Env:
    return So101PickPlace(options)


def _widen_cube_start(env: gym.Env, scale: float) -> dict[str, Any]:
    """The cube's start range (x, y and yaw) widened by ``scale`` about its middle."""
    scene: So101PickPlaceEnv = env.unwrapped  # type: ignore[assignment]
    scene.start_range_scale = scale
    return {"cube_x": list(_scaled(CUBE_RANGE[0], scale)), "cube_y": list(_scaled(CUBE_RANGE[1], scale)),
            "cube_yaw_deg": round(float(np.rad2deg(YAW_RANGE)) * scale, 3)}


SCENE = SceneRandomization(
    model=lambda env: env.get_wrapper_attr("physics_model"),
    color_groups={"table": ("world",), "robot": ("base",), "objects": ("cube",)},
    cameras=("front",), bodies=("cube",), init=_widen_cube_start,
    # at 1.2 and 1.3 one start in 16 was out of the expert's reach (the far corner, 30 cm out): 16/16 at 1.1
    limits={"randomize.init.scale": 1.1})

register(TaskEntry(name=TASK_NAME, defaults=DEFAULTS, describe=describe, make_env=make_env,
                   check=check_options, randomization=SCENE,
                   appearance_options=frozenset({"image_height", "image_width", "shadows", ANTIALIAS})))
