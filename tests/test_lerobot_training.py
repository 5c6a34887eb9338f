"""Exports are datasets LeRobot trains on and evaluates against: `lerobot-train` (ACT, CPU, one step) on a
demoforge export, then `lerobot-eval` of the checkpoint in LeRobot's own env for the task, with no renaming.

Nothing here reaches a hub: the dataset is local, the backbone starts from random weights
(``pretrained_backbone_weights=null``), HF_HUB_OFFLINE is set and wandb is off.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import cli_env, run_cli
from lerobot_loop import train

pytestmark = pytest.mark.slow
@pytest.mark.campaign
def test_lerobot_trains_on_a_rerendered_metaworld_export(tmp_path) -> None:
    """An export rerendered at another size (with randomized lighting) is a dataset LeRobot trains on, with the
    input features LeRobot's Meta-World env gives a policy; its sub-task labels give LeRobot's RA-BC weights
    (docs/examples/rabc_progress.py, then LeRobot's RABCWeights on a LeRobotDataset batch). lerobot-train 0.6.1
    applies RA-BC only to policies whose loss is per sample (pi0, pi05, smolvla: pretrained models from a hub),
    not to ACT, so the weights are checked, not trained with. (The frames and state LeRobot's Meta-World env
    gives a policy are compared with ours in test_metaworld.py; `lerobot-eval` of such a checkpoint in that env,
    a 500-step episode of minutes on two cores, is `tools/bench_metaworld.py --eval`.)"""
    import torch
    from lerobot.datasets.lerobot_dataset import LeRobotDataset
    from lerobot.rewards.sarm.rabc import RABCWeights

    dataset = tmp_path / "metaworld-push"
    done = run_cli("generate", "--task", "metaworld-push-v3", "--episodes", "2", "--option", "image_size=48",
                   "--option", "shadows=false", "--codec", "h264", "--store", str(tmp_path / "store"))
    assert done.returncode == 0, done.stderr
    done = run_cli("rerender", str(tmp_path / "store"), "--out", str(dataset), "--option", "image_size=64",
                   "--randomize", "lighting", "--codec", "h264")
    assert done.returncode == 0, done.stdout + done.stderr
    example = Path(__file__).parents[1] / "docs" / "examples" / "rabc_progress.py"
    progress = subprocess.run([sys.executable, str(example), str(dataset)], capture_output=True, text=True,
                              timeout=300, env=cli_env(HF_HUB_OFFLINE="1"))
    assert progress.returncode == 0, progress.stderr[-3000:]
    weights = RABCWeights(dataset / "sarm_progress.parquet", chunk_size=10, head_mode="dense",
                          device=torch.device("cpu"))
    frames = LeRobotDataset("demoforge/rerendered", root=dataset, video_backend="pyav")
    batch = {"index": torch.stack([frames[i]["index"] for i in range(0, len(frames), max(1, len(frames) // 8))])}
    values, stats = weights.compute_batch_weights(batch)
    assert values.shape == (len(batch["index"]),) and torch.isfinite(values).all() and (values >= 0).all()
    assert values.sum().item() == pytest.approx(len(values), rel=1e-3) and stats["num_zero_weight"] < len(values)

    config = json.loads((train(tmp_path, dataset) / "config.json").read_text())
    # the features LeRobot's Meta-World env gives a policy, by the names it gives them
    assert set(config["input_features"]) == {"observation.image", "observation.state"}
    assert config["input_features"]["observation.image"]["shape"] == [3, 64, 64]
    assert config["input_features"]["observation.state"]["shape"] == [4]
    assert config["output_features"]["action"]["shape"] == [4]
