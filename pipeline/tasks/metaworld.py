"""Built-in task family ``metaworld-<env>``: Meta-World v3's 50 tasks with their own scripted experts, and suites.

Each task is a Meta-World 3.0.0 env built exactly as LeRobot 0.6.1's Meta-World evaluation env builds it
(``lerobot/envs/metaworld.py``: ``MT1(env, seed=42)``, its first train task, camera ``corner2`` moved as LeRobot
moves it, resets seeded through ``env.seed(seed)``), and recorded as that env hands frames to a policy, so a
dataset made here is what ``lerobot-eval --env.type=metaworld`` evaluates against: ``observation.image`` is
``corner2`` flipped on both axes, 480x480, shadows on; ``observation.state`` the 4-d agent position (hand xyz
and gripper opening); a 4-d action; 80 fps; LeRobot's description of the env as the episode's task.

The expert is the env's own ``metaworld.policies`` policy. It is reactive, and
:func:`demoforge.pipeline.reactive.reactive_segments` cuts it into segments at the steps where it switches
phase (``metaworld_phases.py`` names the phases of each expert's branches). Success is the env's own
``info["success"]``: the episode ends at the first step that reports it (as LeRobot's env terminates there); an
expert that has not succeeded by ``max_steps`` is truncated, and the attempt retried.

Suites (``metaworld-mt10``, ``-mt50`` and LeRobot's difficulty groups ``-easy``, ``-medium``, ``-hard``,
``-very-hard``) run N episodes of every member task in one store (see ``pipeline/tasks/suite.py``).

Nothing here imports metaworld until an env is built: listing and describing the tasks reads LeRobot's
``metaworld_config.json`` as data.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import threading
import warnings
from collections.abc import Mapping
from functools import cache
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

from demoforge.pipeline.reactive import Phase, ReturnBranch, reactive_segments
from demoforge.pipeline.tasks.metaworld_phases import PHASES, ExpertPhases
from demoforge.pipeline.tasks.mujoco_gl import ANTIALIAS, DepthCamera, close_renderer, render_rgb, set_antialias
from demoforge.pipeline.tasks.randomization import SceneRandomization, unwrapped_model
from demoforge.pipeline.tasks.registry import (
    CameraSpec,
    TaskDefinitionError,
    TaskEntry,
    TaskInfo,
    TaskOptionError,
    depth_camera,
    fingerprint_options,
    register,
)
from demoforge.pipeline.tasks.suite import TaskSuiteEnv
from demoforge.stages.contract import RecordedObservation
from demoforge.stages.task_protocol import Pose

PREFIX = "metaworld-"
SUPPORTED_METAWORLD = "3.0.0"  # the version lerobot[metaworld] 0.6.1 pins; the phase tables are written for it
FPS = 80  # LeRobot's MetaworldEnv config (frame_skip 5 x timestep 2.5 ms)
CAMERAS = ("corner2", "corner", "corner3", "topview", "behindGripper", "gripperPOV")  # the scene's cameras
LEROBOT_CAMERA = "corner2"  # the camera LeRobot's env renders (and flips on both axes)
IMAGE_KEY = "observation.image"  # the one image LeRobot's Meta-World env gives a policy
STATE_KEY = "observation.state"
ENV_STATE_KEY = "observation.environment_state"  # LeRobot's name for a full environment state
ENV_STATE_DIM = 39  # Meta-World v3's observation: hand, gripper, two objects, previous frame's, goal
MAX_STEPS = 500  # the env's own max_path_length, the episode length LeRobot evaluates with
ADDED_OPTIONS: Mapping[str, Any] = {ANTIALIAS: True, "init_range": 1.0}  # added later: out of fingerprints at default
DEFAULTS: Mapping[str, Any] = {"camera": LEROBOT_CAMERA, "image_size": 480, "shadows": True, "depth": False,
                               "max_steps": MAX_STEPS, "full_state": False, **ADDED_OPTIONS}
IMAGE_SIZE_RANGE = (32, 1024)
# Option init_range: the env's random reset space (object and goal starts) as a share of its own, about its
# centre (1: its own; 0.3: a narrow range, as a source for `demoforge multiply` to widen). Declared for the envs
# multiply multiplies (POSE_TASKS): their object and goal regions lie apart, so a narrowed draw never meets the
# env's redraw-while-too-close loops.
INIT_RANGE = (0.1, 1.0)
# Meta-World's MT10 (metaworld.env_dict.MT10_V3, in its order; a test checks it against the installed package).
MT10 = ("reach-v3", "push-v3", "pick-place-v3", "door-open-v3", "drawer-open-v3", "drawer-close-v3",
        "button-press-topdown-v3", "peg-insert-side-v3", "window-open-v3", "window-close-v3")
# suite name -> where its members come from: MT10 above, MT50 in LeRobot's task-id order, the difficulty groups
SUITES = {"mt10": "MT10", "mt50": "TASK_NAME_TO_ID", "easy": "easy", "medium": "medium", "hard": "hard",
          "very-hard": "very_hard"}


class MetaWorldVersionError(TaskDefinitionError):
    """The installed metaworld is not the version demoforge's Meta-World tasks are written for."""


