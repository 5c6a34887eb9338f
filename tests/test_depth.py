"""Depth cameras end to end, on the real fetch-pick-place simulator: rendered depth in metres -> LeRobot's
quantizer -> lossless gray12le HEVC in staging -> remuxed export -> ``LeRobotDataset`` back in metres.

One module-scoped job (2 episodes, one cycle, 64x64) feeds the round-trip, backend, delta_timestamps,
validate and inspect checks; the rendered depth it is compared with comes from re-running the same seeds
through the executor (the task is deterministic: test_task_fetch checks that).
"""

from __future__ import annotations

import os

os.environ.setdefault("MUJOCO_GL", "egl")

import json  # noqa: E402
import random  # noqa: E402
import subprocess  # noqa: E402
from dataclasses import dataclass  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402
import pytest  # noqa: E402

from demoforge.pipeline.job import JobSpec, VideoSettings  # noqa: E402
from demoforge.pipeline.runner import run_job  # noqa: E402
from demoforge.pipeline.tasks.registry import CameraSpec, TaskEntry, TaskInfo, get_task  # noqa: E402
from demoforge.stages.contract import RecordedObservation  # noqa: E402
from demoforge.stages.camera_encoder import DepthEncoder, EncoderError, make_encoder  # noqa: E402
from demoforge.stages.executor import derive_seed, run_episodes  # noqa: E402
from demoforge.stages.records import AttemptEnded, Frame  # noqa: E402
from demoforge.storage import depth as depth_video  # noqa: E402
from demoforge.storage.catalog import Catalog  # noqa: E402
from demoforge.storage.lerobot.export import export_store  # noqa: E402
from demoforge.storage.lerobot.validate import validate_dataset  # noqa: E402
from demoforge.storage.store import open_store  # noqa: E402
from demoforge.storage.schema import DEPTH, Fingerprint, FingerprintError  # noqa: E402
from demoforge.storage.staging import staged_episode_ids  # noqa: E402
from helpers import attempts_now, cli_env, demoforge_argv, kill_once_started  # noqa: E402
from toy_tasks import DEFAULTS as TOY_DEFAULTS  # noqa: E402
from toy_tasks import CameraPointEnv  # noqa: E402
from toy_tasks import describe as toy_describe  # noqa: E402

TASK = "fetch-pick-place"
OPTIONS = {"cycles": 1, "image_size": 64, "depth": True}
CLI_OPTIONS = ("--option", "cycles=1", "--option", "image_size=64", "--option", "depth=true")
EPISODES = 2
RGB_KEY, DEPTH_KEY = "observation.images.front", "observation.images.front_depth"
FPS = 25


@dataclass
class DepthRun:
    store: Path
    dataset: Path
    rendered: dict[int, list[np.ndarray]]  # episode -> the task's depth images, metres, in frame order
    rgb: dict[int, list[np.ndarray]]
    segments: dict[int, list[dict[str, Any]]]


def render_episodes(options: dict[str, Any], episodes: int) -> tuple[dict[int, list[np.ndarray]],
                                                                     dict[int, list[np.ndarray]]]:
    """The depth and RGB images the executor records for attempt 0 of episodes 0..n-1 (job seed 0)."""
    entry = get_task(TASK)
    env = entry.build(options)
    depth: dict[int, list[np.ndarray]] = {i: [] for i in range(episodes)}
    rgb: dict[int, list[np.ndarray]] = {i: [] for i in range(episodes)}
    try:
        for record in run_episodes(env, task=TASK, episodes=episodes, max_attempts=1,
                                   cameras=entry.info(options).cameras):
            if isinstance(record, Frame):
                if "front_depth" in record.images:
                    depth[record.key.episode_index].append(record.images["front_depth"])
                rgb[record.key.episode_index].append(record.images["front"])
            elif isinstance(record, AttemptEnded):
                assert record.result.committable, record.result.failure_reason
    finally:
        env.close()
    return depth, rgb


