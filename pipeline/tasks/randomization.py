"""Per-episode domain randomization of a MuJoCo scene: drawn from the attempt's seed, recorded with the episode.

One mechanism for any MuJoCo-based task: the task names what may vary (:class:`SceneRandomization`: lights,
colour groups of bodies, recorded cameras, bodies whose physics may change, an initial-state range) and the
job picks axes and ranges as task options (``randomize=lighting,camera``, ``randomize.camera.pos=0.03``).
Before each attempt's reset the executor calls :meth:`RandomizedScene.demo_randomize` with the attempt's
seed: the compiled model is put back to its nominal values, then each enabled axis draws from its own
generator (so a physics draw does not change when an appearance axis is added) and edits ``mjModel`` fields
in place. Model edits survive ``reset`` (it resets ``mjData`` only) and cost nothing per step. The drawn values
go into the episode record; replay draws them again from the recorded seed and checks they match.

A ``variant`` (``demoforge rerender --variants K``) redraws the appearance axes only, from the seed and the
variant number; physics and the initial state stay the episode's own, so the re-simulation is unchanged.

Written here rather than taken from a library: robosuite's and dm_control's randomizers are tied to their
own environment classes; this one needs only ``mjModel`` and names.
"""

from __future__ import annotations

import fnmatch
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym
import numpy as np

RANDOMIZE = "randomize"  # the option naming the enabled axes, comma-separated
AXES = ("lighting", "colors", "camera", "physics", "init")
APPEARANCE_AXES = frozenset({"lighting", "colors", "camera"})  # what rerender may change
_SALT = 0x5CE7E  # the randomization generators' own stream (control.py's noise uses others)
_TARGET_MODES = (3, 4)  # mjCAMLIGHT_TARGETBODY, mjCAMLIGHT_TARGETBODYCOM
WORLD = "world"  # the world body in a group's patterns: geoms attached to the world (a floor)


class RandomizationError(ValueError):
    """A randomization axis or range is unknown, or outside what the task allows."""


@dataclass(frozen=True)
class Range:
    """One randomization option: its default, the largest value any task accepts, and what it means."""

    default: float
    limit: float
    help: str
    minimum: float = 0.0


#: Every range option, ``randomize.<axis>.<what>``; a task may lower a limit (SceneRandomization.limits).
RANGES: Mapping[str, Range] = {
    "randomize.lighting.pos": Range(0.3, 1.0, "each light moves up to this far (m) along each axis"),
    "randomize.lighting.dir": Range(15.0, 45.0, "each light's direction turns up to this far (degrees) about "
                                                "each axis"),
    "randomize.lighting.brightness": Range(0.3, 0.8, "each light's diffuse and specular scale by 1 +- this"),
    "randomize.lighting.ambient": Range(0.15, 0.5, "the headlight's ambient moves by up to +- this (0..1)"),
    "randomize.colors.rgb": Range(0.25, 1.0, "each colour group's RGB moves by up to +- this per channel (0..1)"),
    "randomize.camera.pos": Range(0.02, 0.1, "each recorded camera moves up to this far (m) along each axis"),
    "randomize.camera.rot": Range(2.0, 10.0, "each recorded camera turns up to this far (degrees) about each axis"),
    "randomize.physics.friction": Range(0.2, 0.5, "sliding friction of the task's bodies scales by 1 +- this"),
    "randomize.physics.mass": Range(0.2, 0.5, "mass (and inertia) of the task's bodies scales by 1 +- this"),
    "randomize.physics.damping": Range(0.2, 0.5, "joint damping of the task's bodies scales by 1 +- this"),
    "randomize.init.scale": Range(1.3, 2.0, "the task's initial-state range is widened by this factor", 1.0),
}


def option_defaults(scene: SceneRandomization | None = None) -> dict[str, Any]:
    """The randomization options every randomizable task accepts, at their defaults (off); with ``scene``, a
    range's default is capped at that task's limit (a task that allows less starts from what it allows)."""
    return {RANDOMIZE: "", **{key: default_range(key, scene) for key in RANGES}}


