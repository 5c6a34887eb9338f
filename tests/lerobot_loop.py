"""LeRobot's own training and evaluation commands on a demoforge export: ``lerobot-train`` (a tiny ACT, CPU,
one step), then ``lerobot-eval`` of its checkpoint in LeRobot's env for the task. Nothing reaches a hub."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from helpers import cli_env

BIN = Path(sys.executable).parent
# A small ACT: the point is that LeRobot's own loop runs on our data, not what it learns in two steps.
TINY_ACT = ("--policy.type=act", "--policy.device=cpu", "--policy.push_to_hub=false",
            "--policy.pretrained_backbone_weights=null", "--policy.dim_model=64", "--policy.n_heads=2",
            "--policy.dim_feedforward=128", "--policy.n_encoder_layers=1", "--policy.n_decoder_layers=1",
            "--policy.chunk_size=50", "--policy.n_action_steps=50")


def lerobot(command: str, *args: str, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    env = cli_env(HF_HUB_OFFLINE="1", WANDB_MODE="disabled", TOKENIZERS_PARALLELISM="false")
    argv = [str(BIN / command), *args]
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)


def train(tmp_path: Path, dataset: Path) -> Path:
    """lerobot-train, one step; the checkpoint it saved."""
    run = tmp_path / "train"
    trained = lerobot("lerobot-train", f"--dataset.repo_id=demoforge/{dataset.name}", f"--dataset.root={dataset}",
                      *TINY_ACT, "--steps=1", "--batch_size=2", "--num_workers=0", "--save_freq=1", "--log_freq=1",
                      "--wandb.enable=false", f"--output_dir={run}")
    assert trained.returncode == 0, trained.stdout[-3000:] + trained.stderr[-3000:]
    return run / "checkpoints" / "last" / "pretrained_model"


def train_and_evaluate(tmp_path: Path, dataset: Path, env_args: tuple[str, ...]) -> dict:
    checkpoint = train(tmp_path, dataset)
    config = json.loads((checkpoint / "config.json").read_text())
    evaluated = lerobot("lerobot-eval", f"--policy.path={checkpoint}", *env_args, "--eval.n_episodes=1",
                        "--eval.batch_size=1", "--policy.device=cpu", f"--output_dir={tmp_path / 'eval'}")
    assert evaluated.returncode == 0, evaluated.stdout[-3000:] + evaluated.stderr[-3000:]
    info = json.loads((tmp_path / "eval" / "eval_info.json").read_text())
    assert info["overall"]["n_episodes"] == 1, info["overall"]
    return config


