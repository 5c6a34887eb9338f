"""Replay: re-simulate recorded episodes from their seeds and actions and compare every recorded frame.

For one episode: build the task's env with the job's options, reset it with the recorded seed and step the
recorded actions. The task's plan is advanced alongside by the executor's own ``SegmentCursor.advance``
(stages/segment_cursor.py: segments planned at the same steps, their action generators consumed in lockstep,
validators run at segment ends),
because planning may change the env (fetch-pick-place draws each cycle's goal from the env's seeded
generator when the cycle is planned); the actions stepped are always the recorded ones (a controlled job's
executed actions, stages/control.py; its labels are what the expert is checked against). Compared, within
tolerances: every state feature recorded before each action, each reward, the terminated/truncated flags,
the final success check, and with ``images`` every camera frame against the stored video: RGB by PSNR (the
codec is lossy), depth exactly (the re-rendered metres quantized as stored must give the stored 12-bit codes,
which the lossless codec keeps bit for bit).

Where the first divergence is reported: a frame whose recorded observation disagrees while the simulation
agrees with the frames on both sides of it is a bad *observation* (the stored data, not the simulation); a
disagreement that persists is charged to the *step* before it (stepping that frame's action went
elsewhere), as is a reward or flag that differs.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from demoforge.stages.actions import check_action
from demoforge.stages.contract import RecordedObservation, Segment, StepView
from demoforge.stages.task_protocol import (
    GivesInstruction,
    draw_randomization,
    recorder_of,
    success_check,
    task_capability,
)
from demoforge.stages.control import EXECUTED_ACTION, INTERVENTION
from demoforge.stages.segment_cursor import END, SegmentCursor
from demoforge.storage.episode_source import EpisodeRef, EpisodeSource, RecordedEpisode
from demoforge.storage.provenance import library_versions, version_differences
from demoforge.storage.schema import ANNOTATION_KEYS, DepthVideoIdentity

REPRODUCED, DIVERGED, ERROR = "reproduced", "diverged", "error"
COL = {key: i for i, key in enumerate(ANNOTATION_KEYS)}
CONTROL_FEATURES = (EXECUTED_ACTION, INTERVENTION)


@dataclass(frozen=True)
class Tolerance:
    """Recorded and replayed values agree when ``|replayed - recorded| <= atol + rtol * |recorded|``."""

    atol: float
    rtol: float


# Defaults per built-in task (docs/reliability.md says why). Both record float32 values of magnitude <= ~3.2
# (metres, radians, scaled velocities): float32 spacing there is <= 2.4e-7, so 1e-5 sits ~40 spacings above
# storage rounding, while 1e-5 m (0.01 mm) or 1e-5 rad is far below any physically meaningful difference.
TASK_TOLERANCES: Mapping[str, Tolerance] = {
    "fetch-pick-place": Tolerance(atol=1e-5, rtol=1e-6),
    "aloha-transfer-cube": Tolerance(atol=1e-5, rtol=1e-6),
    "aloha-insertion": Tolerance(atol=1e-5, rtol=1e-6),
}
DEFAULT_TOLERANCE = Tolerance(atol=1e-6, rtol=1e-6)  # any other (plugin) task

# Lowest PSNR a stored frame may have against the re-rendered one, per codec at demoforge's default quality
# (crf 30, yuv420p). Measured with tools/replay_psnr.py (docs/reliability.md): the right frame was never below
# 28.1 dB (SVT-AV1) / 25.2 dB (h264) at 64x64 (higher at 224x224), a frame of another episode never above
# 21 dB. hevc was not measured and gets h264's threshold. Only gross mismatches are caught: a still scene
# makes neighbouring frames alike, and the state comparison is the fine check.
PSNR_THRESHOLDS_DB: Mapping[str, float] = {"libsvtav1": 25.0, "libaom-av1": 25.0, "h264": 23.0, "hevc": 23.0}


def default_tolerance(task: str) -> Tolerance:
    return TASK_TOLERANCES.get(task, DEFAULT_TOLERANCE)


def psnr_threshold(codec: str) -> float:
    return PSNR_THRESHOLDS_DB.get(codec, 23.0)


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = float(np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2))
    return math.inf if mse == 0 else 10 * math.log10(255.0**2 / mse)


# --------------------------------------------------------------------------------------------- reports
@dataclass(frozen=True)
class Divergence:
    """Where an episode first stopped reproducing.

    ``kind``: ``reset`` (the first observation after reset differs), ``observation`` (one recorded
    observation differs from a simulation that agrees before and after it), ``step`` (stepping this frame's
    action went elsewhere: the next observation, the reward or the flags differ), ``image`` (a stored camera
    frame is below the PSNR threshold), ``depth`` (a stored depth frame's codes differ from the re-rendered
    depth's: any difference, the codec is lossless), ``success`` (the final success check differs),
    ``error`` (the env raised while stepping this frame).
    """

    frame: int
    segment: str | None
    segment_id: int | None
    segment_step: int | None
    kind: str
    feature: str
    index: list[int] | None
    error: float | None  # largest |replayed - recorded| of the feature at that frame (PSNR in dB for images,
    # metres for depth)
    recorded: float | None
    replayed: float | None
    detail: str
    pixels: int | None = None  # depth: how many pixels of that frame differ from the stored codes


@dataclass(frozen=True)
class EpisodeVerdict:
    number: int
    label: str
    seed: int
    attempt: int
    frames: int
    verdict: str  # reproduced, diverged, error
    divergence: Divergence | None = None
    mismatched_frames: int = 0  # frames with any check outside tolerance
    max_errors: Mapping[str, float] = field(default_factory=dict)  # per feature, over the episode
    min_psnr_db: Mapping[str, float] = field(default_factory=dict)  # per RGB camera (with images)
    depth_differing_frames: Mapping[str, int] = field(default_factory=dict)  # per depth camera (0: exact)
    expert: str | None = None  # whether the task's expert, replayed, computes the recorded actions
    versions: Mapping[str, str] | None = None  # as recorded with the episode
    version_differences: tuple[str, ...] = ()
    error: str | None = None
    seconds: float = 0.0
    # How the recorded attempt ended, which a reproduced replay ended the same way at the same frame: "success",
    # or e.g. "truncated at frame 39, in segment 'push'" for a failure (a kept failure, a policy's rollout)
    outcome: str | None = None

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["version_differences"] = list(self.version_differences)
        out["max_errors"] = {k: _json_float(v) for k, v in self.max_errors.items()}
        out["min_psnr_db"] = {k: _json_float(v) for k, v in self.min_psnr_db.items()}
        out["depth"] = {k: depth_summary(n, self.frames) for k, n in self.depth_differing_frames.items()}
        return out


def depth_summary(differing_frames: int, frames: int) -> str:
    """A depth camera's result over an episode: ``exact`` or how many frames differ."""
    return "exact" if differing_frames == 0 else f"{differing_frames} of {frames} frames differ"


def _json_float(value: float) -> float | str:
    return value if math.isfinite(value) else ("inf" if value > 0 else "-inf" if value < 0 else "nan")


# --------------------------------------------------------------------------------------------- checks
@dataclass
class _Miss:
    """One check outside tolerance at one frame."""

    kind: str
    feature: str
    index: list[int] | None
    error: float | None
    recorded: float | None
    replayed: float | None
    detail: str
    pixels: int | None = None


def _compare(name: str, recorded: Any, replayed: Any, tol: Tolerance,
             max_errors: dict[str, float]) -> _Miss | None:
    """Compare one feature as stored (float32); keep the episode's largest error per feature."""
    a = np.asarray(replayed, dtype=np.float32)
    b = np.asarray(recorded, dtype=np.float32)
    if a.shape != b.shape:
        return _Miss("observation", name, None, None, None, None,
                     f"{name} has shape {a.shape} in the replay, {b.shape} recorded")
    diff = np.abs(a.astype(np.float64) - b.astype(np.float64))
    worst = float(diff.max()) if diff.size else 0.0
    max_errors[name] = max(max_errors.get(name, 0.0), worst)
    bad = diff > tol.atol + tol.rtol * np.abs(b.astype(np.float64))
    if not bad.any():
        return None
    flat = int(np.argmax(np.where(bad, diff, -1.0)))
    index = [int(i) for i in np.unravel_index(flat, diff.shape)] if diff.ndim else None
    at = tuple(index) if index is not None else ()
    return _Miss("observation", name, index, float(diff[at]), float(b[at]), float(a[at]),
                 f"{name}{index if index is not None else ''}: replayed {float(a[at]):.7g}, recorded "
                 f"{float(b[at]):.7g} (|diff| {float(diff[at]):.3g} > atol {tol.atol:g} + rtol {tol.rtol:g}"
                 f"*|recorded|)")


def difference(name: str, recorded: Any, replayed: Any, tol: Tolerance) -> str | None:
    """Why ``replayed`` is not ``recorded`` within ``tol`` (as float32, as stored), or None when it is."""
    miss = _compare(name, recorded, replayed, tol, {})
    return miss.detail if miss is not None else None


class _Plan:
    """The task's plan, walked as the executor walks it (the same :meth:`SegmentCursor.advance`), its segments
    ended where the recording ended them; any failure of the task's code only stops it being followed."""

    def __init__(self, env: Any, task: str) -> None:
        self.cursor = SegmentCursor(env, task, self._guard)
        self.planned: np.ndarray | None = None
        self.broken: str | None = None
        self.first_difference: str | None = None  # where the expert first disagrees with the recording

    @property
    def segment(self) -> Segment | None:
        return self.cursor.segment

    def _guard(self, what: str, fn: Callable[..., Any], *args: Any) -> Any:
        if self.broken:
            return None
        try:
            return fn(*args)
        except Exception as exc:  # the task's own code: a diverged state may make it fail
            self.broken = f"{what} raised {type(exc).__name__}: {exc}"
            return None

    def _planned(self) -> None:
        raw = self.cursor.action
        self.planned = None if raw is END or raw is None else np.asarray(raw, dtype=np.float32)

    def begin(self) -> None:
        self.cursor.begin()
        self._planned()

    def advance(self, view: StepView, frame: int, ends: bool) -> None:
        """After the step that recorded ``frame - 1``: the expert's next action, or (``ends``: the recorded
        segment ended there) the end of its segment, which should have run out of actions too, and its next."""

        def ended(_accepted: bool) -> None:
            self._planned()
            self.note_segment(frame, True, None)

        self.cursor.advance(view, ends=ends, on_end=ended, stop_if_rejected=False)
        self._planned()

    def note_action(self, frame: int, recorded: np.ndarray) -> None:
        if self.planned is None:
            self.note(f"the expert had no action for frame {frame} (its segment ended earlier)")
        elif self.planned.shape != recorded.shape:
            self.note(f"the expert's action for frame {frame} has shape {self.planned.shape}")
        else:
            diff = float(np.max(np.abs(self.planned.astype(np.float64) - recorded.astype(np.float64)), initial=0.0))
            if diff > 0:
                self.note(f"the expert computes another action at frame {frame} (max |diff| {diff:.3g})")

    def note_segment(self, frame: int, ended: bool, name: str | None) -> None:
        """At a recorded segment boundary before ``frame``: the expert's segment should end there too, and the
        one it plans next should have the recorded name."""
        if ended and self.planned is not None:
            self.note(f"the expert's segment goes on past frame {frame - 1}, where the recorded one ends")
        elif name is not None and getattr(self.segment, "name", None) != name:
            self.note(f"the expert plans segment {getattr(self.segment, 'name', None)!r} at frame {frame}, "
                      f"recorded {name!r}")

    def note(self, message: str) -> None:
        if self.first_difference is None and not self.broken:
            self.first_difference = message


class EpisodeReplay:
    """Replays one recorded episode on an env; :meth:`run` returns its verdict."""

    def __init__(self, env: Any, episode: RecordedEpisode, *, tolerance: Tolerance,
                 camera_frames: Callable[[str], list[np.ndarray]] | None = None,
                 min_psnr_db: float = 30.0, depth_codes: Callable[[str], list[np.ndarray]] | None = None,
                 depth_video: DepthVideoIdentity | None = None, depth_cameras: tuple[str, ...] = ()) -> None:
        self.env = env
        self.ep = episode
        self.tol = tolerance
        self.camera_frames = camera_frames
        self.min_psnr_db = min_psnr_db
        self.depth_codes = depth_codes  # a depth camera's stored 12-bit codes, per frame
        self.depth_video = depth_video
        self.depth_cameras = frozenset(depth_cameras)
        if self.depth_cameras and camera_frames is not None and (depth_codes is None or depth_video is None):
            raise ValueError("depth cameras are compared with their stored codes and quantizer settings")
        self.n = len(episode.action)
        self.obs_miss: dict[int, _Miss] = {}  # frame -> first miss of the observation recorded with it
        self.step_miss: dict[int, _Miss] = {}  # frame -> first miss of stepping its action
        self.image_miss: dict[int, _Miss] = {}
        self.max_errors: dict[str, float] = {}
        self.min_psnr: dict[str, float] = {}
        self.depth_differing: dict[str, int] = {}  # depth camera -> frames whose codes differ
        self.videos: dict[str, list[np.ndarray]] = {}

    # -- per-frame checks
    def _observe(self, frame: int, recorder: Callable[[Any], RecordedObservation], observation: Any) -> None:
        rec = recorder(observation)
        # What a controlled job recorded beside the observation (the executed action, the takeover flag) is
        # no observation: it is what replay steps, not what it compares.
        stored = {k: v for k, v in self.ep.state.items() if k not in CONTROL_FEATURES}
        replayed_state = {k: np.asarray(v) for k, v in rec.state.items()}
        if set(replayed_state) != set(stored):
            self.obs_miss.setdefault(frame, _Miss("observation", "state", None, None, None, None,
                                                  f"the replay records state features {sorted(replayed_state)}, "
                                                  f"the episode {sorted(stored)}"))
            return
        for name in sorted(stored):
            miss = _compare(name, stored[name][frame], replayed_state[name], self.tol, self.max_errors)
            if miss is not None:
                self.obs_miss.setdefault(frame, miss)
        if self.camera_frames is not None:
            self._check_images(frame, rec.images)

    def _check_images(self, frame: int, images: Mapping[str, np.ndarray]) -> None:
        for camera, image in sorted(images.items()):
            if camera in self.depth_cameras:
                self._check_depth(frame, camera, image)
                continue
            assert self.camera_frames is not None
            stored = self._stored(frame, camera, self.camera_frames, "image", camera, f"camera {camera!r}")
            if stored is None:
                continue
            image = np.asarray(image, dtype=np.uint8)
            value = psnr(image, stored) if image.shape == stored.shape else -math.inf
            self.min_psnr[camera] = min(self.min_psnr.get(camera, math.inf), value)
            if value < self.min_psnr_db:
                self.image_miss.setdefault(frame, _Miss(
                    "image", camera, None, value, None, None,
                    f"camera {camera!r}: PSNR {value:.1f} dB against the stored frame, below {self.min_psnr_db:g} dB"))

    def _stored(self, frame: int, camera: str, load: Callable[[str], list[np.ndarray]], kind: str, feature: str,
                label: str) -> np.ndarray | None:
        """Stored frame ``frame`` of ``camera`` (its video read once, by ``load``); None, with the miss recorded,
        when the stored video ends before it."""
        if camera not in self.videos:
            self.videos[camera] = load(camera)
        video = self.videos[camera]
        if frame < len(video):
            return np.asarray(video[frame])
        self.image_miss.setdefault(frame, _Miss(kind, feature, None, None, None, None,
                                                f"{label}: the stored video ends at frame {len(video)}"))
        return None

    def _check_depth(self, frame: int, camera: str, image: np.ndarray) -> None:
        """The re-rendered metres, quantized with the stored identity, must be the stored codes exactly."""
        from demoforge.storage.depth import dequantize, quantize_codes

        assert self.depth_codes is not None and self.depth_video is not None
        feature = f"camera {camera} (depth)"
        self.depth_differing.setdefault(camera, 0)
        stored = self._stored(frame, camera, self.depth_codes, "depth", feature, feature)
        if stored is None:
            self.depth_differing[camera] += 1
            return
        replayed = quantize_codes(np.asarray(image, dtype=np.float32), self.depth_video)
        if replayed.shape != stored.shape:
            self.depth_differing[camera] += 1
            self.image_miss.setdefault(frame, _Miss("depth", feature, None, None, None, None,
                                                    f"{feature}: the replay renders {replayed.shape}, the stored "
                                                    f"codes are {stored.shape}"))
            return
        differ = replayed != stored
        pixels = int(np.count_nonzero(differ))
        if pixels == 0:
            return
        self.depth_differing[camera] += 1
        metres_replayed = dequantize(replayed, self.depth_video).astype(np.float64)
        metres_stored = dequantize(stored, self.depth_video).astype(np.float64)
        gap = np.where(differ, np.abs(metres_replayed - metres_stored), -1.0)
        at = tuple(int(i) for i in np.unravel_index(int(np.argmax(gap)), gap.shape))
        self.image_miss.setdefault(frame, _Miss(
            "depth", feature, list(at), float(gap[at]), float(metres_stored[at]), float(metres_replayed[at]),
            f"{feature}: {pixels} of {differ.size} pixels differ from the stored codes (lossless, compared "
            f"exactly); largest difference {float(gap[at]):.4g} m at pixel {list(at)}: replayed "
            f"{float(metres_replayed[at]):.4g} m (code {int(replayed[at])}), stored {float(metres_stored[at]):.4g} m "
            f"(code {int(stored[at])})", pixels=pixels))

    def _check_step(self, frame: int, reward: float, terminated: bool, truncated: bool) -> None:
        miss = _compare("next.reward", np.float32(self.ep.reward[frame]), np.float32(reward), self.tol,
                        self.max_errors)
        if miss is not None:
            miss.kind = "step"
            self.step_miss.setdefault(frame, miss)
        last = frame == self.n - 1
        recorded_truncated = bool(self.ep.annotations[frame, COL["truncated"]])
        if bool(truncated) != recorded_truncated:
            self.step_miss.setdefault(frame, _Miss("step", "truncated", None, None, float(recorded_truncated),
                                                   float(truncated), f"the env returned truncated={bool(truncated)}, "
                                                   f"recorded {recorded_truncated}"))
        # The executor ends an episode with terminated=1 when the env terminates or when the plan ran out
        # with success; so only an env termination before the last frame, or where none was recorded, differs.
        recorded_terminated = bool(self.ep.annotations[frame, COL["terminated"]])
        if terminated and (not last or not recorded_terminated):
            self.step_miss.setdefault(frame, _Miss("step", "terminated", None, None, float(recorded_terminated),
                                                   1.0, f"the env terminated after frame {frame} of {self.n}"))

    # -- the run
    def run(self) -> tuple[Divergence | None, int, str | None]:
        env, task = self.env, self.ep.ref.task
        recorder, success = recorder_of(env), success_check(env)
        plan = _Plan(env, task)
        drawn_miss = self._redraw(env)
        if drawn_miss is not None:
            return self._locate(0, drawn_miss), 0, None
        observation, _info = env.reset(seed=self.ep.ref.seed)
        instructor = task_capability(env, GivesInstruction)
        if instructor is not None:
            instructor.demo_instruction()
        self._observe(0, recorder, observation)
        plan.begin()
        plan.note_segment(0, False, self._segment_name(0))
        ended_early: tuple[int, str] | None = None
        success_miss: _Miss | None = None
        segment_col, end_col = COL["segment_id"], COL["segment_end"]
        for t in range(self.n):
            executed = self.ep.state.get(EXECUTED_ACTION)
            action = check_action(self.ep.action[t] if executed is None else executed[t], env.action_space)
            plan.note_action(t, np.asarray(self.ep.action[t], dtype=np.float32))
            try:
                observation, reward, terminated, truncated, info = env.step(action)
            except Exception as exc:
                ended_early = (t, f"the env raised {type(exc).__name__} stepping frame {t}'s action: {exc}")
                break
            self._check_step(t, float(reward), bool(terminated), bool(truncated))
            last = t == self.n - 1
            if (terminated or truncated) and not last:
                ended_early = (t, f"the env ended the episode after frame {t} of {self.n}")
                break
            view = StepView(observation, float(reward), bool(terminated), bool(truncated), info)
            if last:
                if not terminated:  # as the executor: the plan runs out, the last validator runs, then success
                    plan.advance(view, self.n, ends=True)
                    if plan.segment is not None:
                        plan.note(f"the expert plans another segment ({plan.segment.name!r}) after the last frame")
                success_miss = self._check_success(success, view)
                break
            # As the executor: advance the plan (its segment ending where the recorded one ended), then record
            # the observation of the next frame.
            ends = bool(self.ep.annotations[t, end_col]) and \
                self.ep.annotations[t + 1, segment_col] != self.ep.annotations[t, segment_col]
            plan.advance(view, t + 1, ends=ends)
            if ends:
                plan.note_segment(t + 1, False, self._segment_name(t + 1))
            self._observe(t + 1, recorder, observation)
        return self._first_divergence(ended_early, success_miss), self._mismatched(), self._expert_note(plan)

    def _redraw(self, env: Any) -> _Miss | None:
        """Draw the episode's randomized scene again from its seed (before the reset, as generation did) and
        check it is the one the episode recorded."""
        recorded = self.ep.record.get("randomization")
        variant = int((recorded or {}).get("variant", 0))  # a rerender's appearance variant
        drawn = draw_randomization(env, self.ep.ref.seed, variant)
        if drawn == recorded:
            return None
        detail = ("the task draws no randomization, the episode recorded one" if drawn is None else
                  "the episode recorded no randomization, the task draws one" if recorded is None else
                  "the scene drawn from the episode's seed differs from the recorded one in "
                  + ", ".join(k for k in sorted(set(drawn) | set(recorded)) if drawn.get(k) != recorded.get(k)))
        return _Miss("randomization", "randomization", None, None, None, None, detail)

    def _check_success(self, success: Callable[[Any, Mapping[str, Any]], bool | None],
                       view: StepView) -> _Miss | None:
        recorded = bool(self.ep.record.get("success", True))
        try:
            verdict = success(view.observation, view.info)
            replayed = True if verdict is None else verdict
        except Exception as exc:  # the task's check failing on a diverged state
            return _Miss("success", "success", None, None, float(recorded), None,
                         f"the success check raised {type(exc).__name__}: {exc}")
        if replayed != recorded:
            return _Miss("success", "success", None, None, float(recorded), float(replayed),
                         f"the success check says {replayed} after the last action, recorded {recorded}")
        return None

    # -- the verdict
    def _mismatched(self) -> int:
        return len(set(self.obs_miss) | set(self.step_miss) | set(self.image_miss))

    def _first_divergence(self, ended_early: tuple[int, str] | None, success_miss: _Miss | None) -> Divergence | None:
        candidates: list[tuple[int, int, _Miss]] = []  # (frame, priority, miss)
        if self.obs_miss:
            j = min(self.obs_miss)
            miss = self.obs_miss[j]
            isolated = j + 1 not in self.obs_miss and (j + 1 < self.n or j not in self.step_miss)
            if j + 1 < self.n and ended_early is not None and ended_early[0] <= j:
                isolated = False
            if isolated:
                candidates.append((j, 1, miss))
            elif j == 0:
                candidates.append((0, 1, _Miss("reset", miss.feature, miss.index, miss.error, miss.recorded,
                                               miss.replayed, f"reset(seed={self.ep.ref.seed}) gave another first "
                                               f"observation: {miss.detail}")))
            else:
                candidates.append((j - 1, 0, _Miss("step", miss.feature, miss.index, miss.error, miss.recorded,
                                                   miss.replayed, f"stepping frame {j - 1}'s action did not give "
                                                   f"frame {j}'s observation: {miss.detail}")))
        if self.step_miss:
            s = min(self.step_miss)
            candidates.append((s, 0, self.step_miss[s]))
        if self.image_miss:
            i = min(self.image_miss)
            candidates.append((i, 2, self.image_miss[i]))
        if ended_early is not None:
            candidates.append((ended_early[0], 3, _Miss("error", "env", None, None, None, None, ended_early[1])))
        if success_miss is not None:
            candidates.append((self.n - 1, 4, success_miss))
        if not candidates:
            return None
        frame, _, miss = min(candidates, key=lambda c: (c[0], c[1]))
        return self._locate(frame, miss)

    def _locate(self, frame: int, miss: _Miss) -> Divergence:
        ann = self.ep.annotations
        segment_id = int(ann[frame, COL["segment_id"]]) if len(ann) > frame else None
        segment_step = int(ann[frame, COL["segment_step"]]) if len(ann) > frame else None
        names = {int(s["segment_id"]): str(s["name"]) for s in self.ep.record.get("segments", [])}
        return Divergence(frame=frame, segment=names.get(segment_id) if segment_id is not None else None,
                          segment_id=segment_id, segment_step=segment_step, kind=miss.kind, feature=miss.feature,
                          index=miss.index, error=miss.error, recorded=miss.recorded, replayed=miss.replayed,
                          detail=miss.detail, pixels=miss.pixels)

    def _segment_name(self, frame: int) -> str | None:
        names = {int(s["segment_id"]): str(s["name"]) for s in self.ep.record.get("segments", [])}
        return names.get(int(self.ep.annotations[frame, COL["segment_id"]]))

    def _expert_note(self, plan: _Plan) -> str:
        if plan.broken:
            return f"the task's plan stopped: {plan.broken}"
        if plan.first_difference is None:
            return "the task's expert, replayed, plans the recorded segments and computes the recorded action at " \
                   "every frame"
        return plan.first_difference


# ------------------------------------------------------------------------------------------ one episode
class EnvCache:
    """One env per (task, options) per process, reset with each episode's seed (as generation reuses its
    worker's env across episodes)."""

    def __init__(self) -> None:
        self._envs: dict[tuple[str, str], Any] = {}

    def get(self, task: str, options: Mapping[str, Any]) -> Any:
        import json

        from demoforge.pipeline.tasks.registry import get_task

        key = (task, json.dumps(dict(options), sort_keys=True))
        if key not in self._envs:
            self._envs[key] = get_task(task).build(options)
        return self._envs[key]

    def close(self) -> None:
        for env in self._envs.values():
            try:
                env.close()
            except Exception:  # closing after a failed replay must not hide the verdicts
                pass
        self._envs.clear()


@dataclass(frozen=True)
class ReplaySettings:
    atol: float | None = None  # None: the task's default
    rtol: float | None = None
    images: bool = False
    min_psnr_db: float | None = None  # None: the codec's threshold

    def tolerance(self, task: str) -> Tolerance:
        base = default_tolerance(task)
        return Tolerance(atol=base.atol if self.atol is None else self.atol,
                         rtol=base.rtol if self.rtol is None else self.rtol)

    def psnr_threshold(self, codec: str) -> float:
        return psnr_threshold(codec) if self.min_psnr_db is None else self.min_psnr_db


def _cannot_replay(ref: EpisodeRef, message: str, started: float, versions: Mapping[str, str] | None = None,
                   differences: tuple[str, ...] = ()) -> EpisodeVerdict:
    return EpisodeVerdict(number=ref.number, label=ref.label, seed=ref.seed, attempt=ref.attempt, frames=ref.frames,
                          verdict=ERROR, versions=versions, version_differences=differences, error=message,
                          seconds=time.perf_counter() - started)


def replay_episode(source: EpisodeSource, ref: EpisodeRef, settings: ReplaySettings, envs: EnvCache) -> EpisodeVerdict:
    """Read, replay and judge one episode; never raises for a problem of the episode or its env."""
    from demoforge.storage.episode_source import EpisodeReadError

    started = time.perf_counter()
    try:
        episode = source.load(ref)
    except EpisodeReadError as exc:
        return _cannot_replay(ref, f"cannot read {ref.label}: {exc}", started)
    versions = episode.versions
    differences = tuple(version_differences(versions, library_versions()))
    if episode.task_options is None:
        return _cannot_replay(ref, f"{ref.label}: the input does not record the task options it was generated with "
                                   "(exported by an older demoforge); replay its store or re-export it",
                              started, versions, differences)
    try:
        env = envs.get(ref.task, episode.task_options)
    except Exception as exc:
        return _cannot_replay(ref, f"{ref.label}: cannot build task {ref.task!r} with options "
                                   f"{dict(episode.task_options)}: {type(exc).__name__}: {exc}",
                              started, versions, differences)
    frames = (lambda camera: source.camera_frames(episode, camera)) if settings.images else None
    codes = (lambda camera: source.depth_codes(episode, camera)) if settings.images else None
    replay = EpisodeReplay(env, episode, tolerance=settings.tolerance(ref.task), camera_frames=frames,
                           min_psnr_db=settings.psnr_threshold(str(source.schema.video.get("codec"))),
                           depth_codes=codes, depth_video=source.schema.depth_video,
                           depth_cameras=source.schema.depth_cameras)
    try:
        divergence, mismatched, expert = replay.run()
    except Exception as exc:  # reset, the recorder, reading the video: the replay could not be carried out
        envs.close()  # a half-stepped env is not reused
        return _cannot_replay(ref, f"{ref.label}: replay failed: {type(exc).__name__}: {exc}", started, versions,
                              differences)
    return EpisodeVerdict(number=ref.number, label=ref.label, seed=ref.seed, attempt=ref.attempt, frames=ref.frames,
                          verdict=DIVERGED if divergence else REPRODUCED, divergence=divergence,
                          mismatched_frames=mismatched, max_errors=dict(replay.max_errors),
                          min_psnr_db=dict(replay.min_psnr), depth_differing_frames=dict(replay.depth_differing),
                          expert=expert, versions=versions, outcome=recorded_outcome(episode.record, ref.frames),
                          version_differences=differences, seconds=time.perf_counter() - started)


def recorded_outcome(record: Mapping[str, Any], frames: int) -> str | None:
    """The recorded end of an attempt in words (None when the input records no outcome)."""
    if "success" not in record:
        return None
    if record["success"]:
        return "success"
    segment = (record.get("failed_segment") or {}).get("name") or next(
        (s.get("name") for s in record.get("segments", []) if not s.get("success", True)), None)
    return f"{record.get('terminal_reason') or 'failure'} at frame {frames - 1}" + \
        (f", in segment {segment!r}" if segment else "")
