"""A small state-based behaviour-cloning policy for tools/bench_policy_loop.py: an MLP from Meta-World's 39-d
observation (``observation.environment_state``) to its 4-d action, trained with torch on the CPU.

Weights and normalisation live in one safetensors file (no pickle). As a demoforge driver::

    DEMOFORGE_BC_POLICY=weights.safetensors demoforge generate ... --driver bc_policy:load

(with ``tools/`` on ``PYTHONPATH``; the benchmark runs jobs in its own process, where it is).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file, save_file

INPUT = "observation.environment_state"
HIDDEN = 256


def network(inputs: int = 39, outputs: int = 4) -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(inputs, HIDDEN), torch.nn.ReLU(), torch.nn.Linear(HIDDEN, HIDDEN),
                               torch.nn.ReLU(), torch.nn.Linear(HIDDEN, outputs), torch.nn.Tanh())


def train(states: np.ndarray, labels: np.ndarray, out: Path, *, steps: int = 3000, batch: int = 256,
          seed: int = 0, lr: float = 1e-3) -> float:
    """Fit the MLP to (state, expert label) pairs; save it to ``out``; return the last loss."""
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    mean, std = states.mean(0), states.std(0) + 1e-6
    x = torch.from_numpy(((states - mean) / std).astype(np.float32))
    y = torch.from_numpy(np.clip(labels, -1, 1).astype(np.float32))
    net = network(x.shape[1], y.shape[1])
    opt = torch.optim.Adam(net.parameters(), lr=lr)
    loss = torch.tensor(0.0)
    for _ in range(steps):
        idx = torch.from_numpy(rng.integers(0, len(x), size=min(batch, len(x))))
        loss = torch.nn.functional.mse_loss(net(x[idx]), y[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
    tensors = {f"net.{k}": v.contiguous() for k, v in net.state_dict().items()}
    tensors["mean"], tensors["std"] = torch.from_numpy(mean.astype(np.float32)), torch.from_numpy(std.astype(np.float32))
    save_file(tensors, str(out))
    return float(loss.detach())


class BCPolicy:
    def __init__(self, path: Path) -> None:
        tensors = load_file(str(path))
        self.mean, self.std = tensors.pop("mean").numpy(), tensors.pop("std").numpy()
        self.net = network(len(self.mean), tensors["net.4.weight"].shape[0])
        self.net.load_state_dict({k[len("net."):]: v for k, v in tensors.items()})
        self.net.eval()

    def select_action(self, features: dict[str, np.ndarray]) -> np.ndarray:
        x = torch.from_numpy(((features[INPUT] - self.mean) / self.std).astype(np.float32))
        with torch.inference_mode():
            return self.net(x.unsqueeze(0))[0].numpy()


def load() -> BCPolicy:
    """The driver factory: the policy in the file ``DEMOFORGE_BC_POLICY`` names."""
    path = os.environ.get("DEMOFORGE_BC_POLICY")
    if not path:
        raise RuntimeError("DEMOFORGE_BC_POLICY is not set (the policy's safetensors file)")
    return BCPolicy(Path(path))