def default_range(key: str, scene: SceneRandomization | None) -> float:
    """Range option ``key``'s default for the task of ``scene`` (the shared default, capped at its limit)."""
    return min(RANGES[key].default, scene.limit(key)) if scene is not None else RANGES[key].default


def parse_axes(value: str) -> tuple[str, ...]:
    """``"lighting,colors"`` -> the axes in canonical order; ``"all"`` is every axis the caller allows; ``""``
    (the default) is none. An empty item (``",,"``, ``"lighting,"``) is refused: such a value randomized nothing
    and was still stored in the job's options."""
    if not str(value).strip():
        return ()
    names = [a.strip() for a in str(value).split(",")]
    if not all(names):
        raise RandomizationError(f"randomization axes {str(value)!r} hold an empty item; give comma-separated axes "
                                 f"among {', '.join(AXES)} (or all)")
    unknown = [a for a in names if a not in AXES and a != "all"]
    if unknown:
        raise RandomizationError(f"unknown randomization axis {unknown[0]!r}; axes: {', '.join(AXES)} (or all)")
    if "all" in names:
        return AXES
    return tuple(a for a in AXES if a in names)


# ------------------------------------------------------------------------------------------- task side
BodyPatterns = tuple[str, ...]


@dataclass(frozen=True)
class SceneRandomization:
    """What a MuJoCo task lets vary, by name.

    Groups and bodies are fnmatch patterns over the names of *root* bodies (children of the world body);
    a group takes every geom of the matched roots' subtrees, ``world`` the geoms attached to the world itself,
    and a pattern starting with ``!`` removes roots matched before it (``("*", "!robot*")``: all but the robot).
    """

    model: Callable[[gym.Env], Any]  # the env's mujoco.MjModel now (a suite's current member's)
    color_groups: Mapping[str, BodyPatterns] = field(default_factory=dict)
    cameras: Callable[[gym.Env], Sequence[str]] | tuple[str, ...] = ()  # the recorded fixed cameras
    free_camera: Callable[[gym.Env], Any] | None = None  # an mjvCamera the task records from, if any
    bodies: BodyPatterns = ()  # whose friction, mass and damping may vary
    init: Callable[[gym.Env, float], Mapping[str, Any]] | None = None  # widens the initial-state range
    limits: Mapping[str, float] = field(default_factory=dict)  # narrower limits than RANGES'
    # Called with the attempt's seed before anything is drawn, for a task whose model depends on the seed
    # (robosuite loads a model per seed): it loads that model now, so the draw lands on the one the episode runs
    before_draw: Callable[[gym.Env, int], None] | None = None

    def axes(self) -> tuple[str, ...]:
        """The axes this task supports."""
        present = {"lighting": True, "colors": bool(self.color_groups),
                   "camera": bool(self.cameras) or self.free_camera is not None,
                   "physics": bool(self.bodies), "init": self.init is not None}
        return tuple(a for a in AXES if present[a])

    def limit(self, key: str) -> float:
        return min(RANGES[key].limit, float(self.limits.get(key, RANGES[key].limit)))


def check_options(options: Mapping[str, Any], scene: SceneRandomization, task: str) -> None:
    """Refuse an axis the task does not support or a range outside what it allows, naming the option."""
    try:
        axes = parse_axes(str(options.get(RANDOMIZE, "")))
    except RandomizationError as exc:
        raise RandomizationError(f"task {task!r}: {exc}") from None
    supported = scene.axes()
    missing = [a for a in axes if a not in supported]
    if missing and str(options.get(RANDOMIZE, "")).strip() != "all":
        raise RandomizationError(f"task {task!r} does not randomize {missing[0]!r} (it declares no "
                                 f"{_WHAT[missing[0]]}); its axes: {', '.join(supported)}")
    for key, spec in RANGES.items():
        value = float(options.get(key, default_range(key, scene)))
        limit = scene.limit(key)
        if not (spec.minimum <= value <= limit) or not math.isfinite(value):
            raise RandomizationError(f"task {task!r} option {key!r} must be in {spec.minimum:g}..{limit:g} "
                                     f"({spec.help}), got {value!r}")


_WHAT = {"lighting": "lights", "colors": "colour groups", "camera": "recorded camera",
         "physics": "bodies with variable physics", "init": "initial-state range"}


