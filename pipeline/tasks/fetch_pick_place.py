"""Built-in task "fetch-pick-place": a Fetch arm picks up a cube and places it at a target, K times.

Wraps gymnasium-robotics ``FetchPickAndPlace-v4``. Every cycle is planned from the cube's measured pose
when the previous cycle has finished, and every action is computed from the simulator's state at the moment
the executor asks for it (proportional control toward a waypoint), so a cycle absorbs wherever the last one
left the cube. Cycles after the first get a new goal drawn from the env's seeded ``np_random``, so one seed
always gives the same episode.

Placement depends on the goal: a goal on the table is released there; a goal in the air is held there on
the last cycle (letting go would drop the cube off it) and, on earlier cycles, the cube is lowered onto the
table below it before letting go, so the next cycle grasps a resting cube.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import gymnasium as gym
import numpy as np

from demoforge.pipeline.tasks.mujoco_gl import (
    ANTIALIAS,
    GL_LOCK,
    DepthCamera,
    close_renderer,
    own_context,
    set_antialias,
)
from demoforge.pipeline.tasks.randomization import SceneRandomization, enabled_axes, unwrapped_model
from demoforge.pipeline.tasks.registry import (
    CameraSpec,
    TaskEntry,
    TaskInfo,
    TaskOptionError,
    depth_camera,
    fingerprint_options,
    register,
)
from demoforge.stages.contract import RecordedObservation, Segment, StepView
from demoforge.stages.task_protocol import Pose

TASK_NAME = "fetch-pick-place"
FETCH_ENV_ID = "FetchPickAndPlace-v4"
CAMERA = "front"
DEPTH_CAMERA = "front_depth"  # registry.depth_camera's name for it
FPS = 25
# options added later: left out of fingerprints when at their default
ADDED_OPTIONS: Mapping[str, Any] = {"depth": False, ANTIALIAS: True, "init_range": 1.0}
DEFAULTS: Mapping[str, Any] = {"cycles": 3, "image_size": 224, **ADDED_OPTIONS}
CYCLES_RANGE = (1, 20)
IMAGE_SIZE_RANGE = (32, 1024)
PHASES = ("reach", "descend", "grasp", "carry", "release")
OBJ_RANGE = 0.15  # FetchPickAndPlace-v4's: the cube starts within +-15 cm of the gripper (x and y)
# Option init_range: the cube's start range as a share of the env's own (1: its own; 0.3: a narrow range around
# its centre, the gripper, as a source for `demoforge multiply` to widen). Below 0.1 the cube would start under
# the gripper's fingers.
INIT_RANGE = (0.1, 1.0)

# A free camera facing the robot across the table, near enough that the 5 cm cube is clearly visible at
# 224x224 anywhere it can start, looking down steeply enough that the raised gripper hides little of the
# table, and framing goals up to 45 cm above the table.
CAMERA_CONFIG: Mapping[str, Any] = {"distance": 0.95, "azimuth": 180.0, "elevation": -40.0,
                                    "lookat": (1.32, 0.75, 0.6)}

GAIN = 10.0  # action = clip(GAIN * error): saturates beyond 10 cm, mocap moves 5 cm per unit action
OPEN, CLOSE = 1.0, -1.0  # gripper action: finger position targets are qpos + action (clipped by the joint)
ABOVE = 0.06  # reach this far above the cube before descending around it
LIFT = 0.05  # the grasp ends by lifting the cube this far, which proves it is held
TRAVEL_CLEARANCE = 0.05  # a cube carried to a table goal travels at least this far above the table
RISE = 0.10  # after letting go the gripper rises this far above the cube
SETTLED = 0.005  # a lowered cube is on the table within this height
MIN_GOAL_SEPARATION = 0.10  # new goals are at least this far (in the table plane) from the cube
TABLE_GOAL = 0.005  # a goal this close to the resting height is on the table
FINGER_OPEN = 0.03  # each finger this far open counts as open (fully open is 0.05)
FINGER_HOLDING = 0.015  # each finger at least this far open when closed means a cube is between them

# Step caps per phase; a segment ends earlier when its waypoint is reached.
REACH_CAP, DESCEND_CAP = 20, 12
CLOSE_STEPS, LIFT_CAP = 4, 6
CARRY_CAP = 30
LOWER_CAP, OPEN_STEPS, RISE_CAP, HOLD_STEPS = 15, 4, 8, 5
CYCLE_CAP = (REACH_CAP + DESCEND_CAP + CLOSE_STEPS + LIFT_CAP + CARRY_CAP
             + LOWER_CAP + OPEN_STEPS + RISE_CAP)

Vector = np.ndarray


def _action(error: Vector, gripper: float) -> np.ndarray:
    """The proportional Cartesian command toward ``error`` with a gripper command."""
    move = np.clip(GAIN * np.asarray(error, dtype=np.float64), -1.0, 1.0)
    return np.append(move, gripper).astype(np.float32)


def _as_list(vector: Vector) -> list[float]:
    return [round(float(v), 6) for v in vector]


def segment_names(cycles: int) -> tuple[str, ...]:
    return tuple(f"{phase}_{i}" for i in range(cycles) for phase in PHASES)


def instruction(cycles: int) -> str:
    base = "pick up the cube and place it at the target"
    return base if cycles == 1 else f"{base}, {cycles} times"


def max_episode_steps(cycles: int) -> int:
    """Enough for every segment of every cycle to run to its cap, so the plan never meets the time limit."""
    return cycles * CYCLE_CAP + 20


class FetchPickPlace(gym.Wrapper):
    """Renders the front camera after every reset and step and plans K closed-loop pick-and-place cycles.

    With ``depth`` it also renders the front camera's depth (metres per pixel, same size and view) as camera
    ``front_depth``, through MuJoCo's own renderer so the z-buffer is converted to metres by MuJoCo.
    """

    def __init__(self, env: gym.Env, cycles: int, depth: bool = False, init_range: float = 1.0) -> None:
        super().__init__(env)
        self.cycles = cycles
        self.depth = depth
        self.init_range = init_range
        self._frame: np.ndarray | None = None
        self._depth: np.ndarray | None = None
        self._depth_renderer: Any = None
        self._frame_goal: np.ndarray | None = None

    # ------------------------------------------------------------------------------------ gym API
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        observation, info = self.env.reset(seed=seed, options=options)
        if self.init_range != 1.0:
            observation = self._narrow_start()
        self._capture()
        return observation, info

    def _narrow_start(self) -> Any:
        """Move the cube toward the centre of its start range (the gripper's start) by ``init_range``: the
        env's own draw, shrunk, so the narrow range is the full one scaled and needs no draw of its own (Fetch
        redraws a cube nearer than 10 cm to the gripper, so its range itself cannot simply be set smaller)."""
        fetch = self._fetch
        qpos = fetch._utils.get_joint_qpos(fetch.model, fetch.data, "object0:joint").copy()
        centre = np.asarray(fetch.initial_gripper_xpos[:2], dtype=np.float64)
        qpos[:2] = centre + self.init_range * (qpos[:2] - centre)
        fetch._utils.set_joint_qpos(fetch.model, fetch.data, "object0:joint", qpos)
        fetch._mujoco.mj_forward(fetch.model, fetch.data)
        return fetch._get_obs()

    def step(self, action: Any):
        result = self.env.step(action)
        self._capture()
        return result

    def close(self) -> None:
        """Free the renderers' GL objects in their own contexts (pipeline/tasks/mujoco_gl.py says why)."""
        if self._depth_renderer is not None:
            self._depth_renderer.close()
            self._depth_renderer = None
        renderer = getattr(self._fetch, "mujoco_renderer", None)
        if renderer is not None:
            close_renderer(renderer)
        super().close()

    def _viewer(self) -> Any:
        return getattr(getattr(self._fetch, "mujoco_renderer", None), "viewer", None)

    def _capture(self) -> None:
        """Render now, so the frame and the goal it shows belong to the latest observation."""
        with own_context(self._fetch.mujoco_renderer):  # the env's render also moves the goal marker
            self._frame = np.array(self.env.render(), dtype=np.uint8, copy=True)
        if self.depth:
            self._depth = self._render_depth()
        self._frame_goal = self._goal()

    def _render_depth(self) -> np.ndarray:
        """Depth in metres from the RGB viewer's camera, in MuJoCo's renderer (its own GL context)."""
        viewer = self._viewer()
        if self._depth_renderer is None:
            height, width = self._frame.shape[:2] if self._frame is not None else (0, 0)
            self._depth_renderer = DepthCamera(self._fetch.model, height, width)
        return self._depth_renderer.render(self._fetch.data, viewer.cam, viewer.vopt)

    # ---------------------------------------------------------------------------- simulator reads
    @property
    def _fetch(self) -> Any:
        return self.env.unwrapped

    def _site(self, name: str) -> Vector:
        fetch = self._fetch
        return fetch._utils.get_site_xpos(fetch.model, fetch.data, name).copy()

    def _grip(self) -> Vector:
        return self._site("robot0:grip")

    def _object(self) -> Vector:
        return self._site("object0")

    def _goal(self) -> Vector:
        return np.asarray(self._fetch.goal, dtype=np.float64).copy()

    def _table_z(self) -> float:
        """The cube's resting height on the table (Fetch measures it at construction)."""
        return float(self._fetch.height_offset)

    def _set_goal(self, goal: Vector) -> None:
        """Make ``goal`` the env's goal (desired_goal, is_success, the target marker) and re-render, so the
        frame recorded before the cycle's first action already shows it."""
        self._fetch.goal = np.asarray(goal, dtype=np.float64).copy()
        self._capture()

    def _sample_goal(self, avoid: Vector) -> Vector:
        """A goal from Fetch's own distribution (table or up to 45 cm above it, half the time each) drawn
        from the env's seeded generator, away from the cube so each cycle really moves it."""
        fetch = self._fetch
        rng = fetch.np_random
        goal = np.zeros(3)
        for _ in range(100):
            goal = fetch.initial_gripper_xpos[:3] + rng.uniform(-fetch.target_range, fetch.target_range, 3)
            goal = goal + fetch.target_offset
            goal[2] = self._table_z()
            if fetch.target_in_the_air and rng.uniform() < 0.5:
                goal[2] += rng.uniform(0, 0.45)
            if np.linalg.norm(goal[:2] - avoid[:2]) >= MIN_GOAL_SEPARATION:
                break
        return goal

    # ------------------------------------------------------------------------------ task protocol
    def create_demo_segments(self) -> Iterator[Segment]:
        for cycle in range(self.cycles):
            if cycle > 0:
                self._set_goal(self._sample_goal(self._object()))
            yield from self._plan_cycle(cycle)

    def demo_record(self, observation: Mapping[str, Any]) -> RecordedObservation:
        """The robot state of ``observation`` with the frame and goal captured with it. The goal comes from
        the capture, not ``desired_goal``: a cycle's new goal is set after the observation that starts the
        cycle was returned, and the frame recorded with the cycle's first action shows it (and so must
        the state)."""
        if self._frame is None or self._frame_goal is None:
            raise RuntimeError("demo_record before reset")
        state = {"observation.state": np.asarray(observation["observation"], dtype=np.float32),
                 "observation.goal": self._frame_goal.astype(np.float32)}
        images = {CAMERA: self._frame}
        if self._depth is not None:
            images[DEPTH_CAMERA] = self._depth
        return RecordedObservation(state=state, images=images)

    def demo_success(self, observation: Mapping[str, Any], info: Mapping[str, Any]) -> bool:
        distance = np.linalg.norm(np.asarray(observation["achieved_goal"]) - self._goal())
        return bool(distance < self._fetch.distance_threshold)

    def demo_hold_action(self) -> np.ndarray:
        """Zeros: the mocap stays at the gripper and each finger's target is its current position."""
        return np.zeros(4, dtype=np.float32)

    def demo_instruction(self) -> str:
        return instruction(self.cycles)

    def demo_poses(self) -> FetchPoses:
        return FetchPoses(self)

    # ---------------------------------------------------------------------------------- planning
    def _placement(self, cycle: int, goal: Vector) -> str:
        if goal[2] - self._table_z() < TABLE_GOAL:
            return "table"
        return "hold" if cycle == self.cycles - 1 else "lower"

    def _plan_cycle(self, cycle: int) -> Iterator[Segment]:
        """The five segments of one cycle, each created (and its metadata measured) when it is due."""
        goal = self._goal()
        placement = self._placement(cycle, goal)

        def segment(phase: str, actions: Iterator[np.ndarray], text: str,
                    validator: Callable[[StepView], bool]) -> Segment:
            metadata = {"cycle": cycle, "goal": _as_list(goal), "placement": placement,
                        "object_start": _as_list(self._object()), "gripper_start": _as_list(self._grip())}
            return Segment(actions=actions, name=f"{phase}_{cycle}", target="object0", instruction=text,
                           metadata=metadata, validator=validator)

        yield segment("reach", self._reach(), "move the open gripper above the cube", self._reached)
        yield segment("descend", self._descend(), "lower the open gripper around the cube", self._around)
        yield segment("grasp", self._grasp(), "close the gripper on the cube and lift it", self._lifted)
        yield segment("carry", self._carry(goal), "carry the cube to the target",
                      lambda view: self._object_near(view, goal))
        if placement == "table":
            yield segment("release", self._release(), "let go of the cube at the target and raise the gripper",
                          lambda view: self._released(view) and self._object_near(view, goal))
        elif placement == "lower":
            yield segment("release", self._lower_and_release(),
                          "put the cube down on the table below the target, let go and raise the gripper",
                          lambda view: self._released(view) and self._on_table(view))
        else:
            yield segment("release", self._hold(goal), "hold the cube still at the target",
                          lambda view: self._holding(view) and self._object_near(view, goal))

    # ----------------------------------------------------------------------------- action streams
    def _servo(self, target: Callable[[], Vector], gripper: float, cap: int, tol: float,
               point: Callable[[], Vector] | None = None) -> Iterator[np.ndarray]:
        """Drive ``point`` (the gripper unless given) to ``target``, both re-read before every action.

        Always yields at least one action (an empty segment is an error); stops once within ``tol`` (0: run
        all ``cap`` steps) or after ``cap`` actions.
        """
        point = point or self._grip
        for step in range(cap):
            error = target() - point()
            if step > 0 and np.linalg.norm(error) < tol:
                return
            yield _action(error, gripper)

    def _reach(self) -> Iterator[np.ndarray]:
        return self._servo(lambda: self._object() + [0.0, 0.0, ABOVE], OPEN, REACH_CAP, tol=0.01)

    def _descend(self) -> Iterator[np.ndarray]:
        return self._servo(self._object, OPEN, DESCEND_CAP, tol=0.01)

    def _grasp(self) -> Iterator[np.ndarray]:
        return itertools.chain(self._servo(self._object, CLOSE, CLOSE_STEPS, tol=0.0),
                               self._lift())

    def _lift(self) -> Iterator[np.ndarray]:
        target = self._grip() + [0.0, 0.0, LIFT]  # measured when the fingers have closed
        yield from self._servo(lambda: target, CLOSE, LIFT_CAP, tol=0.01)

    def _carry(self, goal: Vector) -> Iterator[np.ndarray]:
        """Move the cube (not the gripper) to the goal, travelling above the table first so it never drags."""
        travel = np.array([goal[0], goal[1], max(goal[2], self._table_z() + TRAVEL_CLEARANCE)])

        def waypoint() -> Vector:
            return goal if np.linalg.norm((goal - self._object())[:2]) < 0.02 else travel

        return self._servo(waypoint, CLOSE, CARRY_CAP, tol=0.01, point=self._object)

    def _release(self) -> Iterator[np.ndarray]:
        return itertools.chain(self._open(), self._rise())

    def _lower_and_release(self) -> Iterator[np.ndarray]:
        return itertools.chain(self._lower(), self._open(), self._rise())

    def _lower(self) -> Iterator[np.ndarray]:
        spot = self._object()  # measured when carrying ended
        spot[2] = self._table_z()
        yield from self._servo(lambda: spot, CLOSE, LOWER_CAP, tol=SETTLED, point=self._object)

    def _open(self) -> Iterator[np.ndarray]:
        hold = self._grip()
        yield from self._servo(lambda: hold, OPEN, OPEN_STEPS, tol=0.0)

    def _rise(self) -> Iterator[np.ndarray]:
        above = self._object() + [0.0, 0.0, RISE]
        yield from self._servo(lambda: above, OPEN, RISE_CAP, tol=0.02)

    def _hold(self, goal: Vector) -> Iterator[np.ndarray]:
        return self._servo(lambda: goal, CLOSE, HOLD_STEPS, tol=0.0, point=self._object)

    # -------------------------------------------------------------------------------- validators
    @staticmethod
    def _parts(view: StepView) -> tuple[Vector, Vector, Vector]:
        """Gripper position, cube position and the two finger openings of the validated observation."""
        obs = np.asarray(view.observation["observation"], dtype=np.float64)
        return obs[0:3], obs[3:6], obs[9:11]

    def _reached(self, view: StepView) -> bool:
        grip, obj, fingers = self._parts(view)
        return bool(np.linalg.norm(grip - (obj + [0.0, 0.0, ABOVE])) < 0.02 and np.all(fingers > FINGER_OPEN))

    def _around(self, view: StepView) -> bool:
        grip, obj, fingers = self._parts(view)
        return bool(np.linalg.norm(grip - obj) < 0.02 and np.all(fingers > FINGER_OPEN))

    def _holding(self, view: StepView) -> bool:
        grip, obj, fingers = self._parts(view)
        return bool(np.linalg.norm(grip - obj) < 0.02 and np.all(fingers > FINGER_HOLDING)
                    and np.all(fingers < FINGER_OPEN))

    def _lifted(self, view: StepView) -> bool:
        _, obj, _ = self._parts(view)
        return self._holding(view) and bool(obj[2] > self._table_z() + 0.02)

    def _object_near(self, view: StepView, goal: Vector) -> bool:
        _, obj, _ = self._parts(view)
        return bool(np.linalg.norm(obj - goal) < self._fetch.distance_threshold)

    def _released(self, view: StepView) -> bool:
        grip, obj, fingers = self._parts(view)
        return bool(np.all(fingers > FINGER_OPEN) and grip[2] - obj[2] > RISE / 2)

    def _on_table(self, view: StepView) -> bool:
        _, obj, _ = self._parts(view)
        return bool(abs(obj[2] - self._table_z()) < 2 * SETTLED)


