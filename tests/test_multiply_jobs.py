"""`demoforge multiply` around the job: start ranges narrower than the task's own (a source recorded in a narrow
range, multiplied into the full one), the daemon's ``[multiply]`` job killed with SIGKILL in a commit window and
restarted (exactly the episodes of an uninterrupted ``demoforge multiply``), ``inspect``'s generation success
rate and ``edit --keep-where source_episode``."""

from __future__ import annotations

import json
import signal
import subprocess
import time

import numpy as np
import pytest

from demoforge.pipeline.daemon_config import DaemonConfigError, load_config
from demoforge.pipeline.multiply import task_poses
from demoforge.pipeline.tasks.registry import TaskOptionError, get_task
from demoforge.storage.lerobot.episode_filter import parse_filter, provenance_facts
from helpers import attempts_now, cli_env, daemon_events, demoforge_argv, run_cli

REACH = ("--task", "metaworld-reach-v3", "--option", "camera=none", "--codec", "h264")  # no renderer: fast
FETCH = {"cycles": 1, "image_size": 32, "antialias": False}
MULTIPLY = ("--seed", "5", "--strategy", "nearest", "--max-attempts", "10")


def _start(task: str, options: dict, seed: int, key: str) -> np.ndarray:
    env = get_task(task).build(options)
    try:
        randomize = getattr(env, "demo_randomize", None)
        if randomize is not None:
            randomize(seed)
        env.reset(seed=seed)
        poses = task_poses(env)
        assert poses is not None
        return poses.object_poses()[key].position
    finally:
        env.close()


# ------------------------------------------------------------------------------------------ start ranges
def test_a_narrow_start_range_is_the_full_one_shrunk_about_its_centre_and_the_default_is_unchanged():
    # Fetch: the cube's offset from the gripper's start (the range's centre) scaled by init_range, seed for seed.
    env = get_task("fetch-pick-place").build(FETCH)
    centre = np.asarray(env.unwrapped.initial_gripper_xpos[:2])  # type: ignore[attr-defined]
    env.close()
    for seed in (0, 7):
        full = _start("fetch-pick-place", FETCH, seed, "object0")
        narrow = _start("fetch-pick-place", {**FETCH, "init_range": 0.3}, seed, "object0")
        assert np.allclose(narrow[:2] - centre, 0.3 * (full[:2] - centre), atol=1e-6), seed
        # --randomize init draws the range itself (the env's own, widened): init_range narrows only without it.
        widened = _start("fetch-pick-place", {**FETCH, "randomize": "init"}, seed, "object0")
        assert np.allclose(_start("fetch-pick-place", {**FETCH, "init_range": 0.3, "randomize": "init"}, seed,
                                  "object0"), widened)
    # Meta-World: the env's reset space, about its centre (drawer-open draws the drawer's x in [-0.1, 0.1]).
    mw = {"camera": "none"}
    for seed in (0, 7):
        full = _start("metaworld-drawer-open-v3", mw, seed, "drawer")
        narrow = _start("metaworld-drawer-open-v3", {**mw, "init_range": 0.5}, seed, "drawer")
        assert abs(narrow[0] - 0.5 * full[0]) < 1e-6 and abs(narrow[0]) <= 0.05 + 1e-9
    # The option is left out of the description at its default: stores made before it keep their fingerprint.
    for task, options in (("fetch-pick-place", FETCH), ("metaworld-push-v3", mw)):
        assert "init_range" not in get_task(task).info(options).options
        assert get_task(task).info({**options, "init_range": 0.5}).options["init_range"] == 0.5


