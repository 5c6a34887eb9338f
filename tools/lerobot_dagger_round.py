#!/usr/bin/env python
"""One DAgger round with LeRobot's own training in the loop (plumbing, not a benchmark).

Run from the repository root::

    HF_HUB_OFFLINE=1 .venv/bin/python tools/lerobot_dagger_round.py [--task metaworld-push-v3] [--steps 20]

1. ``demoforge generate``: 2 expert episodes, camera-less with the full state (``--noise gaussian:0`` so the
   features match the later round's), exported;
2. ``lerobot-train``: a small ACT for ``--steps`` steps on that export;
3. ``demoforge generate --driver <its pretrained_model> --beta 0.5``: 2 episodes the checkpoint drives with the
   expert mixed in, the expert labelling every state (failures kept), exported;
4. ``demoforge merge`` of both exports, and ``lerobot-train`` again on the merged dataset;
5. ``demoforge eval`` of the first checkpoint (2 episodes).
Every step prints its exit status and what it made; the first failure stops the run with exit 1.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
TINY_ACT = ("--policy.type=act", "--policy.device=cpu", "--policy.push_to_hub=false",
            "--policy.pretrained_backbone_weights=null", "--policy.dim_model=64", "--policy.n_heads=2",
            "--policy.dim_feedforward=128", "--policy.n_encoder_layers=1", "--policy.n_decoder_layers=1",
            "--policy.chunk_size=10", "--policy.n_action_steps=10")


def step(name: str, argv: list[str]) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "WANDB_MODE": "disabled", "MUJOCO_GL": "egl"}
    started = time.monotonic()
    done = subprocess.run(argv, env=env, capture_output=True, text=True, stdin=subprocess.DEVNULL, cwd=REPO)
    print(f"[{name}] exit {done.returncode} in {time.monotonic() - started:.1f} s", flush=True)
    if done.returncode != 0:
        print(done.stdout[-3000:], done.stderr[-3000:], sep="\n")
        sys.exit(1)
    return done


def train(dataset: Path, out: Path, steps: int) -> Path:
    step(f"lerobot-train {dataset.name}", [str(BIN / "lerobot-train"), f"--dataset.repo_id=demoforge/{dataset.name}",
                                           f"--dataset.root={dataset}", *TINY_ACT, f"--steps={steps}",
                                           "--batch_size=8", "--num_workers=0", f"--save_freq={steps}",
                                           "--log_freq=10", "--wandb.enable=false", f"--output_dir={out}"])
    return out / "checkpoints" / "last" / "pretrained_model"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--task", default="metaworld-push-v3", help="a Meta-World task (default: metaworld-push-v3)")
    parser.add_argument("--steps", type=int, default=20, help="lerobot-train steps each time (default: 20)")
    args = parser.parse_args()
    demoforge = [sys.executable, "-m", "demoforge.pipeline.cli"]
    common = ["--task", args.task, "--option", "camera=none", "--option", "full_state=true", "--codec", "h264"]
    with tempfile.TemporaryDirectory(prefix="dagger-round-") as scratch:
        root = Path(scratch)
        step("generate round 0 (expert)", [*demoforge, "generate", *common, "--episodes", "2", "--noise", "gaussian:0",
                                           "--store", str(root / "s0"), "--export", str(root / "round0")])
        checkpoint = train(root / "round0", root / "train0", args.steps)
        config = json.loads((checkpoint / "config.json").read_text())
        print(f"  checkpoint {checkpoint.relative_to(root)}: {config['type']}, inputs {sorted(config['input_features'])}")
        round1 = step("generate round 1 (ACT drives, beta 0.5)",
                      [*demoforge, "generate", *common, "--episodes", "2", "--seed", "100", "--driver", str(checkpoint),
                       "--beta", "0.5", "--store", str(root / "s1"), "--export", str(root / "round1")])
        print("  " + next(line for line in round1.stdout.splitlines() if line.startswith("done:")))
        step("merge round 0 + round 1", [*demoforge, "merge", str(root / "round0"), str(root / "round1"), "--out",
                                         str(root / "aggregate")])
        train(root / "aggregate", root / "train1", args.steps)
        evaluated = step("demoforge eval of the round-0 checkpoint",
                         [*demoforge, "eval", *common[:6], "--driver", str(checkpoint), "--episodes", "2"])
        print("  " + next(line for line in evaluated.stdout.splitlines() if "success" in line))
    print("the loop ran: expert data -> lerobot-train -> ACT drives a demoforge job -> merge -> lerobot-train")
    return 0


if __name__ == "__main__":
    sys.exit(main())