@pytest.fixture(scope="module")
def depth_run(tmp_path_factory: pytest.TempPathFactory) -> DepthRun:
    base = tmp_path_factory.mktemp("depth")
    store, dataset = base / "store", base / "dataset"
    report = run_job(JobSpec(task=TASK, episodes=EPISODES, task_options=OPTIONS, video=VideoSettings(codec="h264")),
                     store)
    assert report.committed_total == EPISODES
    export_store(store, dataset)
    rendered, rgb = render_episodes(OPTIONS, EPISODES)
    with open_store(store) as view:
        rows = {r.episode_index: r for r in view.committed()}
    assert [rows[i].seed for i in range(EPISODES)] == [derive_seed(0, i, 0) for i in range(EPISODES)]
    segments = {i: (rows[i].record or {})["segments"] for i in range(EPISODES)}
    return DepthRun(store, dataset, rendered, rgb, segments)


def lerobot_round_trip(depth_m: np.ndarray, identity) -> np.ndarray:
    """What LeRobot's own quantize -> dequantize makes of a depth image (metres), through the same (torch) path
    its dataset reader dequantizes decoded frames with."""
    import torch
    from lerobot.datasets.depth_utils import dequantize_depth, quantize_depth

    codes = quantize_depth(depth_m, depth_min=identity.depth_min, depth_max=identity.depth_max,
                           shift=identity.shift, use_log=identity.use_log, video_backend=None)
    frames = torch.from_numpy(codes)[None, None]  # (N, 1, H, W), as decode_video_frames returns depth codes
    metres = dequantize_depth(frames, depth_min=identity.depth_min, depth_max=identity.depth_max,
                              shift=identity.shift, use_log=identity.use_log, output_unit="m")
    return metres.numpy()[0, 0]


def quantization_step(depth_m: np.ndarray, identity) -> np.ndarray:
    """The width (metres) of the quantization bin around each pixel: one code up and one code down."""
    codes = depth_video.quantize_codes(depth_m, identity).astype(np.int32)
    up = depth_video.dequantize(np.clip(codes + 1, 0, 4095).astype(np.uint16), identity)
    down = depth_video.dequantize(np.clip(codes - 1, 0, 4095).astype(np.uint16), identity)
    return np.maximum(up - depth_video.dequantize(codes.astype(np.uint16), identity),
                      depth_video.dequantize(codes.astype(np.uint16), identity) - down)


# ----------------------------------------------------------------------------------- the round trip
def test_staged_depth_is_lerobots_quantization_of_the_rendered_depth_exactly(depth_run: DepthRun) -> None:
    with open_store(depth_run.store) as view:
        fingerprint, staging = view.require_job()
        identity = fingerprint.depth_video
        assert identity == depth_video.lerobot_depth_identity()
        for row in view.committed():
            assert row.frames is not None and row.video_bytes is not None, f"committed episode {row.episode_id}"
            staged = staging.read_episode(row.episode_id, row.frames, row.video_bytes)
            codes = depth_video.decode_codes(staged.video["front_depth"])
            rendered = depth_run.rendered[row.episode_index]
            assert len(codes) == row.frames == len(rendered)
            for t, depth_m in enumerate(rendered):
                # Lossless: the 12-bit codes in the video are exactly LeRobot's codes of the rendered metres.
                np.testing.assert_array_equal(codes[t], depth_video.quantize_codes(depth_m, identity))


@pytest.mark.parametrize("backend", ["pyav", "torchcodec"])
def test_lerobot_dataset_returns_the_rendered_depth_in_metres(depth_run: DepthRun, backend: str) -> None:
    """Every decoded depth pixel equals LeRobot's quantize -> dequantize of the rendered value and lies within
    one quantization step of the rendered depth (LeRobot decodes depth with PyAV whatever the backend; with
    torchcodec the RGB stream goes through torchcodec)."""
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    dataset = LeRobotDataset(repo_id="local/depth", root=depth_run.dataset, video_backend=backend,
                             depth_output_unit="m")
    assert dataset.meta.depth_keys == [DEPTH_KEY]
    identity = depth_video.lerobot_depth_identity()
    for episode, rendered in depth_run.rendered.items():
        start = int(dataset.meta.episodes[episode]["dataset_from_index"])
        for t, depth_m in enumerate(rendered):
            item = dataset[start + t]
            got = item[DEPTH_KEY].numpy()
            assert got.shape == (1, 64, 64) and got.dtype == np.float32
            np.testing.assert_array_equal(got[0], lerobot_round_trip(depth_m, identity))
            inside = (depth_m >= identity.depth_min) & (depth_m <= identity.depth_max)
            assert inside.mean() > 0.5  # the scene, not only background beyond depth_max
            error = np.abs(got[0] - depth_m)[inside]
            assert (error <= quantization_step(depth_m, identity)[inside] + 1e-6).all()
            # Beyond depth_max (the far plane behind the scene) LeRobot's quantizer clips to depth_max.
            np.testing.assert_array_equal(got[0][depth_m > identity.depth_max], np.float32(identity.depth_max))
            assert item[RGB_KEY].shape == (3, 64, 64)