def enabled_axes(options: Mapping[str, Any], scene: SceneRandomization) -> tuple[str, ...]:
    """The axes a job asked for that this task supports (``all`` means every one it supports)."""
    return tuple(a for a in parse_axes(str(options.get(RANDOMIZE, ""))) if a in scene.axes())


# ------------------------------------------------------------------------------------------- the model
def _name(model: Any, kind: Any, index: int, fallback: str) -> str:
    import mujoco

    return mujoco.mj_id2name(model, kind, index) or f"{fallback}{index}"


def _root_bodies(model: Any, patterns: BodyPatterns) -> set[int]:
    """Root body ids (children of the world) matched by ``patterns`` (``!`` removes), plus 0 for ``world``."""
    import mujoco

    chosen: set[int] = set()
    roots = {b: _name(model, mujoco.mjtObj.mjOBJ_BODY, b, "body") for b in range(1, model.nbody)
             if int(model.body_parentid[b]) == 0}
    for pattern in patterns:
        remove = pattern.startswith("!")
        pattern = pattern.removeprefix("!")
        matched = {b for b, name in roots.items() if fnmatch.fnmatchcase(name, pattern)}
        if fnmatch.fnmatchcase(WORLD, pattern):
            matched.add(0)
        chosen = chosen - matched if remove else chosen | matched
    return chosen


def _bodies_under(model: Any, roots: set[int]) -> list[int]:
    """Every body whose root is in ``roots`` (the world's own id 0 stands for itself only)."""
    return sorted(b for b in range(model.nbody) if (b == 0 and 0 in roots)
                  or (b > 0 and int(model.body_rootid[b]) in roots))


def _quat(rotvec_deg: np.ndarray) -> np.ndarray:
    """The unit quaternion (w, x, y, z) of a rotation vector in degrees."""
    angle = float(np.linalg.norm(rotvec_deg))
    if angle == 0.0:
        return np.array([1.0, 0.0, 0.0, 0.0])
    axis = rotvec_deg / angle
    half = math.radians(angle) / 2
    return np.concatenate([[math.cos(half)], math.sin(half) * axis])


def _rotate(vector: np.ndarray, rotvec_deg: np.ndarray) -> np.ndarray:
    import mujoco

    out = np.zeros(3)
    mujoco.mju_rotVecQuat(out, np.asarray(vector, dtype=np.float64), _quat(rotvec_deg))
    return out


class _Nominal:
    """The model's values before any draw, for every field a draw may change."""

    FIELDS = ("light_pos", "light_dir", "light_diffuse", "light_specular", "geom_rgba", "mat_rgba", "cam_pos",
              "cam_quat", "cam_mode", "geom_friction", "body_mass", "body_inertia", "dof_damping")

    def __init__(self, model: Any) -> None:
        import mujoco

        self.model = model
        self.arrays = {f: np.array(getattr(model, f), copy=True) for f in self.FIELDS}
        self.ambient = np.array(model.vis.headlight.ambient, copy=True)
        # Where each camera looks at the model's initial pose: a camera that aims at a body (targetbody mode) is
        # jittered from this orientation, frozen (aimed straight down, its roll is undefined: a 2 cm move can
        # turn the picture by tens of degrees).
        data = mujoco.MjData(model)
        mujoco.mj_kinematics(model, data)
        mujoco.mj_camlight(model, data)
        self.cam_world_quat = np.zeros((model.ncam, 4))
        for cam in range(model.ncam):
            mujoco.mju_mat2Quat(self.cam_world_quat[cam], data.cam_xmat[cam])

    def restore(self) -> None:
        for f, values in self.arrays.items():
            getattr(self.model, f)[...] = values
        self.model.vis.headlight.ambient[...] = self.ambient