# -------------------------------------------------------------------------------------- LeRobot's config
@cache
def lerobot_config() -> Mapping[str, Any]:
    """LeRobot's ``metaworld_config.json`` (task descriptions, ids, difficulty groups), read as data: importing
    ``lerobot.envs.metaworld`` would import metaworld and torch."""
    spec = importlib.util.find_spec("lerobot")
    if spec is None or not spec.submodule_search_locations:
        raise TaskDefinitionError("lerobot is not installed; the Meta-World tasks read its metaworld_config.json")
    path = Path(list(spec.submodule_search_locations)[0]) / "envs" / "metaworld_config.json"
    return json.loads(path.read_text())


def env_names() -> tuple[str, ...]:
    """The 50 Meta-World v3 envs, in LeRobot's task-id order."""
    ids = lerobot_config()["TASK_NAME_TO_ID"]
    return tuple(sorted(ids, key=ids.__getitem__))


def suite_members(suite: str) -> tuple[str, ...]:
    source = SUITES[suite]
    if source == "MT10":
        return MT10
    if source == "TASK_NAME_TO_ID":
        return env_names()
    return tuple(lerobot_config()["DIFFICULTY_TO_TASKS"][source])


def task_names() -> tuple[str, ...]:
    """Every name this family registers: one task per env, then the suites."""
    return tuple(PREFIX + env for env in env_names()) + tuple(PREFIX + suite for suite in SUITES)


def description(env: str) -> str:
    return str(lerobot_config()["TASK_DESCRIPTIONS"][env])


def check_version() -> None:
    try:
        installed = importlib.metadata.version("metaworld")
    except importlib.metadata.PackageNotFoundError:
        raise MetaWorldVersionError(f"metaworld is not installed; the Meta-World tasks need metaworld=="
                                    f"{SUPPORTED_METAWORLD} (bash tools/setup.sh installs it)") from None
    if installed != SUPPORTED_METAWORLD:
        raise MetaWorldVersionError(f"metaworld {installed} is installed; demoforge's Meta-World tasks are written "
                                    f"for metaworld=={SUPPORTED_METAWORLD} (its experts' branches name the segments, "
                                    f"and LeRobot 0.6.1 evaluates on it): pip install metaworld=={SUPPORTED_METAWORLD}")


# ------------------------------------------------------------------------------------------- options
def _cameras(options: Mapping[str, Any]) -> tuple[str, ...]:
    raw = str(options["camera"]).strip()
    return () if raw == "none" else tuple(c.strip() for c in raw.split(",") if c.strip())