@pytest.mark.parametrize("task,options,fragment", [
    ("fetch-pick-place", {"init_range": 0.05}, "option 'init_range' must be in 0.1..1.0"),
    ("fetch-pick-place", {"init_range": float("nan")}, "option 'init_range' must be in"),
    ("metaworld-push-v3", {"init_range": 1.5}, "option 'init_range' must be in 0.1..1.0"),
    ("metaworld-button-press-v3", {"init_range": 0.5}, "is declared for reach-v3"),
    ("metaworld-mt10", {"init_range": 0.5}, "not a suite"),
])
def test_start_ranges_outside_what_a_task_declares_are_refused(task, options, fragment):
    with pytest.raises(TaskOptionError, match="init_range") as info:
        get_task(task).resolve_options(options)
    assert fragment in str(info.value)


# ---------------------------------------------------------------------------------------------- the job
@pytest.fixture(scope="module")
def narrow_source(tmp_path_factory):
    """Two reach demonstrations in a narrow start range (half the env's own)."""
    store = tmp_path_factory.mktemp("source") / "reach"
    done = run_cli("generate", *REACH, "--option", "init_range=0.5", "--episodes", "2", "--store", str(store))
    assert done.returncode == 0, done.stderr
    return store


@pytest.fixture(scope="module")
def uninterrupted(narrow_source, tmp_path_factory):
    """`demoforge multiply` of the narrow source into the full range, run once without a break."""
    store = tmp_path_factory.mktemp("whole") / "store"
    done = run_cli("multiply", str(narrow_source), *REACH[2:], "--option", "init_range=1", "--episodes", "4",
                   *MULTIPLY, "--store", str(store))
    assert done.returncode == 0, done.stderr
    return store, done.stdout


def _committed(store):
    return [(row.episode_index, row.attempt, row.seed, row.content_hash,
             [(g["name"], g["start_step"], g["end_step"], g["metadata"]) for g in row.record["segments"]])
            for row in attempts_now(store, ("committed", "exported"))]


def _job_file(tmp_path, source, multiply='strategy = "nearest"'):
    path = tmp_path / "job.toml"
    path.write_text(f"""
[job]
episodes = 4
seed = 5
max_attempts = 10
options = {{ init_range = 1 }}
[multiply]
source = "{source}"
{multiply}
[video]
codec = "h264"
[store]
dir = "store"
[metrics]
address = "off"
""")
    return path