class FetchPoses:
    """What ``demoforge multiply`` reads and commands of the Fetch arm (stages/task_protocol.py ``TaskPoses``).

    The action is a Cartesian delta: the mocap is put back on the gripper before every step and moved by
    ``MOCAP_STEP`` metres per unit of action, the orientation fixed; so the pose an action commands is the grip
    plus that delta, and the action toward a pose is the delta to it, clipped to [-1, 1] (no inverse
    kinematics). The cube's grasp moves with the cube; the carry and the release move with the goal."""

    follows_plan = True  # the planner yields segments without running them (and draws each cycle's goal)
    MOCAP_STEP = 0.05  # gymnasium-robotics' fetch: pos_ctrl *= 0.05
    GOAL = "goal"
    WITH_GOAL = ("carry", "release")

    def __init__(self, task: FetchPickPlace) -> None:
        self.task = task

    def _grip_quaternion(self) -> Vector:
        return np.array(self.task._fetch.data.body("robot0:gripper_link").xquat, dtype=np.float64)

    def eef_pose(self) -> Pose:
        return Pose(self.task._grip(), self._grip_quaternion())

    def object_poses(self) -> dict[str, Pose]:
        cube = Pose(self.task._object(), np.array(self.task._fetch.data.body("object0").xquat, dtype=np.float64))
        return {"object0": cube, self.GOAL: Pose(self.task._goal())}

    def reference(self, segment: str, target: str | None) -> str | None:
        return self.GOAL if segment.rsplit("_", 1)[0] in self.WITH_GOAL else target

    def gripper(self, action: np.ndarray) -> float:
        return float(np.asarray(action, dtype=np.float64).reshape(-1)[3])

    def commanded_pose(self, action: np.ndarray) -> Pose:
        move = np.clip(np.asarray(action, dtype=np.float64).reshape(-1)[:3], -1.0, 1.0)
        return Pose(self.task._grip() + self.MOCAP_STEP * move, self._grip_quaternion())

    def action_toward(self, pose: Pose, gripper: float) -> np.ndarray:
        move = np.clip((pose.position - self.task._grip()) / self.MOCAP_STEP, -1.0, 1.0)
        return np.append(move, np.clip(gripper, -1.0, 1.0)).astype(np.float32)