def test_depth_does_not_change_the_rgb_camera(depth_run: DepthRun) -> None:
    _, rgb_without = render_episodes({**OPTIONS, "depth": False}, 1)
    assert len(rgb_without[0]) == len(depth_run.rgb[0])
    for with_depth, without in zip(depth_run.rgb[0], rgb_without[0]):
        np.testing.assert_array_equal(with_depth, without)


def test_delta_timestamps_across_a_segment_boundary(depth_run: DepthRun) -> None:
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    boundary = depth_run.segments[0][1]["start_step"]  # first frame of segment 1 ("descend_0") of episode 0
    offsets = [-2, -1, 0, 1]
    dataset = LeRobotDataset(repo_id="local/depth", root=depth_run.dataset, video_backend="pyav",
                             depth_output_unit="m",
                             delta_timestamps={DEPTH_KEY: [k / FPS for k in offsets],
                                               "annotation.segment_id": [k / FPS for k in offsets]})
    item = dataset[boundary]
    assert item["annotation.segment_id"].reshape(-1).tolist() == [0, 0, 1, 1]
    assert item[DEPTH_KEY].shape == (4, 1, 64, 64)
    identity = depth_video.lerobot_depth_identity()
    for k, got in zip(offsets, item[DEPTH_KEY].numpy()):
        np.testing.assert_array_equal(got[0], lerobot_round_trip(depth_run.rendered[0][boundary + k], identity))


def test_export_features_are_what_lerobot_writes_for_depth(depth_run: DepthRun) -> None:
    """The depth feature of info.json carries the fields LeRobot 0.6.1's writer records for a
    DepthEncoderConfig, so ``encoder_config_from_video_info`` rebuilds the depth encoder it was written with."""
    from lerobot.configs.video import DepthEncoderConfig, encoder_config_from_video_info

    info = json.loads((depth_run.dataset / "meta/info.json").read_text())
    feature = info["features"][DEPTH_KEY]
    assert feature["dtype"] == "video" and feature["shape"] == [64, 64, 1]
    assert feature["names"] == ["height", "width", "channels"]
    fields = feature["info"]
    assert fields["is_depth_map"] is True and fields["depth_unit"] == "m"
    assert (fields["video.codec"], fields["video.pix_fmt"], fields["video.channels"]) == ("hevc", "gray12le", 1)
    config = encoder_config_from_video_info(fields)
    defaults = DepthEncoderConfig()
    assert isinstance(config, DepthEncoderConfig)
    assert (config.depth_min, config.depth_max, config.shift, config.use_log) == \
        (defaults.depth_min, defaults.depth_max, defaults.shift, defaults.use_log)
    assert config.extra_options["x265-params"].startswith("lossless=1")
    assert info["features"][RGB_KEY]["info"]["is_depth_map"] is False
    stats = json.loads((depth_run.dataset / "meta/stats.json").read_text())[DEPTH_KEY]
    # Depth stats are metres (not divided by 255), one channel.
    assert np.asarray(stats["mean"]).shape == (1, 1, 1) and 0.3 < np.asarray(stats["min"]).item() < 2.0


def test_camera_stats_are_lerobots_of_the_rendered_frames(depth_run: DepthRun, tmp_path: Path) -> None:
    """Both cameras' per-episode stats equal LeRobot's ``compute_episode_stats`` of the rendered frames, written
    as its image writer writes them (depth: raw float32 metres in TIFF, RGB: PNG), not of decoded video."""
    from lerobot.datasets.compute_stats import compute_episode_stats
    from lerobot.datasets.image_writer import write_image

    from test_export_stats import assert_stats_equal, exported_episode_stats

    features = json.loads((depth_run.dataset / "meta/info.json").read_text())["features"]
    exported = exported_episode_stats(depth_run.dataset)
    for episode in range(EPISODES):
        buffer: dict[str, list[str]] = {DEPTH_KEY: [], RGB_KEY: []}
        for i, (depth_m, rgb) in enumerate(zip(depth_run.rendered[episode], depth_run.rgb[episode], strict=True)):
            for key, image, suffix in ((DEPTH_KEY, depth_m, "tiff"), (RGB_KEY, rgb, "png")):
                path = tmp_path / f"{episode}-{key}-{i:04d}.{suffix}"
                write_image(image, path)
                buffer[key].append(str(path))
        theirs = compute_episode_stats(buffer, {k: features[k] for k in buffer})
        assert_stats_equal({k: exported[episode][k] for k in buffer}, theirs)


