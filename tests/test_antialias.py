"""``--option antialias=false`` on every built-in MuJoCo task: the same scene drawn without multisampling (only
edge pixels change), the job's fingerprint unchanged at the default, and an appearance option rerender may change."""

from __future__ import annotations

import os

os.environ.setdefault("MUJOCO_GL", "egl")

import numpy as np  # noqa: E402
import pytest  # noqa: E402

from demoforge.pipeline.tasks.mujoco_gl import ANTIALIAS  # noqa: E402
from demoforge.pipeline.tasks.registry import TaskOptionError, get_task  # noqa: E402

pytestmark = pytest.mark.slow  # builds real simulators

SMALL = {
    "fetch-pick-place": {"image_size": 64},
    "aloha-transfer-cube": {"image_height": 64, "image_width": 64},
    "aloha-insertion": {"image_height": 64, "image_width": 64},
    "so101-pick-place": {"image_height": 48, "image_width": 64},
    "metaworld-push-v3": {"image_size": 64, "shadows": False},
}


def first_frames(task: str, options: dict) -> dict[str, np.ndarray]:
    env = get_task(task).build(options)
    try:
        observation, _ = env.reset(seed=7)
        return dict(env.get_wrapper_attr("demo_record")(observation).images)
    finally:
        env.close()


@pytest.mark.parametrize("task", sorted(SMALL))
def test_without_antialiasing_the_scene_is_the_same_but_for_its_edges(task: str) -> None:
    smooth = first_frames(task, SMALL[task])
    sharp = first_frames(task, {**SMALL[task], ANTIALIAS: False})
    assert smooth.keys() == sharp.keys() and smooth
    for camera, image in smooth.items():
        assert sharp[camera].shape == image.shape
        changed = np.any(sharp[camera] != image, axis=-1)
        # Multisampling only blends the pixels that edges cross: some change, most do not.
        assert 0 < changed.mean() < 0.35, (camera, float(changed.mean()))
        assert np.abs(sharp[camera].astype(int) - image).mean() < 12, camera

    entry = get_task(task)
    assert ANTIALIAS in entry.appearance_options  # rerender may draw a dataset again with it changed
    # Stores written before the option existed keep their fingerprint: the default is left out of it.
    assert ANTIALIAS not in entry.info(SMALL[task]).options
    assert entry.info({**SMALL[task], ANTIALIAS: False}).options[ANTIALIAS] is False


def test_antialias_must_be_a_boolean() -> None:
    with pytest.raises(TaskOptionError, match="antialias"):
        get_task("fetch-pick-place").resolve_options({ANTIALIAS: "sometimes"})