# ------------------------------------------------------------------------------------------ registry
def check(options: Mapping[str, Any]) -> None:
    for key, (low, high) in (("cycles", CYCLES_RANGE), ("image_size", IMAGE_SIZE_RANGE), ("init_range", INIT_RANGE)):
        if not low <= options[key] <= high:  # NaN fails this too
            raise TaskOptionError(f"task {TASK_NAME!r} option {key!r} must be in {low}..{high}, "
                                  f"got {options[key]!r}")


def _cameras(size: int, depth: bool) -> tuple[CameraSpec, ...]:
    rgb = CameraSpec(CAMERA, size, size)
    return (rgb, depth_camera(rgb)) if depth else (rgb,)


def describe(options: Mapping[str, Any]) -> TaskInfo:
    cycles, size = int(options["cycles"]), int(options["image_size"])
    return TaskInfo(
        name=TASK_NAME,
        description=f"Fetch arm picks up a cube and places it at a target {cycles} time(s) per episode, each "
                    f"cycle planned from the cube's measured pose (gymnasium-robotics {FETCH_ENV_ID})",
        instruction=instruction(cycles), fps=FPS, action_shape=(4,),
        state_shapes={"observation.state": (25,), "observation.goal": (3,)},
        cameras=_cameras(size, bool(options["depth"])), segment_names=segment_names(cycles),
        options=fingerprint_options(options, ADDED_OPTIONS), action_names=("dx", "dy", "dz", "gripper"),
        robot_type="fetch")


