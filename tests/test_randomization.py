"""Per-episode domain randomization (pipeline/tasks/randomization.py): drawn from the attempt's seed, recorded
with the episode, replayed exactly; appearance changes only where asked; bad axes and ranges refused."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest

from demoforge.pipeline.tasks.registry import TaskOptionError, get_task
from demoforge.stages.task_protocol import Randomizes, RecordsObservation, task_capability
from demoforge.storage.episode_source import open_episode_source
from helpers import run_cli

FETCH = ("--task", "fetch-pick-place", "--option", "cycles=1", "--option", "image_size=64",
         "--option", "antialias=false")  # no multisampling: about 2x faster on CPU, edges only (docs/tasks.md)
PUSH = ("--task", "metaworld-push-v3", "--option", "camera=none")


def first_frame(task: str, options: dict, seed: int = 3) -> np.ndarray:
    """The first recorded image of an attempt with ``seed``, drawn and reset as the executor does it."""
    env = get_task(task).build(options)
    try:
        randomizer = task_capability(env, Randomizes)
        if randomizer is not None:
            randomizer.demo_randomize(seed)
        observation, _ = env.reset(seed=seed)
        recorder = task_capability(env, RecordsObservation)
        assert recorder is not None
        return next(iter(recorder.demo_record(observation).images.values()))
    finally:
        env.close()


def test_draws_are_a_function_of_the_seed_and_axes_draw_independently() -> None:
    entry = get_task("fetch-pick-place")
    env: Any = entry.build({"image_size": 64, "randomize": "lighting,physics"})
    lighting_only: Any = entry.build({"image_size": 64, "randomize": "lighting"})
    try:
        a, b, again = env.demo_randomize(1), env.demo_randomize(2), env.demo_randomize(1)
        assert a == again and a != b
        assert a["axes"] == ["lighting", "physics"] and set(a) == {"axes", "lighting", "physics"}
        assert 0.8 <= a["physics"]["mass"] <= 1.2 and a["physics"]["bodies"] == 1
        json.dumps(a, allow_nan=False)
        # adding an axis does not change what another axis draws for the same seed
        assert lighting_only.demo_randomize(1)["lighting"] == a["lighting"]
        # the model really changed, and goes back to nominal before every draw
        model = env.unwrapped.model
        body = model.body("object0").id
        nominal: Any = get_task("fetch-pick-place").build({"image_size": 64})
        nominal_mass = nominal.unwrapped.model.body_mass[body]
        nominal.close()
        env.demo_randomize(1)
        assert model.body_mass[body] == pytest.approx(nominal_mass * a["physics"]["mass"])
    finally:
        env.close()
        lighting_only.close()


def test_pixels_change_only_where_appearance_was_randomized() -> None:
    plain = first_frame("fetch-pick-place", {"image_size": 64})
    lit = first_frame("fetch-pick-place", {"image_size": 64, "randomize": "lighting"})
    assert np.abs(lit.astype(int) - plain).mean() > 1.0
    still = first_frame("fetch-pick-place", {"image_size": 64, "randomize": "camera", "randomize.camera.pos": 0,
                                             "randomize.camera.rot": 0})
    assert np.array_equal(still, plain)  # a camera jitter of 0 renders exactly the unrandomized frame
    heavier = first_frame("fetch-pick-place", {"image_size": 64, "randomize": "physics"})
    assert np.array_equal(heavier, plain)  # physics is not appearance
    moved = first_frame("aloha-transfer-cube", {"image_height": 48, "image_width": 64, "randomize": "camera"})
    fixed = first_frame("aloha-transfer-cube", {"image_height": 48, "image_width": 64})
    difference = np.abs(moved.astype(int) - fixed)
    # ALOHA's top camera aims at a body from straight above; a 2 cm jitter must not spin the picture
    assert 0.5 < difference.mean() < 40


def test_a_randomized_job_records_the_draws_and_replays_exactly(tmp_path) -> None:
    store, dataset = tmp_path / "s", tmp_path / "d"
    done = run_cli("generate", *PUSH, "--episodes", "2", "--seed", "4", "--randomize", "lighting,colors,physics",
                   "--option", "randomize.physics.mass=0.4", "--store", str(store), "--export", str(dataset))
    assert done.returncode == 0, done.stderr
    for path in (store, dataset):
        source = open_episode_source(path)
        try:
            records = [source.load(ref).record for ref in source.episodes()]
        finally:
            source.close()
        draws = [r["randomization"] for r in records]
        assert all(d["axes"] == ["lighting", "colors", "physics"] for d in draws)
        assert draws[0] != draws[1] and all(0.6 <= d["physics"]["mass"] <= 1.4 for d in draws)
    replay = run_cli("replay", str(dataset), "--json")
    assert replay.returncode == 0, replay.stdout + replay.stderr
    assert [e["verdict"] for e in json.loads(replay.stdout)["episodes"]] == ["reproduced", "reproduced"]
    shown = run_cli("inspect", str(store))
    assert shown.returncode == 0 and "randomized: lighting, colors, physics" in shown.stdout, shown.stdout
    for path in (store, dataset):  # --json has the drawn values the text points to
        listed = json.loads(run_cli("inspect", str(path), "--json").stdout)["randomization"]
        assert [e["episode"] for e in listed] == [0, 1] and [e["values"] for e in listed] == draws


def test_a_scene_drawn_differently_from_the_record_is_a_divergence(tmp_path) -> None:
    """Replay draws the scene again from the episode's seed; a task whose draw changed (here: another physics
    range under the same options is impossible, so the recorded draw is altered) is reported, not stepped."""
    from demoforge.pipeline.replay import EnvCache, EpisodeReplay, Tolerance

    store = tmp_path / "s"
    assert run_cli("generate", *PUSH, "--episodes", "1", "--randomize", "physics", "--store",
                   str(store)).returncode == 0
    source = open_episode_source(store)
    try:
        episode = source.load(source.episodes()[0])
    finally:
        source.close()
    altered = dict(episode.record, randomization={**episode.record["randomization"],
                                                  "physics": {**episode.record["randomization"]["physics"],
                                                              "mass": 1.0}})
    object.__setattr__(episode, "record", altered)
    envs = EnvCache()
    try:
        assert episode.task_options is not None, "a store records its job's task options"
        env = envs.get(episode.ref.task, episode.task_options)
        divergence, _, _ = EpisodeReplay(env, episode, tolerance=Tolerance(1e-6, 1e-6)).run()
    finally:
        envs.close()
    assert divergence is not None and divergence.kind == "randomization" and divergence.frame == 0
    assert "physics" in divergence.detail


@pytest.mark.parametrize("args, message", [
    (("--randomize", "lighting,weather"), "unknown randomization axis 'weather'"),
    (("--randomize", "camera", "--option", "randomize.camera.pos=0.5"),
     "option 'randomize.camera.pos' must be in 0..0.1"),
    (("--randomize", "init"), "does not randomize 'init' (it declares no initial-state range)"),
    (("--randomize", "physics", "--option", "randomize=colors"), "--randomize or --option randomize"),
    # issue 57: empty axes randomized nothing and were stored; an unknown range was blamed on the task
    (("--randomize", ",,"), "randomization axes ',,' hold an empty item"),
    (("--randomize", ""), "--randomize '': name one or more axes"),
    (("--option", "randomize=lighting,"), "randomization axes 'lighting,' hold an empty item"),
    (("--option", "randomize.lighting.nosuch=0.1"),
     "has no option 'randomize.lighting.nosuch'; its randomization options: randomize, randomize.lighting.pos"),
    # user text is printed literally: rich would turn :smile: into an emoji
    (("--randomize", ":smile:"), "unknown randomization axis ':smile:'"),
])
def test_bad_axes_and_ranges_are_refused_naming_them(tmp_path, args, message) -> None:
    store = tmp_path / "s"
    done = run_cli("generate", *PUSH, "--episodes", "1", *args, "--store", str(store))
    assert done.returncode == 2, done.stdout + done.stderr
    assert message in done.stderr and "Traceback" not in done.stderr, done.stderr
    assert not store.exists()


def test_a_task_without_a_scene_refuses_randomization_and_defaults_leave_fingerprints_alone(tmp_path) -> None:
    done = run_cli("generate", "--task", "toy-point", "--episodes", "1", "--randomize", "lighting",
                   "--store", str(tmp_path / "s"))
    assert done.returncode == 2 and "cannot be randomized" in done.stderr, done.stderr
    for task in ("fetch-pick-place", "aloha-transfer-cube", "metaworld-push-v3"):
        assert not any(key.startswith("randomize") for key in get_task(task).info({}).options)
    with pytest.raises(TaskOptionError, match="init.scale' must be in 1..1.5"):
        get_task("fetch-pick-place").resolve_options({"randomize": "init", "randomize.init.scale": 1.8})


def test_widened_initial_states_reach_beyond_the_default_range() -> None:
    entry = get_task("fetch-pick-place")
    wide: Any = entry.build({"image_size": 32, "randomize": "init", "randomize.init.scale": 1.5})
    try:
        offsets = []
        for seed in range(40):
            wide.demo_randomize(seed)
            wide.reset(seed=seed)
            fetch = wide.unwrapped
            offsets.append(np.abs(fetch._utils.get_site_xpos(fetch.model, fetch.data, "object0")[:2]
                                  - fetch.initial_gripper_xpos[:2]).max())
    finally:
        wide.close()
    assert max(offsets) > 0.15 + 0.01 and max(offsets) <= 0.225 + 1e-6


def test_an_appearance_variant_is_asked_only_of_a_task_that_draws_variants() -> None:
    """Replay and rerender draw a scene through one typed door (``draw_randomization``): variant 0 of any
    randomizing task is its plain draw; another variant of a task whose ``demo_randomize`` takes no variant is
    refused naming it, and a task that randomizes nothing draws nothing."""
    from demoforge.stages.contract import TaskProtocolError
    from demoforge.stages.task_protocol import draw_randomization

    class PlainDraw:
        def demo_randomize(self, seed: int) -> dict[str, Any]:
            return {"seed": seed}

    assert draw_randomization(PlainDraw(), 7) == {"seed": 7}
    with pytest.raises(TaskProtocolError, match=r"PlainDraw.demo_randomize takes no appearance variant \(asked for "
                                                r"variant 2\)"):
        draw_randomization(PlainDraw(), 7, 2)
    assert draw_randomization(object(), 7, 2) is None
    env = get_task("fetch-pick-place").build({"image_size": 64, "randomize": "lighting"})
    try:
        variant = draw_randomization(env, 7, 1)
        assert draw_randomization(env, 7) == draw_randomization(env, 7, 0) != variant
        assert variant is not None and variant["variant"] == 1
    finally:
        env.close()
