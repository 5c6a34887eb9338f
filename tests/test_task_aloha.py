"""The built-in "aloha-transfer-cube" task on the real gym-aloha simulator.

One module-scoped env runs five episodes once (small images keep it quick); the tests read its records.
"""

from __future__ import annotations

import os

os.environ.setdefault("MUJOCO_GL", "egl")

from collections.abc import Iterator  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402
import pytest  # noqa: E402

from demoforge.pipeline.tasks.registry import TaskOptionError, get_task  # noqa: E402
from demoforge.stages.executor import run_episodes  # noqa: E402
from task_checks import check_first_frame_is_gym_alohas, check_segments_cover, ended, frames_of  # noqa: E402

TASK = "aloha-transfer-cube"
OPTIONS = {"image_height": 48, "image_width": 64, "antialias": False}  # unequal sides catch a swapped height/width
EPISODES = 5
SEGMENTS = ("reach_above_cube", "descend", "grasp", "lift_to_meet", "move_to_meet", "handover", "retreat")

pytestmark = pytest.mark.slow


def run(env: Any, episodes: int) -> list[Any]:
    return list(run_episodes(env, task=TASK, episodes=episodes, job_seed=0, max_attempts=1))


@pytest.fixture(scope="module")
def aloha() -> Iterator[tuple[Any, list[Any]]]:
    env = get_task(TASK).build(OPTIONS)
    try:
        yield env, run(env, EPISODES)
    finally:
        env.close()


def test_most_seeds_end_committable(aloha):
    _env, records = aloha
    results = [r.result for r in ended(records)]
    assert len(results) == EPISODES
    ok = sum(r.committable for r in results)
    assert ok >= EPISODES - 1, [(r.episode_index, r.failure_reason) for r in results]


def test_segments_in_order_and_spans_cover_the_episode(aloha):
    _env, records = aloha
    for end in ended(records):
        if end.result.committable:
            check_segments_cover(end, records, SEGMENTS, "cube")
            assert all(s.success for s in end.result.segments)


def test_same_episode_twice_is_identical(aloha):
    """Episode 0 rerun after the other episodes on the same env: identical actions and images."""
    env, records = aloha
    first, again = frames_of(records, 0), frames_of(run(env, 1), 0)
    assert len(first) == len(again) > 0
    for a, b in zip(first, again):
        np.testing.assert_array_equal(a.action, b.action)
        np.testing.assert_array_equal(a.state["observation.state"], b.state["observation.state"])
        np.testing.assert_array_equal(a.images["top"], b.images["top"])


def test_task_info_matches_the_frames(aloha):
    env, records = aloha
    info = get_task(TASK).info(OPTIONS)
    frame = frames_of(records, 0)[0]
    assert [(c.name, c.height, c.width) for c in info.cameras] == [("top", 48, 64)]
    assert set(frame.images) == {"top"}
    assert frame.images["top"].shape == (48, 64, 3) and frame.images["top"].dtype == np.uint8
    assert {k: v.shape for k, v in frame.state.items()} == dict(info.state_shapes) == {"observation.state": (14,)}
    assert frame.state["observation.state"].dtype == np.float32
    assert frame.action.shape == info.action_shape == (14,)
    assert info.segment_names == SEGMENTS and info.fps == 50 and info.action_names is not None and len(info.action_names) == 14


def test_only_the_top_camera_is_rendered_by_one_kept_camera(aloha, monkeypatch) -> None:
    """Each observation renders the top camera alone, at the configured size, through one camera kept for the
    physics (``physics.render`` would build a camera and a scene every frame)."""
    from dm_control import mujoco as dm_mujoco

    env, _records = aloha
    physics = env.physics
    renders: list[tuple[Any, ...]] = []
    cameras: list[int] = []
    render, init = dm_mujoco.Camera.render, dm_mujoco.Camera.__init__

    def spy_render(self, *args: Any, **kwargs: Any) -> np.ndarray:
        name = physics.model.id2name(self._render_camera.fixedcamid, "camera")
        renders.append((name, self.height, self.width, id(self)))
        return render(self, *args, **kwargs)

    def spy_init(self, *args: Any, **kwargs: Any) -> None:
        cameras.append(id(self))
        init(self, *args, **kwargs)

    monkeypatch.setattr(dm_mujoco.Camera, "render", spy_render)
    monkeypatch.setattr(dm_mujoco.Camera, "__init__", spy_init)
    monkeypatch.setattr(physics, "render", lambda *a, **k: pytest.fail("physics.render builds a camera per frame"))
    env.reset(seed=1)
    hold = env.demo_hold_action()
    for _ in range(2):
        _obs, _reward, terminated, _truncated, _info = env.step(hold)
        assert not terminated
    assert [r[:3] for r in renders] == [("top", 48, 64)] * 3
    assert len({r[3] for r in renders}) == 1 and len(cameras) <= 1


def test_hold_action_keeps_the_arms_still(aloha):
    env, _records = aloha
    obs, _ = env.reset(seed=2)
    for _ in range(30):  # let the arms settle on the start targets
        obs, *_ = env.step(env.demo_hold_action())
    before = np.asarray(obs["agent_pos"]).copy()
    for _ in range(10):
        obs, *_ = env.step(env.demo_hold_action())
    np.testing.assert_allclose(obs["agent_pos"], before, atol=2e-3)


@pytest.mark.parametrize("options", [{"image_height": 16}, {"image_width": 2000}, {"shadows": 1}])
def test_bad_options_are_refused(options):
    with pytest.raises(TaskOptionError):
        get_task(TASK).info(options)


@pytest.mark.slow
def test_depth_option_renders_metres_from_the_top_camera() -> None:
    entry = get_task("aloha-transfer-cube")
    options = {"image_height": 48, "image_width": 64, "depth": True}
    assert [c.kind for c in entry.info(options).cameras] == ["rgb", "depth"]
    env: Any = entry.build(options)
    try:
        obs, _ = env.reset(seed=0)
        depth = env.demo_record(obs).images["top_depth"]
    finally:
        env.close()
    assert depth.shape == (48, 64) and depth.dtype == np.float32
    near = depth[depth < 3.0]  # the scene under the top camera; pixels seeing no geometry read the far plane
    assert np.isfinite(depth).all() and near.size > depth.size / 5 and 0.3 < float(np.median(near)) < 1.5


def test_with_the_eval_envs_rendering_frames_are_what_lerobots_aloha_env_gives_a_policy() -> None:
    """LeRobot's AlohaEnv (gym-aloha) renders `top` at 480x640 with shadows: asked for that rendering, our frame
    and state equal it pixel for pixel (docs/export.md, "Evaluating with LeRobot")."""
    check_first_frame_is_gym_alohas("gym_aloha/AlohaTransferCube-v0", TASK, seed=5)