@pytest.mark.slow
def test_a_daemon_multiply_job_killed_in_a_commit_window_resumes_to_the_episodes_of_an_uninterrupted_one(
        narrow_source, uninterrupted, tmp_path):
    job = _job_file(tmp_path, narrow_source)
    marks, err = tmp_path / "windows", tmp_path / "daemon.err"
    with open(err, "w") as stderr:
        # Each commit pauses 1 s between its data's fsync and its catalog flip and marks the moment it opens.
        proc = subprocess.Popen(demoforge_argv("daemon", "--config", str(job), "--json-logs"),
                                env=cli_env(DEMOFORGE_STAGE_DELAY="commit:1", DEMOFORGE_WINDOW_MARKS=str(marks)),
                                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=stderr)
        deadline = time.monotonic() + 120
        while not (marks.exists() and len(marks.read_text().splitlines()) >= 2):  # the second commit's window
            assert proc.poll() is None, err.read_text()
            assert time.monotonic() < deadline, err.read_text()
            time.sleep(0.02)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=60)
    store = tmp_path / "store"
    assert len(_committed(store)) == 1  # killed with the second episode fsynced, its commit not flipped
    assert [e["event"] for e in daemon_events(err.read_text())][:2] == ["multiply_source", "started"]
    again = subprocess.run(demoforge_argv("daemon", "--config", str(job), "--json-logs"), env=cli_env(),
                           stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr
    events = daemon_events(again.stderr)
    assert events[-1]["event"] == "stopped" and events[-1]["committed_total"] == 4
    reference, _ = uninterrupted
    assert _committed(store) == _committed(reference)  # indices, attempts, seeds, content and provenance
    assert len(list((store / "multiply").glob("source-*.npz"))) == 1


def test_a_multiply_section_that_cannot_run_is_refused_naming_it_before_anything_is_written(narrow_source,
                                                                                           tmp_path):
    cases = [('strategy = "farthest"', "multiply.strategy must be one of random, nearest"),
             ("interpolation = -1", "multiply.interpolation must be in 0..1000"),
             ('sauce = "x"', "unknown key multiply.sauce")]
    for extra, fragment in cases:
        with pytest.raises(DaemonConfigError, match="multiply") as info:
            load_config(_job_file(tmp_path, narrow_source, extra))
        assert fragment in str(info.value)
    with pytest.raises(DaemonConfigError, match=r"\[multiply\]: .* has no episodes to multiply|does not exist"):
        load_config(_job_file(tmp_path, tmp_path / "missing"))
    path = _job_file(tmp_path, narrow_source)
    path.write_text(path.read_text().replace("[job]\n", '[job]\ntask = "metaworld-push-v3"\n'))
    with pytest.raises(DaemonConfigError, match=r"\[multiply\]: .*holds episodes of task 'metaworld-reach-v3'"):
        load_config(path)
    assert not (tmp_path / "store").exists()


# ------------------------------------------------------------------------------------ inspect and edit
def test_source_episode_holds_when_any_segment_came_from_it():
    record = {"segments": [{"metadata": {"multiply": {"source_episode": 2}}},
                           {"metadata": {"multiply": {"source_episode": 5}}}, {"metadata": {}}]}
    facts = provenance_facts(record)
    for text, expected in (("source_episode == 5", True), ("source_episode == 3", False), ("source_episode != 3", True),
                           ("source_episode != 2", False), ("not source_episode == 2", False),
                           ("source_episode > 4", True), ("source_episode < 2", False),
                           ("source_episode == null", False), ("3 == source_episode", False)):
        assert parse_filter(text)(facts) is expected, text
    plain = provenance_facts({"segments": [{"name": "reach"}]})
    assert parse_filter("source_episode == null")(plain) and not parse_filter("source_episode >= 0")(plain)


@pytest.mark.slow
def test_inspect_shows_the_generation_rate_and_edit_keeps_episodes_by_source(uninterrupted, tmp_path):
    store, summary = uninterrupted
    shown = run_cli("inspect", str(store))
    assert shown.returncode == 0, shown.stderr
    rate = summary.split("generation: ")[1].split(" attempts succeeded")[0]  # "S/A", as multiply printed it
    assert f"generation (multiply): {rate} attempts succeeded" in shown.stdout
    report = json.loads(run_cli("inspect", "--json", str(store)).stdout)["generation"]
    assert f"{report['successes']}/{report['attempts']}" == rate and report["multiplied_episodes"] == 4
    dataset = tmp_path / "ds"
    assert run_cli("export", "--store", str(store), "--out", str(dataset)).returncode == 0
    assert "multiplied: 4 episode(s)" in run_cli("inspect", str(dataset)).stdout
    uses = [{s["metadata"]["multiply"]["source_episode"] for s in json.loads(line)["segments"]}
            for line in (dataset / "meta" / "demoforge_episodes.jsonl").read_text().splitlines()]
    kept = {}
    for name, expression in (("with", "source_episode == 0"), ("without", "source_episode != 0")):
        if not any((0 in u) == (name == "with") for u in uses):
            continue  # nothing to keep: edit refuses an empty result (tested in test_edit.py)
        out = tmp_path / name
        done = run_cli("edit", str(dataset), "--keep-where", expression, "--out", str(out))
        assert done.returncode == 0, done.stderr
        kept[name] = [{s["metadata"]["multiply"]["source_episode"] for s in json.loads(line)["segments"]}
                      for line in (out / "meta" / "demoforge_episodes.jsonl").read_text().splitlines()]
    assert kept and kept.get("with", []) == [u for u in uses if 0 in u]
    assert kept.get("without", []) == [u for u in uses if 0 not in u]
    bad = run_cli("edit", str(dataset), "--keep-where", 'source_episode == "0"', "--out", str(tmp_path / "bad"))
    assert bad.returncode == 2 and "cannot compare source_episode (a number) with" in bad.stderr