def check(options: Mapping[str, Any], env: str | None = None) -> None:
    """``env``: the task's Meta-World env (None: a suite)."""
    check_version()
    cameras = _cameras(options)
    unknown = [c for c in cameras if c not in CAMERAS]
    if unknown or len(set(cameras)) != len(cameras) or (not cameras and str(options["camera"]).strip() != "none"):
        raise TaskOptionError(f"Meta-World option 'camera' must be one or more of {', '.join(CAMERAS)} "
                              f"(comma-separated, each once) or none; got {options['camera']!r}")
    if options["depth"] and not cameras:
        raise TaskOptionError("Meta-World option 'depth' needs a camera (camera=none records no image)")
    low, high = IMAGE_SIZE_RANGE
    if not low <= options["image_size"] <= high:
        raise TaskOptionError(f"Meta-World option 'image_size' must be in {low}..{high}, got {options['image_size']!r}")
    if not 1 <= options["max_steps"] <= MAX_STEPS:
        raise TaskOptionError(f"Meta-World option 'max_steps' must be in 1..{MAX_STEPS} (the env's own limit), got "
                              f"{options['max_steps']!r}")
    narrowest, widest = INIT_RANGE
    if not narrowest <= options["init_range"] <= widest:  # NaN fails this too
        raise TaskOptionError(f"Meta-World option 'init_range' must be in {narrowest}..{widest}, got "
                              f"{options['init_range']!r}")
    if options["init_range"] != 1.0 and env not in POSE_TASKS:
        raise TaskOptionError(f"Meta-World option 'init_range' is declared for {', '.join(POSE_TASKS)} only (the envs "
                              f"demoforge multiply multiplies), not {env or 'a suite'}")


def camera_specs(options: Mapping[str, Any]) -> tuple[CameraSpec, ...]:
    """One camera is recorded as ``observation.image`` (LeRobot's key); several under their own names."""
    cameras, size = _cameras(options), int(options["image_size"])
    rgb = [CameraSpec(IMAGE_KEY if len(cameras) == 1 else c, size, size) for c in cameras]
    return tuple(rgb) + (tuple(depth_camera(c) for c in rgb) if options["depth"] else ())


def state_shapes(options: Mapping[str, Any]) -> dict[str, tuple[int, ...]]:
    """The 4-d agent position LeRobot's env gives a policy; with ``full_state``, also the env's whole 39-d
    observation as ``observation.environment_state`` (what a state-based policy needs)."""
    shapes: dict[str, tuple[int, ...]] = {STATE_KEY: (4,)}
    if options["full_state"]:
        shapes[ENV_STATE_KEY] = (ENV_STATE_DIM,)
    return shapes


def _describe(env: str, options: Mapping[str, Any]) -> TaskInfo:
    return TaskInfo(
        name=PREFIX + env,
        description=f"Meta-World {env}: {description(env)} (metaworld {SUPPORTED_METAWORLD}'s scripted expert, "
                    "segmented at its phase changes; as LeRobot's Meta-World env renders it)",
        instruction=description(env), fps=FPS, action_shape=(4,), state_shapes=state_shapes(options),
        cameras=camera_specs(options), segment_names=PHASES[env].names(),
        options=fingerprint_options(options, ADDED_OPTIONS),
        action_names=("dx", "dy", "dz", "gripper"), robot_type="sawyer", labels_any_state=True)


def _describe_suite(suite: str, options: Mapping[str, Any]) -> TaskInfo:
    members = suite_members(suite)
    names = tuple(dict.fromkeys(n for env in members for n in PHASES[env].names()))
    return TaskInfo(
        name=PREFIX + suite,
        description=f"Meta-World suite {suite}: {len(members)} tasks ({', '.join(members[:3])}, ...), N episodes "
                    "of each in one store, each task with its own expert and LeRobot's description as its task",
        instruction="; ".join(description(env) for env in members[:1]) + " (one per member task)", fps=FPS,
        action_shape=(4,), state_shapes=state_shapes(options), cameras=camera_specs(options), segment_names=names,
        options=fingerprint_options(options, ADDED_OPTIONS), action_names=("dx", "dy", "dz", "gripper"),
        robot_type="sawyer",
        suite=tuple(PREFIX + env for env in members), labels_any_state=True)


