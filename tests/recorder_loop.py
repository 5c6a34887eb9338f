"""A user's recording loop over demoforge's Recorder, with frames computed from (episode, step): what the
recorder tests save, compare with LeRobot's own writer, and SIGKILL at random moments.

``python tests/recorder_loop.py ROOT EPISODES [CODEC]`` prints ``saved <index> <frames>`` (flushed) after each
``save_episode`` returns.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

CAMERA = "observation.images.front"
HEIGHT, WIDTH = 48, 64
FEATURES = {
    "observation.state": {"dtype": "float32", "shape": (6,), "names": [f"joint_{i}" for i in range(6)]},
    "action": {"dtype": "float32", "shape": (6,), "names": [f"joint_{i}" for i in range(6)]},
    CAMERA: {"dtype": "video", "shape": (HEIGHT, WIDTH, 3), "names": ["height", "width", "channels"]},
}
TASK = "stack the red block on the blue one"


def length(episode: int) -> int:
    return 12 + (episode * 7) % 9


def frame(episode: int, step: int) -> dict:
    """Every feature of one frame, and the task, as a LeRobot recording loop passes them to add_frame."""
    t = step / 10.0
    state = (np.sin(t + np.arange(6) * 0.4) + episode * 0.01).astype(np.float32)
    y, x = np.mgrid[0:HEIGHT, 0:WIDTH]
    image = np.stack([128 + 100 * np.sin(x / 9 + t), 128 + 100 * np.cos(y / 7 + episode),
                      128 + 80 * np.sin((x + y) / 13 - t)], axis=-1).round().astype(np.uint8)  # smooth: codecs keep it
    return {"observation.state": state, "action": np.roll(state, 1) * 0.5, CAMERA: image, "task": TASK}


def lerobot_record(root: Path, episodes: range, *, crashed: Path | None = None) -> Path:
    """The same frames through LeRobot 0.6.1's own writer (h264, its default PNG-then-encode path). ``crashed``: a
    copy of the folder taken after the last ``save_episode`` and before ``finalize``: what a SIGKILL there leaves
    (tools/lerobot_kill_harness.py measured it: the writer's files are flushed per episode; the data file's
    footer and the buffered episode metadata are written only by finalize)."""
    from lerobot.configs.video import RGBEncoderConfig
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    dataset = LeRobotDataset.create("local/reference", fps=30, features=FEATURES, root=root, use_videos=True,
                                    rgb_encoder=RGBEncoderConfig(vcodec="h264"))
    for episode in episodes:
        for step in range(length(episode)):
            dataset.add_frame(frame(episode, step))
        dataset.save_episode()
    if crashed is not None:
        import shutil

        shutil.copytree(root, crashed)
    dataset.finalize()
    return root


def record(root: Path, episodes: int, codec: str = "h264") -> None:
    from demoforge import Recorder

    with Recorder.create(root, fps=30, features=FEATURES, codec=codec) as recorder:
        while recorder.episode_index < episodes:
            episode = recorder.episode_index
            for step in range(length(episode)):
                recorder.add_frame(frame(episode, step))
            saved = recorder.save_episode()
            print(f"saved {saved} {length(episode)}", flush=True)


if __name__ == "__main__":
    record(Path(sys.argv[1]), int(sys.argv[2]), *(sys.argv[3:4] or ["h264"]))