def test_validate_checks_depth_streams(depth_run: DepthRun, tmp_path: Path) -> None:
    report = validate_dataset(depth_run.dataset, expect_segments=5)
    assert report.status == 0, report.problems
    assert report.checks["depth_streams"] == 1
    # A depth feature whose info disagrees with its file is a mismatch naming the file.
    import shutil

    broken = tmp_path / "broken"
    shutil.copytree(depth_run.dataset, broken)
    info_path = broken / "meta/info.json"
    info = json.loads(info_path.read_text())
    info["features"][DEPTH_KEY]["info"]["video.pix_fmt"] = "gray"
    info_path.write_text(json.dumps(info))
    problems = validate_dataset(broken, sample_frames=1).problems
    assert any("observation.images.front_depth" in p and "gray12le" in p for p in problems), problems


def test_inspect_plot_shows_depth_next_to_rgb(depth_run: DepthRun, tmp_path: Path) -> None:
    from demoforge.storage.inspect import draw, inspect_path

    shown = {}
    for source in (depth_run.store, depth_run.dataset):
        result = inspect_path(source, with_frames=True, max_episodes=1)
        shown[source] = result.frames
        frames = result.frames["0:reach_0"]
        assert len(frames) == 4  # RGB then depth, at the segment's first and last frame
        rgb_first, depth_first = frames[0], frames[1]
        assert rgb_first.shape == depth_first.shape == (64, 64, 3)
        assert not np.array_equal(rgb_first, depth_first)
        assert len(np.unique(depth_first.reshape(-1, 3), axis=0)) > 10  # colour-mapped, not flat
        assert draw(result, tmp_path / f"{source.name}.png").stat().st_size > 0
    # The export remuxes the staged streams: the dataset shows the store's pixels, depth's colours included.
    store_frames, dataset_frames = shown[depth_run.store], shown[depth_run.dataset]
    assert store_frames.keys() == dataset_frames.keys()
    for name, frames in store_frames.items():
        assert all(np.array_equal(a, b) for a, b in zip(frames, dataset_frames[name], strict=True)), name


def test_online_sampler_reads_depth_in_metres(depth_run: DepthRun) -> None:
    from demoforge.storage.sampling import OnlineWindowSampler

    identity = depth_video.lerobot_depth_identity()
    with OnlineWindowSampler(depth_run.store, mode="boundary", chunk_size=4, seed=2) as sampler:
        assert sampler.refresh() == EPISODES
        batch = sampler.read_windows(sampler.sample(3), video=True)
    depth = batch[DEPTH_KEY]
    assert depth.shape == (3, 4, 64, 64) and depth.dtype == np.float32
    assert batch[RGB_KEY].shape == (3, 4, 64, 64, 3)
    for window, episode_id, start in zip(depth, batch["episode_id"], batch["start"]):
        rendered = depth_run.rendered[int(episode_id[2:10])]
        for k, got in enumerate(window):
            expected = depth_video.dequantize(depth_video.quantize_codes(rendered[start + k], identity), identity)
            np.testing.assert_array_equal(got, expected)


def test_replay_of_a_depth_store_and_dataset_reproduces(depth_run: DepthRun) -> None:
    """Replay reads depth stores and datasets; with images it compares the RGB camera by PSNR (depth images are
    not compared by PSNR), states and steps as always."""
    from demoforge.pipeline.replay import ReplaySettings
    from demoforge.pipeline.replay_run import run_replay

    for source in (depth_run.store, depth_run.dataset):
        report = run_replay(source, settings=ReplaySettings(images=True))
        assert report.counts()["reproduced"] == EPISODES and report.exit_code == 0, report.to_json()