# ------------------------------------------------------------------------------------------ the expert
class MetaWorldExpert:
    """A Meta-World policy as a :class:`~demoforge.pipeline.reactive.ReactiveExpert`: its action, and the phase
    named by the branches its ``_desired_pos`` and ``_grab_effort`` returned from."""

    def __init__(self, env: str) -> None:
        from metaworld.policies import ENV_POLICY_MAP

        self.env = env
        policy_class: Any = ENV_POLICY_MAP[env]
        self.policy = policy_class()
        self.phases: ExpertPhases = PHASES[env]
        cls: Any = type(self.policy)
        self._target = None if self.phases.branch else ReturnBranch(cls._desired_pos)
        self._grip = ReturnBranch(cls._grab_effort) if hasattr(cls, "_grab_effort") else None
        self._cache: dict[str, Phase] = {}

    def decide(self, observation: Any) -> tuple[Any, Phase]:
        for probe in (self._target, self._grip):
            if probe is not None:
                probe.clear()
        with warnings.catch_warnings():  # "Constant(s) may be too high": the env clips actions to [-1, 1]
            warnings.simplefilter("ignore")
            action = self.policy.get_action(observation)
        if self.phases.branch is not None:
            target: int | None = self.phases.branch(self.policy._parse_obs(observation))
        else:
            assert self._target is not None
            target = self._target.last()
        grip = self._grip.last() if self._grip is not None else None
        # The experts' proportional moves exceed [-1, 1]; the env clips them: record what it executes.
        return np.clip(np.asarray(action, dtype=np.float32), -1.0, 1.0), self._phase(self.phases.name(target, grip))

    def _phase(self, name: str) -> Phase:
        phase = self._cache.get(name)
        if phase is None:
            phase = self._cache[name] = Phase(name, self.phases.instructions[name], self.phases.obj,
                                              {"expert": type(self.policy).__name__})
        return phase


# --------------------------------------------------------------------------------------------- the env
#: One env built at a time in a process: MT1 seeds numpy's global generator and draws its 50 goals from it (two
#: thread workers building at once interleaved their draws: "Only generated 47 unique goals"), and the warnings
#: filter it is built under is process-wide too.
_BUILD_LOCK = threading.Lock()


def _build_env(env: str, camera: str | None, size: int) -> Any:
    """The env as LeRobot 0.6.1's ``MetaworldEnv._ensure_env`` builds it (its recipe, step by step)."""
    import metaworld

    with _BUILD_LOCK, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        benchmark = metaworld.MT1(env, seed=42)
        kwargs: dict[str, Any] = {}
        if camera is not None:
            kwargs = {"render_mode": "rgb_array", "camera_name": camera, "width": size, "height": size}
        sawyer = benchmark.train_classes[env](**kwargs)
        sawyer.set_task(benchmark.train_tasks[0])
        if camera == LEROBOT_CAMERA:
            sawyer.model.cam_pos[2] = [0.75, 0.075, 0.7]
        sawyer.reset()
    sawyer._freeze_rand_vec = False  # otherwise every reset would give the same scene
    sawyer.seeded_rand_vec = True  # reset(seed) controls the object positions
    return sawyer