class RandomizedScene(gym.Wrapper):
    """A task env that redraws its scene before each attempt (``demo_randomize``, called by the executor)."""

    def __init__(self, env: gym.Env, scene: SceneRandomization, options: Mapping[str, Any]) -> None:
        super().__init__(env)
        self.scene = scene
        self.axes = enabled_axes(options, scene)
        self.ranges = {key: float(options.get(key, default_range(key, scene))) for key in RANGES}
        self._nominal: _Nominal | None = None  # of the current model (a suite builds one model per member)
        self._free_camera: tuple[Any, tuple[np.ndarray, float, float, float]] | None = None

    def demo_randomize(self, seed: int, variant: int = 0) -> dict[str, Any]:
        """Put the scene back to nominal, then draw every enabled axis; returns what was drawn (JSON-safe)."""
        if self.scene.before_draw is not None:
            self.scene.before_draw(self.env, int(seed))
        model = self.scene.model(self.env)
        nominal = self._nominal
        if nominal is None or nominal.model is not model:
            nominal = self._nominal = _Nominal(model)
        nominal.restore()
        drawn: dict[str, Any] = {"axes": list(self.axes)}
        if variant:
            drawn["variant"] = int(variant)
        for index, axis in enumerate(AXES):
            if axis not in self.axes:
                if axis == "camera" and self.scene.free_camera is not None:
                    self._place_free_camera(np.zeros(3), np.zeros(2))
                continue
            appearance = axis in APPEARANCE_AXES
            stream = [int(seed) & 0xFFFFFFFFFFFFFFFF, _SALT, index] + ([int(variant)] if appearance and variant
                                                                        else [])
            rng = np.random.default_rng(stream)
            drawn[axis] = getattr(self, f"_draw_{axis}")(model, nominal, rng)
        return drawn

    # -- axes
    def _draw_lighting(self, model: Any, nominal: _Nominal, rng: np.random.Generator) -> dict[str, Any]:
        import mujoco

        pos, turn, bright = (self.ranges[f"randomize.lighting.{k}"] for k in ("pos", "dir", "brightness"))
        lights: dict[str, Any] = {}
        for i in range(model.nlight):
            offset = rng.uniform(-pos, pos, 3)
            rotvec = rng.uniform(-turn, turn, 3)
            scale = float(rng.uniform(1 - bright, 1 + bright))
            model.light_pos[i] = nominal.arrays["light_pos"][i] + offset
            direction = _rotate(nominal.arrays["light_dir"][i], rotvec)
            model.light_dir[i] = direction / max(float(np.linalg.norm(direction)), 1e-12)
            model.light_diffuse[i] = np.clip(nominal.arrays["light_diffuse"][i] * scale, 0.0, 1.0)
            model.light_specular[i] = np.clip(nominal.arrays["light_specular"][i] * scale, 0.0, 1.0)
            lights[_name(model, mujoco.mjtObj.mjOBJ_LIGHT, i, "light")] = {
                "pos_offset": offset.tolist(), "dir_rotation_deg": rotvec.tolist(), "brightness": scale}
        ambient = rng.uniform(-1, 1, 3) * self.ranges["randomize.lighting.ambient"]
        model.vis.headlight.ambient[...] = np.clip(nominal.ambient + ambient, 0.0, 1.0)
        return {"lights": lights, "ambient_offset": ambient.tolist()}

    def _draw_colors(self, model: Any, nominal: _Nominal, rng: np.random.Generator) -> dict[str, Any]:
        span = self.ranges["randomize.colors.rgb"]
        groups: dict[str, Any] = {}
        for group, patterns in self.scene.color_groups.items():
            offset = rng.uniform(-span, span, 3)
            groups[group] = offset.tolist()
            bodies = set(_bodies_under(model, _root_bodies(model, patterns)))
            materials: set[int] = set()
            for g in range(model.ngeom):
                if int(model.geom_bodyid[g]) not in bodies:
                    continue
                mat = int(model.geom_matid[g])
                if mat >= 0:  # a geom with a material is drawn in the material's colour (and texture, tinted)
                    materials.add(mat)
                else:
                    model.geom_rgba[g, :3] = np.clip(nominal.arrays["geom_rgba"][g, :3] + offset, 0.0, 1.0)
            for mat in materials:
                model.mat_rgba[mat, :3] = np.clip(nominal.arrays["mat_rgba"][mat, :3] + offset, 0.0, 1.0)
        return groups

    def _cameras(self) -> Sequence[str]:
        cameras = self.scene.cameras
        return cameras(self.env) if callable(cameras) else cameras

    def _draw_camera(self, model: Any, nominal: _Nominal, rng: np.random.Generator) -> dict[str, Any]:
        import mujoco

        pos, turn = self.ranges["randomize.camera.pos"], self.ranges["randomize.camera.rot"]
        cameras: dict[str, Any] = {}
        for name in self._cameras():
            cam = int(mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_CAMERA, name))
            if cam < 0:
                raise RandomizationError(f"the scene has no camera {name!r} to randomize")
            offset = rng.uniform(-pos, pos, 3)
            rotvec = rng.uniform(-turn, turn, 3)
            base = nominal.arrays["cam_quat"][cam]
            if int(model.cam_mode[cam]) in _TARGET_MODES and int(model.cam_bodyid[cam]) == 0 and (pos or turn):
                model.cam_mode[cam] = mujoco.mjtCamLight.mjCAMLIGHT_FIXED  # keep its aim, then jitter that
                base = nominal.cam_world_quat[cam]
                model.cam_quat[cam] = base
            model.cam_pos[cam] = nominal.arrays["cam_pos"][cam] + offset
            if turn > 0:
                quat = np.zeros(4)
                mujoco.mju_mulQuat(quat, base, _quat(rotvec))
                model.cam_quat[cam] = quat
            cameras[name] = {"pos_offset": offset.tolist(), "rotation_deg": rotvec.tolist()}
        if self.scene.free_camera is not None:
            offset = rng.uniform(-pos, pos, 3)
            angles = rng.uniform(-turn, turn, 2)
            self._place_free_camera(offset, angles)
            cameras["free"] = {"lookat_offset": offset.tolist(), "azimuth_elevation_deg": angles.tolist()}
        return cameras

    def _place_free_camera(self, offset: np.ndarray, angles: np.ndarray) -> None:
        assert self.scene.free_camera is not None
        cam = self.scene.free_camera(self.env)
        if self._free_camera is None or self._free_camera[0] is not cam:
            self._free_camera = (cam, (np.array(cam.lookat, copy=True), float(cam.azimuth), float(cam.elevation),
                                       float(cam.distance)))
        lookat, azimuth, elevation, distance = self._free_camera[1]
        cam.lookat[...] = lookat + offset
        cam.azimuth = azimuth + float(angles[0])
        cam.elevation = elevation + float(angles[1])
        cam.distance = distance

    def _draw_physics(self, model: Any, nominal: _Nominal, rng: np.random.Generator) -> dict[str, Any]:
        friction, mass, damping = (self.ranges[f"randomize.physics.{k}"] for k in ("friction", "mass", "damping"))
        scales = {"friction": float(rng.uniform(1 - friction, 1 + friction)),
                  "mass": float(rng.uniform(1 - mass, 1 + mass)),
                  "damping": float(rng.uniform(1 - damping, 1 + damping))}
        bodies = [b for b in _bodies_under(model, _root_bodies(model, self.scene.bodies)) if b > 0]
        for b in bodies:
            model.body_mass[b] = nominal.arrays["body_mass"][b] * scales["mass"]
            model.body_inertia[b] = nominal.arrays["body_inertia"][b] * scales["mass"]
        chosen = set(bodies)
        for g in range(model.ngeom):
            if int(model.geom_bodyid[g]) in chosen:
                model.geom_friction[g, 0] = nominal.arrays["geom_friction"][g, 0] * scales["friction"]
        for d in range(model.nv):
            if int(model.dof_bodyid[d]) in chosen:
                model.dof_damping[d] = nominal.arrays["dof_damping"][d] * scales["damping"]
        return {**scales, "bodies": len(bodies)}

    def _draw_init(self, model: Any, nominal: _Nominal, rng: np.random.Generator) -> dict[str, Any]:
        assert self.scene.init is not None
        scale = self.ranges["randomize.init.scale"]
        return {"scale": scale, **self.scene.init(self.env, scale)}


def unwrapped_model(env: gym.Env) -> Any:
    """The ``mujoco.MjModel`` of a gymnasium MuJoCo env (``env.unwrapped.model``)."""
    return env.unwrapped.model  # type: ignore[attr-defined]