@pytest.mark.slow
def test_process_executor_records_the_same_depth(depth_run: DepthRun, tmp_path: Path) -> None:
    """Remote (process) workers step, render and encode depth themselves: the same episodes as the thread run."""
    store = tmp_path / "store"
    done = subprocess.run(demoforge_argv("generate", "--task", TASK, "--episodes", str(EPISODES), "--codec", "h264",
                                         *CLI_OPTIONS, "--executor", "process", "--workers", "1",
                                         "--store", str(store)),
                          env=cli_env(), stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr

    def rows(path: Path) -> list[tuple]:
        with open_store(path) as view:
            return [(r.episode_index, r.attempt, r.frames, r.content_hash, r.video_bytes)
                    for r in view.committed()]

    assert rows(store) == rows(depth_run.store)


# ---------------------------------------------------------------------------------- fingerprints
def test_rgb_only_fingerprint_json_is_unchanged() -> None:
    """An RGB-only job records exactly the JSON it recorded before depth existed: its stores keep opening."""
    text = JobSpec(task=TASK, episodes=1, task_options={"cycles": 1, "image_size": 64}).fingerprint().to_json()
    assert text == (
        '{"action_shape": [4], "cameras": [["front", 64, 64]], "chunk_frames": 64, "fps": 25, "schema_version": 1, '
        '"seed": 0, "state_shapes": {"observation.goal": [3], "observation.state": [25]}, "task": '
        '"fetch-pick-place", "task_options": {"cycles": 1, "image_size": 64}, "video": {"codec": "libsvtav1", '
        '"crf": 30, "g": 2, "pix_fmt": "yuv420p", "preset": 12}}')
    assert JobSpec(task=TASK, episodes=1, task_options={"cycles": 1, "image_size": 64, "depth": False}
                   ).fingerprint().to_json() == text


def test_depth_fingerprint_round_trips_and_refuses_tampering() -> None:
    fingerprint = JobSpec(task=TASK, episodes=1, task_options=OPTIONS).fingerprint()
    assert [c.kind for c in fingerprint.cameras] == ["rgb", DEPTH]
    assert Fingerprint.from_json(fingerprint.to_json()) == fingerprint
    data = json.loads(fingerprint.to_json())
    assert data["cameras"][1] == ["front_depth", 64, 64, "depth"] and data["task_options"]["depth"] is True
    without = {k: v for k, v in data.items() if k != "depth_video"}
    with pytest.raises(FingerprintError, match="depth"):
        Fingerprint.from_json(json.dumps(without))
    data["cameras"][1][3] = "thermal"
    with pytest.raises(FingerprintError, match="cameras"):
        Fingerprint.from_json(json.dumps(data))


# -------------------------------------------------------------------------------------- the encoder
def test_depth_encoder_is_lossless_deterministic_and_refuses_rgb() -> None:
    camera = CameraSpec("d", 48, 64, DEPTH)
    rng = np.random.default_rng(7)
    frames = [rng.uniform(0.0, 12.0, (48, 64)).astype(np.float32) for _ in range(6)]  # includes out-of-range

    def encode() -> bytes:
        encoder = make_encoder(camera, 10, VideoSettings(codec="h264"))
        assert isinstance(encoder, DepthEncoder)
        return b"".join(encoder.encode(f) for f in frames) + encoder.finish()

    first = encode()
    assert encode() == first
    identity = depth_video.lerobot_depth_identity()
    codes = depth_video.decode_codes(first)
    for t, frame in enumerate(frames):
        np.testing.assert_array_equal(codes[t], depth_video.quantize_codes(frame, identity))
    encoder = DepthEncoder(camera, 10)
    with pytest.raises(EncoderError, match="depth camera 'd'"):
        encoder.encode(np.zeros((48, 64, 3), np.uint8))
    encoder.abort()


# ------------------------------------------------------------------------------------------ bad input
class DepthPointEnv(CameraPointEnv):
    """toy-point plus a depth camera that goes bad (``fault``) at episode step 3 of episode 0 (the job then
    moves on to episode index 1, which is clean)."""

    def demo_record(self, observation) -> RecordedObservation:
        recorded = super().demo_record(observation)
        s = self.size
        depth: np.ndarray = np.full((s, s), 1.0 + 0.01 * self.t, np.float32)
        if self.t == 3 and self._seed == derive_seed(0, 0, 0):
            fault = self.options["fault"]
            if fault == "nan":
                depth[0, 0] = np.nan
            elif fault == "inf":
                depth[1, 1] = np.inf
            elif fault == "negative":
                depth[2, 2] = -0.5
            elif fault == "channels":
                depth = depth[..., None]
            elif fault == "resize":
                depth = np.ones((s // 2, s), np.float32)
            elif fault == "integer":
                depth = (depth * 1000).astype(np.uint16)
        return RecordedObservation(state=recorded.state, images={**recorded.images, "cam_depth": depth})


def depth_describe(options) -> TaskInfo:
    info = toy_describe(options)
    size = int(options["size"])
    return TaskInfo(**{**info.__dict__, "name": "toy-depth",
                       "cameras": (*info.cameras, CameraSpec("cam_depth", size, size, DEPTH))})


@pytest.mark.parametrize("fault, says", [("nan", "NaN or inf"), ("inf", "NaN or inf"), ("negative", "negative"),
                                         ("channels", "no channel axis"), ("resize", "16x32"),
                                         ("integer", "float32")])
def test_bad_depth_ends_the_attempt_with_a_typed_error_and_stages_nothing(tmp_path, register_task, fault, says):
    register_task(TaskEntry(name="toy-depth", defaults={**TOY_DEFAULTS, "fault": "none"}, describe=depth_describe,
                            make_env=lambda o: DepthPointEnv(dict(o))))
    store = tmp_path / "store"
    report = run_job(JobSpec(task="toy-depth", episodes=1, max_attempts=1, task_options={"fault": fault},
                             video=VideoSettings(codec="h264")), store)
    assert report.committed_total == 1 and report.abandoned == 1
    catalog = Catalog(store)
    try:
        bad, good = catalog.attempts()
    finally:
        catalog.close()
    assert (bad.episode_index, bad.state, bad.terminal_reason) == (0, "discarded", "error")
    assert bad.record is not None and bad.record["error_type"] == "ObservationError"
    assert "camera 'cam_depth'" in bad.record["error"] and "step 3" in bad.record["error"]
    assert says in bad.record["error"]
    assert (good.episode_index, good.state) == (1, "committed")
    assert staged_episode_ids(store) == [good.episode_id]  # nothing of the failed attempt is staged


# ------------------------------------------------------------------------------------------- kill -9
@pytest.mark.campaign  # random kill moments; the suite's kill tests (no depth) kill at events
def test_sigkill_with_depth_resumes_to_a_clean_runs_content(tmp_path: Path) -> None:
    """SIGKILL `demoforge generate` with depth on at random moments, resume: committed episodes never change,
    and the resumed store holds exactly what an uninterrupted run holds (content hashes)."""
    episodes = 3
    args = ("generate", "--task", TASK, "--episodes", str(episodes), "--codec", "h264", *CLI_OPTIONS)
    store = tmp_path / "store"
    rng = random.Random(13)
    kills = 0
    before: dict[str, str | None] = {}
    for _trial in range(3):
        # Killed once this run has begun an attempt of its own (a new catalog row), somewhere in its next
        # episode or two (an episode takes about a second here).
        rows_before = len(attempts_now(store))
        if kill_once_started(demoforge_argv(*args, "--store", str(store)),
                             lambda: len(attempts_now(store)) > rows_before, rng.uniform(0.1, 1.5),
                             start_timeout_s=180):
            kills += 1
        with open_store(store) as view:
            after = {r.episode_id: r.content_hash for r in view.committed()}
        assert all(after.get(k) == v for k, v in before.items()), "a committed episode was lost or altered"
        before = after
    assert kills >= 2
    done = subprocess.run(demoforge_argv(*args, "--store", str(store)), env=cli_env(), stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    clean = tmp_path / "clean"
    run_job(JobSpec(task=TASK, episodes=episodes, task_options=OPTIONS, video=VideoSettings(codec="h264")), clean)

    def rows(path: Path) -> list[tuple]:
        with open_store(path) as view:
            return [(r.episode_index, r.attempt, r.seed, r.frames, r.content_hash, r.video_bytes)
                    for r in view.committed()]

    assert rows(store) == rows(clean)
    with open_store(store) as view:
        assert set(staged_episode_ids(store)) == {r.episode_id for r in view.committed()}
    verify = subprocess.run(demoforge_argv("verify", "--store", str(store)), env=cli_env(), capture_output=True,
                            text=True, timeout=300)
    assert verify.returncode == 0, verify.stdout
