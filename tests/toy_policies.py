"""Driving policies for the policy-in-the-loop tests (``--driver toy_policies:NAME``, with ``tests/`` on the path)."""

from __future__ import annotations

import sys
import threading

import numpy as np

from demoforge.pipeline.tasks.metaworld import ENV_STATE_KEY, MetaWorldExpert

DOWN = np.array([0.0, 0.0, -1.0, -1.0], dtype=np.float32)  # press down with the gripper open, whatever it sees


class Down:
    """A policy that ignores its input: the expert disagrees with it almost everywhere."""

    def __init__(self) -> None:
        self.resets = 0

    def reset(self) -> None:
        self.resets += 1

    def select_action(self, features):
        assert ENV_STATE_KEY in features and "observation.state" in features
        return DOWN.copy()


def down() -> Down:
    return Down()


def push_expert():
    """Meta-World's push expert as a state-based policy over the recorded 39-d observation."""
    expert = MetaWorldExpert("push-v3")
    return lambda features: expert.decide(features[ENV_STATE_KEY])[0]


def broken():
    def act(features):
        raise RuntimeError("the policy's weights are gone")
    return act


# Hostile policies: the policy boundary (stages/control.py GuardedPolicy) turns each into a failed attempt that
# names the driver.
def nan():
    return lambda features: np.full(4, np.nan, dtype=np.float32)


def huge():
    return lambda features: np.full(4, 1e30, dtype=np.float32)


def wrong_shape():
    return lambda features: np.zeros(3, dtype=np.float32)


def wrong_dtype():
    return lambda features: np.array(["up", "up", "up", "up"])


def exits():
    def act(features):
        sys.exit(3)
    return act


def writes_its_input():
    def act(features):
        features["observation.state"] += 1.0  # would change the recorded frame
        return DOWN.copy()
    return act


RELEASE = threading.Event()  # set by a test to let the hanging policies' abandoned threads end
BUILT = {"hangs": 0}


def hangs():
    """A policy whose every call blocks (until RELEASE); counts how often it was built."""
    BUILT["hangs"] += 1

    def act(features):
        RELEASE.wait()
        return DOWN.copy()
    return act


def unbuildable():
    raise RuntimeError("the factory cannot build the policy")


def write_act_checkpoint(folder, state_dim: int = 4, env_state_dim: int = 39) -> None:
    """An untrained, small LeRobot ACT policy saved as `lerobot-train` saves one (config, weights, pre- and
    post-processors with identity statistics): a real checkpoint for the loader, no training needed."""
    import torch
    from lerobot.configs.types import FeatureType, PolicyFeature
    from lerobot.policies.factory import get_policy_class, make_policy_config, make_pre_post_processors

    inputs = {"observation.state": PolicyFeature(FeatureType.STATE, (state_dim,)),
              "observation.environment_state": PolicyFeature(FeatureType.ENV, (env_state_dim,))}
    action = {"action": PolicyFeature(FeatureType.ACTION, (4,))}
    config = make_policy_config("act", input_features=inputs, output_features=action, device="cpu",
                                pretrained_backbone_weights=None, dim_model=32, n_heads=2, dim_feedforward=64,
                                n_encoder_layers=1, n_decoder_layers=1, chunk_size=5, n_action_steps=5,
                                use_vae=False, push_to_hub=False)
    torch.manual_seed(0)
    policy = get_policy_class("act")(config)
    stats = {k: {"mean": torch.zeros(f.shape), "std": torch.ones(f.shape), "min": -torch.ones(f.shape),
                 "max": torch.ones(f.shape)} for k, f in {**inputs, **action}.items()}
    pre, post = make_pre_post_processors(config, dataset_stats=stats)
    policy.save_pretrained(folder)
    pre.save_pretrained(folder)
    post.save_pretrained(folder)