class MetaWorldTask(gym.Wrapper):
    """One Meta-World env with its expert: seeded like LeRobot's env, terminating at success, recording the agent
    position and the configured cameras as LeRobot's env returns them."""

    def __init__(self, env: str, options: Mapping[str, Any]) -> None:
        cameras = _cameras(options)
        size = int(options["image_size"])
        sawyer = _build_env(env, cameras[0] if cameras else None, size)
        sawyer.max_path_length = int(options["max_steps"])
        if float(options["init_range"]) != 1.0:
            _narrow_reset_space(sawyer, float(options["init_range"]))
        if not options["shadows"]:
            sawyer.model.light_castshadow[:] = 0
        set_antialias(sawyer.model, bool(options[ANTIALIAS]))
        super().__init__(sawyer)
        self.name = env
        self.expert = MetaWorldExpert(env)
        self._specs = camera_specs(options)
        import mujoco

        self._camera_ids = [int(mujoco.mj_name2id(sawyer.model, mujoco.mjtObj.mjOBJ_CAMERA, c)) for c in cameras]
        self._cameras = cameras
        self.recorded_cameras = tuple(cameras)
        self._depth = DepthCamera(sawyer.model, size, size) if options["depth"] else None
        self._last: Any = None
        self._full_state = bool(options["full_state"])

    @property
    def _sawyer(self) -> Any:
        return self.env.unwrapped

    # -- gym API
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        if seed is not None:
            self._sawyer.seed(seed)  # LeRobot's env seeds this way: reset() itself ignores the seed
        observation, info = self.env.reset(seed=seed, options=options)
        self._last = observation
        return observation, info

    def step(self, action: Any):
        observation, reward, terminated, truncated, info = self.env.step(action)
        self._last = observation
        return observation, reward, bool(terminated or info.get("success", 0)), truncated, info

    def close(self) -> None:
        if self._depth is not None:
            self._depth.close()
            self._depth = None
        renderer = getattr(self._sawyer, "mujoco_renderer", None)
        if renderer is not None and self._cameras:
            close_renderer(renderer)
        super().close()

    # -- task protocol
    def create_demo_segments(self) -> Any:
        return reactive_segments(self.expert, lambda: self._last)

    def demo_record(self, observation: Any) -> RecordedObservation:
        state = {STATE_KEY: np.asarray(observation[:4], dtype=np.float32)}
        if self._full_state:
            state[ENV_STATE_KEY] = np.asarray(observation, dtype=np.float32)
        images: dict[str, np.ndarray] = {}
        renderer = self._sawyer.mujoco_renderer if self._cameras else None
        rgb_specs = [s for s in self._specs if not s.is_depth]
        for spec, camera, camera_id in zip(rgb_specs, self._cameras, self._camera_ids):
            frame = render_rgb(renderer, camera_id)
            images[spec.name] = _as_lerobot_returns(frame, camera)
        if self._depth is not None:
            for spec, camera in zip(rgb_specs, self._cameras):
                depth = self._depth.render(self._sawyer.data, camera)
                images[depth_camera(spec).name] = _as_lerobot_returns(depth, camera)
        return RecordedObservation(state=state, images=images)

    def demo_success(self, observation: Any, info: Mapping[str, Any]) -> bool:
        return bool(info.get("success", 0))

    def demo_hold_action(self) -> np.ndarray:
        return np.zeros(4, dtype=np.float32)  # delta control: no motion, no gripper effort

    def demo_instruction(self) -> str:
        return description(self.name)

    def demo_poses(self) -> MetaWorldPoses | None:
        """The poses ``demoforge multiply`` needs, for the envs :data:`POSE_TASKS` describes (None: others)."""
        return MetaWorldPoses(self._sawyer, self.name) if self.name in POSE_TASKS else None


# The envs ``demoforge multiply`` can multiply: env -> (the body whose orientation is the object's, None: the
# object is the goal; the phases that move with the goal rather than the object: carrying it there, inserting).
POSE_TASKS: Mapping[str, tuple[str | None, frozenset[str]]] = {
    "reach-v3": (None, frozenset()),
    "pick-place-v3": ("obj", frozenset({"place"})),
    "push-v3": ("obj", frozenset({"push"})),
    "drawer-open-v3": ("drawer_link", frozenset()),
    "peg-insert-side-v3": ("peg", frozenset({"move", "insert"})),
    "assembly-v3": ("RoundNut", frozenset({"move", "insert"})),
    "hammer-v3": ("hammer", frozenset({"hammer"})),
}
GOAL = "goal"