def make_env(options: Mapping[str, Any]) -> FetchPickPlace:
    import gymnasium_robotics  # registers the Fetch envs; imported here so describe() needs no simulator

    gym.register_envs(gymnasium_robotics)
    cycles, size = int(options["cycles"]), int(options["image_size"])
    camera = {k: np.array(v, dtype=np.float64) if isinstance(v, tuple) else v for k, v in CAMERA_CONFIG.items()}
    env = gym.make(FETCH_ENV_ID, render_mode="rgb_array", width=size, height=size,
                   max_episode_steps=max_episode_steps(cycles), default_camera_config=camera)
    set_antialias(env.unwrapped.model, bool(options[ANTIALIAS]))  # type: ignore[attr-defined]  # before any render
    # --randomize init draws the range (the env's own, widened): init_range narrows only without it
    init_range = 1.0 if "init" in enabled_axes(options, SCENE) else float(options["init_range"])
    return FetchPickPlace(env, cycles, depth=bool(options["depth"]), init_range=init_range)


def _free_camera(env: gym.Env) -> Any:
    """The free camera the front view is rendered from (the env's offscreen viewer's, made now if need be)."""
    renderer = env.unwrapped.mujoco_renderer  # type: ignore[attr-defined]
    with GL_LOCK:
        return renderer._get_viewer(render_mode="rgb_array").cam  # noqa: SLF001 (gymnasium's only handle)


def _widen_object_range(env: gym.Env, scale: float) -> dict[str, Any]:
    """gymnasium-robotics places the cube uniformly within +-obj_range of the gripper's start; widen it."""
    fetch = env.unwrapped
    fetch.obj_range = OBJ_RANGE * scale  # type: ignore[attr-defined]
    return {"obj_range": OBJ_RANGE * scale}


APPEARANCE = frozenset({"image_size", "depth", ANTIALIAS})  # options rerender may change
SCENE = SceneRandomization(
    model=unwrapped_model,
    color_groups={"table": ("table0",), "floor": ("floor0", "world"), "robot": ("robot0:*",),
                  "objects": ("object0",)},
    free_camera=_free_camera, bodies=("object0",), init=_widen_object_range,
    limits={"randomize.init.scale": 1.5})  # beyond +-22 cm the cube can start at the table's far edge

ENTRY = register(TaskEntry(name=TASK_NAME, defaults=DEFAULTS, describe=describe, make_env=make_env,
                           check=check, randomization=SCENE,
                     appearance_options=APPEARANCE))