class MetaWorldPoses:
    """What ``demoforge multiply`` reads and commands of a Meta-World Sawyer (stages/task_protocol.py
    ``TaskPoses``).

    The action is a Cartesian delta: it moves the mocap body the hand is welded to by ``action_scale`` metres
    per unit (clipped to [-1, 1], then to the mocap's box), the orientation fixed. The hand lags the mocap by up
    to a few centimetres while it moves, so the end effector is reported where the controller holds it, at the
    mocap (with the hand's orientation): commanded and reported poses are then in one frame, and the action
    toward a pose is the clipped delta from the mocap. The object is the one the expert's phases target (at the
    point the expert aims at, ``_get_pos_objects``), the goal is the env's target position."""

    follows_plan = False  # a reactive expert: its segments end where its phase changes, not on request

    def __init__(self, sawyer: Any, env: str) -> None:
        self.sawyer = sawyer
        self.body, self.with_goal = POSE_TASKS[env]
        self.object = PHASES[env].obj

    def _mocap(self) -> np.ndarray:
        return np.array(self.sawyer.data.mocap_pos[0], dtype=np.float64)

    def _hand_quaternion(self) -> np.ndarray:
        return np.array(self.sawyer.data.body("hand").xquat, dtype=np.float64)

    def eef_pose(self) -> Pose:
        return Pose(self._mocap(), self._hand_quaternion())

    def object_poses(self) -> dict[str, Pose]:
        poses = {GOAL: Pose(np.asarray(self.sawyer._target_pos, dtype=np.float64))}
        if self.body is not None:
            poses[self.object] = Pose(np.asarray(self.sawyer._get_pos_objects()[:3], dtype=np.float64),
                                      np.array(self.sawyer.data.body(self.body).xquat, dtype=np.float64))
        return poses

    def reference(self, segment: str, target: str | None) -> str | None:
        return GOAL if segment in self.with_goal else target

    def gripper(self, action: np.ndarray) -> float:
        return float(np.asarray(action, dtype=np.float64).reshape(-1)[3])

    def commanded_pose(self, action: np.ndarray) -> Pose:
        move = np.clip(np.asarray(action, dtype=np.float64).reshape(-1)[:3], -1.0, 1.0)
        target = np.clip(self._mocap() + move * self.sawyer.action_scale, self.sawyer.mocap_low, self.sawyer.mocap_high)
        return Pose(target, self._hand_quaternion())

    def action_toward(self, pose: Pose, gripper: float) -> np.ndarray:
        move = np.clip((pose.position - self._mocap()) / self.sawyer.action_scale, -1.0, 1.0)
        return np.append(move, np.clip(gripper, -1.0, 1.0)).astype(np.float32)


def _narrow_reset_space(sawyer: Any, share: float) -> None:
    """Shrink the env's random reset space about its centre to ``share`` of its size: each reset draws the same
    uniforms as in the full space, mapped into the narrow one."""
    from gymnasium.spaces import Box

    space = sawyer._random_reset_space
    centre, half = (space.high + space.low) / 2, (space.high - space.low) / 2 * share
    sawyer._random_reset_space = Box(centre - half, centre + half, dtype=np.float64)


def _as_lerobot_returns(image: np.ndarray, camera: str) -> np.ndarray:
    """LeRobot's env flips the corner2 camera on both axes (it renders upside down); others it does not render."""
    return np.ascontiguousarray(np.flip(image, (0, 1))) if camera == LEROBOT_CAMERA else image


# ---------------------------------------------------------------------------------------- registry
# Root bodies of every Meta-World v3 scene: the Sawyer ("base"), its mocap, the table and the wall; the rest
# are the task's objects (a block, a door, a drawer...).
_SCENE_ROOTS = ("base", "mocap", "tablelink", "RetainingWall", "world")
OBJECTS = ("*",) + tuple(f"!{root}" for root in _SCENE_ROOTS)
APPEARANCE = frozenset({"camera", "image_size", "shadows", "depth", ANTIALIAS})  # options rerender may change
SCENE = SceneRandomization(
    model=unwrapped_model,
    color_groups={"table": ("tablelink",), "floor": ("world",), "walls": ("RetainingWall",), "robot": ("base",),
                  "objects": OBJECTS},
    cameras=lambda env: env.get_wrapper_attr("recorded_cameras"),
    bodies=OBJECTS)


def _entry(env: str) -> TaskEntry:
    return TaskEntry(name=PREFIX + env, defaults=DEFAULTS, describe=lambda options: _describe(env, options),
                     make_env=lambda options: MetaWorldTask(env, options), check=lambda options: check(options, env),
                     randomization=SCENE,
                     appearance_options=APPEARANCE)


def _suite_entry(suite: str) -> TaskEntry:
    members = tuple(PREFIX + env for env in suite_members(suite))
    return TaskEntry(name=PREFIX + suite, defaults=DEFAULTS, describe=lambda options: _describe_suite(suite, options),
                     make_env=lambda options: TaskSuiteEnv(
                         members, lambda member: MetaWorldTask(member.removeprefix(PREFIX), options)),
                     check=check, randomization=SCENE,
                     appearance_options=APPEARANCE)


ENTRIES = tuple(register(_entry(env)) for env in env_names()) + \
    tuple(register(_suite_entry(suite)) for suite in SUITES)
