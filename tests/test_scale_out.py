"""Scale-out executors with real worker processes and a real multi-node Ray cluster: the same episodes as a
thread run, worker, node and driver kills, nodes joining, token authentication, backpressure, and bad input."""

from __future__ import annotations

import os
import re
import secrets
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
import time
import tracemalloc
from pathlib import Path

import psutil
import pytest

import noise_tasks  # noqa: F401  (registers toy-noise)
import toy_tasks  # noqa: F401  (registers toy-point)
from demoforge.pipeline.job import JobSpec, VideoSettings
from demoforge.pipeline.runner import JobRunner, run_job
from demoforge.pipeline.workers.config import ExecutorConfig
from demoforge.stages.executor import derive_seed
from demoforge.storage.catalog import Catalog
from demoforge.storage.store import open_store
from demoforge.storage.schema import AttemptState
from demoforge.storage.staging import VIDEO_SHARD_BYTES, staged_episode_ids
from helpers import attempt_marks_of, attempts_mid_episode, attempts_now, cli_env, demoforge_argv

# The Ray clusters live as long as this file's tests (conftest.ray_nodes, and conftest.ray_token_cluster for the
# authentication tests): the suite runs with `-n 2 --dist loadfile`, so every test of this file runs in one
# pytest-xdist worker, which starts them once and stops them when the file is done.
pytestmark = pytest.mark.slow

FETCH_ARGS = ("--task", "fetch-pick-place", "--option", "cycles=1", "--option", "image_size=64",
              "--option", "antialias=false", "--episodes", "3")
# Toy episodes of 60 steps x 20 ms: long enough that a kill lands mid-episode, short enough for the suite.
TOY_EPISODES = 6
TOY_ARGS = ("--task", "toy-point", "--episodes", str(TOY_EPISODES), "--codec", "h264", "--option", "steps=60",
            "--option", "step_sleep=0.02", "--option", "fail_every=3")
# The commit stage is slowed so a lost attempt's discard is still queued when its re-run could start: a re-run
# released before the discard finished would collide with the dead attempt's catalog row and staging folder.
SLOW_COMMIT = "commit:0.3"


def identity(store: Path) -> list[tuple]:
    with open_store(store) as view:
        return [(r.episode_index, r.attempt, r.seed, r.frames, r.content_hash) for r in view.committed()]


def check_store(store: Path) -> Catalog:
    """No attempt left staging, no staged folder without a committed row, every committed episode verifies."""
    with open_store(store) as view:
        assert not view.attempts((AttemptState.STAGING,))
        assert set(staged_episode_ids(store)) == {r.episode_id for r in view.committed()}
        assert view.verify().ok
    return Catalog.open_read_only(store)


def thread_run(store: Path, *args: str) -> list[tuple]:
    """The reference: a thread-executor run in a fresh process. (In a process that has already encoded with
    another codec, the thread executor's encoders can produce different bytes: after an in-process AV1 run,
    the next h264 run's first episodes differed; a fresh process per reference run sidesteps that.)"""
    done = subprocess.run(demoforge_argv("generate", *args, "--store", str(store)), env=cli_env(),
                          capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stderr
    return identity(store)


@pytest.fixture(scope="module")
def toy_clean(tmp_path_factory) -> list[tuple]:
    return thread_run(tmp_path_factory.mktemp("clean") / "store", *TOY_ARGS)


class Generate:
    """`demoforge generate` in a subprocess, its stderr collected line by line (worker pids are read from it)."""

    def __init__(self, *args: str, **env: str | None) -> None:
        self.proc = subprocess.Popen(demoforge_argv("generate", *args), env=cli_env(**env), stdin=subprocess.DEVNULL,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.lines.append(line)

    def worker_pids(self, count: int, timeout: float = 120) -> list[int]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            pids = [int(m.group(1)) for line in list(self.lines) if (m := re.search(r"pid (\d+)\) ready", line))]
            if len(pids) >= count:
                return pids
            assert self.proc.poll() is None, "".join(self.lines)
            time.sleep(0.05)
        raise AssertionError(f"{count} workers not ready: {''.join(self.lines)}")

    def finish(self, timeout: float = 300) -> tuple[int, str, str]:
        self.proc.wait(timeout=timeout)  # stdout holds a few lines: its pipe never fills
        assert self.proc.stdout is not None
        out = self.proc.stdout.read()
        self._reader.join(timeout=10)
        return self.proc.returncode, out, "".join(self.lines)


def wait_mid_episode(store: Path, worker: int | None = None, timeout: float = 120,
                     job: subprocess.Popen[str] | None = None) -> bool:
    """Until an episode is committed and an attempt (of ``worker``, if given) is in the middle of its episode: its
    first frame reached the write stage and its end has not (the job runs with ``DEMOFORGE_ATTEMPT_MARKS``).
    True at that moment; False if ``job`` ended first (a short job on a loaded machine can finish between two
    looks); a job still running without such a moment is an error."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        running = set(attempts_mid_episode(store).values())
        if (running if worker is None else worker in running) and committed_count(store):
            return True
        if job is not None and job.poll() is not None:
            return False
        time.sleep(0.02)
    raise AssertionError("no attempt in flight within the timeout")


def committed_count(store: Path) -> int:
    if not (store / "catalog.sqlite").exists():
        return 0
    db = sqlite3.connect(store / "catalog.sqlite", timeout=30)
    try:
        return db.execute("SELECT COUNT(*) FROM attempts WHERE state = 'committed'").fetchone()[0]
    except sqlite3.OperationalError:  # the schema is not written yet
        return 0
    finally:
        db.close()


def gone(pids: list[int], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not any(psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE for p in pids):
            return True
        time.sleep(0.1)
    return False


def executor_args(kind: str, ray_address: str | None, workers: int = 2) -> tuple[str, ...]:
    args = ("--executor", kind, "--workers", str(workers))
    if kind == "ray":
        assert ray_address is not None, "the Ray executor's tests join the session's cluster"
        return args + ("--ray-address", ray_address)
    return args


def machine_with_token(tmp_path: Path, token: str | None = None) -> dict[str, str | None]:
    """A driver's environment on a machine whose ~/.ray/auth_token exists (any local `ray start` or local Ray
    leaves one) and no RAY_AUTH_* setting: HOME is a folder of the test's (caches stay where they were)."""
    home = tmp_path / "home"
    (home / ".ray").mkdir(parents=True, exist_ok=True)
    (home / ".ray" / "auth_token").write_text(token or secrets.token_hex(16))
    return {"HOME": str(home), "XDG_CACHE_HOME": os.environ.get("XDG_CACHE_HOME", str(Path.home() / ".cache")),
            "RAY_AUTH_MODE": None, "RAY_AUTH_TOKEN": None, "RAY_AUTH_TOKEN_PATH": None}


def machine_without_token(tmp_path: Path) -> dict[str, str | None]:
    home = tmp_path / "bare-home"
    home.mkdir(parents=True, exist_ok=True)
    return {"HOME": str(home), "XDG_CACHE_HOME": os.environ.get("XDG_CACHE_HOME", str(Path.home() / ".cache")),
            "RAY_AUTH_MODE": None, "RAY_AUTH_TOKEN": None, "RAY_AUTH_TOKEN_PATH": None}


def slot_of(lines: list[str], pid: int) -> int:
    found = re.search(rf"worker (\d+) \([^)]*pid {pid}\)", "".join(lines))
    assert found, f"no worker line names pid {pid}"
    return int(found.group(1))


# ------------------------------------------------------------------------------------------ equality
def test_ray_actors_commit_what_a_thread_run_commits(tmp_path, ray_cluster):
    # Process workers are held to the same identity by the kill tests below (a toy task against a clean thread
    # run) and by the ALOHA insertion and SO-101 jobs; Ray's actors are processes too, so this also shows
    # MuJoCo and AV1 giving the same bytes in another process.
    from demoforge.storage.lerobot.validate import validate_dataset

    expected = thread_run(tmp_path / "thread", *FETCH_ARGS)
    assert len(expected) == 3
    store, dataset = tmp_path / "ray", tmp_path / "ray-dataset"
    # The session's cluster has no token authentication and this machine has a token file: the driver joins as
    # the cluster requires (without a token), not as the file suggests.
    run = Generate(*FETCH_ARGS, "--store", str(store), "--export", str(dataset),
                   *executor_args("ray", ray_cluster), **machine_with_token(tmp_path))
    code, out, err = run.finish()
    assert code == 0, err
    assert len(run.worker_pids(2)) == 2
    assert "no authentication (the cluster asks for none)" in err and "2 node(s)" in err, err
    # Same episode, attempt, seed, frame count and content hash (numbers and AV1 bytes) as the thread run.
    assert identity(store) == expected
    check_store(store).close()
    report = validate_dataset(dataset)
    assert report.status == 0, report.to_json()


@pytest.mark.campaign  # the suite checks a suite job across processes in test_metaworld
def test_a_suite_job_gives_ray_actors_the_episodes_of_a_thread_run(tmp_path, ray_cluster):
    """A suite's member task is chosen by the episode index in every process: Ray actors commit what threads do."""
    args = ("--task", "metaworld-very-hard", "--episodes", "1", "--option", "camera=none", "--max-attempts", "5")
    expected = thread_run(tmp_path / "thread", *args)
    store = tmp_path / "ray"
    done = subprocess.run(demoforge_argv("generate", *args, "--store", str(store), *executor_args("ray", ray_cluster)),
                          env=cli_env(**machine_with_token(tmp_path)), capture_output=True, text=True, timeout=300,
                          stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stderr
    assert identity(store) == expected and len(expected) > 1


# ------------------------------------------------------------------------------------------ kills
# The Ray variants of the two kill tests are campaign tests (tools/campaign_tests.sh), as are Ray's policy-driven
# and suite jobs: the suite kills process workers and their driver, and runs Ray actors for equality, a worker
# that cannot start or import its task, and a token cluster.
RAY_KILLS = pytest.param("ray", marks=pytest.mark.campaign)


@pytest.mark.parametrize("kind", ["process", RAY_KILLS])
def test_a_killed_worker_loses_nothing_and_its_attempt_is_rerun(tmp_path, ray_cluster, toy_clean, kind):
    for run_number in range(3):  # a fresh job when this one ended before the victim was seen mid-episode
        store = tmp_path / f"store-{run_number}"
        run = Generate(*TOY_ARGS, "--store", str(store), *executor_args(kind, ray_cluster),
                       DEMOFORGE_STAGE_DELAY=SLOW_COMMIT, DEMOFORGE_ATTEMPT_MARKS=str(attempt_marks_of(store)),
                       **machine_with_token(tmp_path))
        victim = run.worker_pids(2)[0]  # worker 0 is the first to report ready, or worker 1: read its slot
        slot = slot_of(run.lines, victim)
        if wait_mid_episode(store, worker=slot, job=run.proc):
            break
        assert run.finish()[0] == 0, "".join(run.lines)
    else:
        raise AssertionError("three jobs ended before their victim worker was seen mid-episode")
    os.kill(victim, signal.SIGKILL)
    code, out, err = run.finish()
    assert code == 0, err
    assert "replaces a lost worker" in err and "its in-flight attempt is discarded and re-run" in err, err
    assert identity(store) == toy_clean  # nothing lost, nothing duplicated, same bytes
    catalog = check_store(store)
    lost = [r for r in catalog.attempts(("discarded",)) if r.terminal_reason == "interrupted"]
    catalog.close()
    assert lost and all(not r.counted and "is gone" in (r.reason or "") for r in lost)
    # The lost attempt was re-run with its own number and seed (not counted as a failure).
    assert {(r.episode_index, r.attempt) for r in lost} <= {(e[0], a) for e in toy_clean for a in range(e[1] + 1)}


@pytest.mark.parametrize("kind", ["process", RAY_KILLS])
def test_a_killed_driver_takes_its_workers_along_and_resumes(tmp_path, ray_cluster, toy_clean, kind):
    store = tmp_path / "store"
    args = (*TOY_ARGS, "--store", str(store), *executor_args(kind, ray_cluster))
    run = Generate(*args, DEMOFORGE_ATTEMPT_MARKS=str(attempt_marks_of(store)), **machine_with_token(tmp_path))
    workers = run.worker_pids(2)
    assert wait_mid_episode(store, job=run.proc), "the job ended before an attempt was seen mid-episode"
    run.proc.send_signal(signal.SIGKILL)
    run.finish(timeout=30)
    assert gone(workers, timeout=30), f"{kind} workers outlived their driver"
    resumed = Generate(*args, **machine_with_token(tmp_path))
    code, out, err = resumed.finish()
    assert code == 0, err
    # Recovery discards what the dead driver had in flight (its workers' attempts and any awaiting commit).
    cleaned = re.search(r"recovery: discarded (\d+) interrupted attempt", out)
    assert cleaned and int(cleaned.group(1)) >= 1, out
    assert identity(store) == toy_clean
    check_store(store).close()


# ------------------------------------------------------------------------------------------ nodes lost and joining
def wait_for_line(run: Generate, pattern: str, timeout: float = 120) -> re.Match:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for line in list(run.lines):
            if m := re.search(pattern, line):
                return m
        assert run.proc.poll() is None, "".join(run.lines)
        time.sleep(0.05)
    raise AssertionError(f"no line matching {pattern!r}: {''.join(run.lines)}")


@pytest.mark.campaign
def test_a_lost_node_leaves_the_job_to_the_workers_left(tmp_path, ray_cluster, ray_nodes, toy_clean):
    """Two nodes of one CPU, two actors: the node of one of them is lost mid-episode. Its attempt is re-run
    on the other worker, the replacement cannot be placed (no CPU left) and the job says so, carries on,
    and ends at its target with exit 0, without waiting for the replacement."""
    store = tmp_path / "store"
    # Slower steps (no byte of an episode changes) leave the one worker left episodes to run for some seconds
    # after the loss, long enough for the line saying the replacement waits for room.
    run = Generate(*TOY_ARGS, "--option", "step_sleep=0.04", "--store", str(store),
                   *executor_args("ray", ray_cluster), DEMOFORGE_STAGE_DELAY=SLOW_COMMIT,
                   DEMOFORGE_ATTEMPT_MARKS=str(attempt_marks_of(store)), **machine_with_token(tmp_path))
    pids = run.worker_pids(2)
    (victim,) = set(pids) & set(ray_nodes.pids())  # the actor on the node besides the head
    slot = slot_of(run.lines, victim)
    assert wait_mid_episode(store, worker=slot, job=run.proc), \
        "the job ended before its victim was seen mid-episode"
    ray_nodes.remove_node()
    lost_at = time.monotonic()
    code, out, err = run.finish()
    assert code == 0, err
    assert time.monotonic() - lost_at < 150, "the job waited for a replacement it could not place"
    assert f"worker {slot} (Ray actor, pid {victim}) on " in err and "is gone" in err, err
    assert "its in-flight attempt is discarded and re-run" in err, err
    assert re.search(rf"worker {slot} waits for room: the cluster has 0 of \d+ CPUs free and a worker needs 1 "
                     r"\(--cpus-per-worker\); the job carries on with 1 of 2 worker\(s\) running", err), err
    assert "Traceback" not in err
    assert identity(store) == toy_clean  # exactly the target, nothing lost or duplicated, the same bytes
    catalog = check_store(store)
    lost = [r for r in catalog.attempts(("discarded",)) if r.terminal_reason == "interrupted"]
    ran = {r.worker for r in catalog.attempts()}
    catalog.close()
    assert lost and all(r.worker == slot and not r.counted and "is gone" in (r.reason or "") for r in lost)
    assert ran == {0, 1}


@pytest.mark.campaign
def test_a_node_that_joins_mid_run_gets_a_worker(tmp_path, ray_nodes, toy_clean):
    """The head alone has room for one of two actors: the job runs with one and says so; a node that joins
    mid-run gets the second, which takes episodes."""
    ray_nodes.resize(0)
    store = tmp_path / "store"
    # Slower steps (the sleep changes no byte of an episode) leave the second worker episodes to take after
    # its node has started, however loaded the machine.
    run = Generate(*TOY_ARGS, "--option", "step_sleep=0.08", "--store", str(store),
                   *executor_args("ray", ray_nodes.address), **machine_with_token(tmp_path))
    first = int(wait_for_line(run, r"worker (\d+) \(Ray actor, pid \d+\) ready on .*\(1 of 2 worker").group(1))
    waiting = int(wait_for_line(run, r"worker (\d+) waits for room: .*the job carries on with 1 of 2").group(1))
    assert {first, waiting} == {0, 1}
    ray_nodes.add_node()
    joined = wait_for_line(run, rf"worker {waiting} \(Ray actor, pid (\d+)\) ready on .*, joining the run \(2 of 2")
    placed_on = ray_nodes.pids()  # while the run goes on (its actors end with it)
    code, out, err = run.finish()
    assert code == 0, err
    assert int(joined.group(1)) in placed_on, err
    assert identity(store) == toy_clean
    catalog = check_store(store)
    ran = [r for r in catalog.attempts() if r.worker == waiting]
    catalog.close()
    assert ran, "the worker on the node that joined ran nothing"


def test_no_room_for_any_worker_exits_1_and_touches_nothing(tmp_path, ray_cluster):
    store = tmp_path / "store"
    done = subprocess.run(demoforge_argv("generate", *TOY_ARGS, "--store", str(store), "--executor", "ray",
                                         "--ray-address", ray_cluster, "--cpus-per-worker", "8",
                                         "--start-timeout", "4"),
                          env=cli_env(**machine_with_token(tmp_path)), capture_output=True, text=True, timeout=300)
    assert done.returncode == 1, done.stderr
    assert "no worker could be started within 4 s (--start-timeout): the cluster has 2 of 2 CPUs free and a " \
           "worker needs 8 (--cpus-per-worker). Nothing was written" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr and "token" not in done.stderr and not store.exists()


@pytest.mark.parametrize("kind", ["process", "ray"])
def test_a_worker_that_dies_while_starting_says_why(tmp_path, ray_cluster, kind):
    from noise_tasks import CRASH_MESSAGE

    store = tmp_path / "store"
    done = subprocess.run(demoforge_argv("generate", "--task", "toy-crash-start", "--episodes", "1", "--store",
                                         str(store), "--codec", "h264", *executor_args(kind, ray_cluster, 1)),
                          env=cli_env(DEMOFORGE_TASK_MODULES="toy_tasks,noise_tasks", **machine_with_token(tmp_path)),
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 2, done.stderr
    if kind == "ray":  # Ray's cause of death and the actor's last stderr line, not a bare ActorDiedError
        assert "worker 0 (Ray actor) died while starting: ActorDiedError" in done.stderr, done.stderr
        assert "The actor is dead because its worker process has died" in done.stderr, done.stderr
        assert f"its stderr ended with: {CRASH_MESSAGE}" in done.stderr, done.stderr
    else:  # the process's own stderr is the driver's
        assert "exit status 3 before it was ready" in done.stderr and CRASH_MESSAGE in done.stderr, done.stderr
    assert "Traceback" not in done.stderr and not store.exists()


# ------------------------------------------------------------------------------------------ token authentication
def test_a_token_cluster_is_joined_with_this_machines_token(tmp_path, ray_token_cluster):
    store = tmp_path / "store"
    token = ray_token_cluster.token_file.read_text()
    run = Generate("--task", "toy-point", "--episodes", "2", "--codec", "h264", "--store", str(store),
                   *executor_args("ray", ray_token_cluster.address, 1), **machine_with_token(tmp_path, token))
    code, out, err = run.finish()
    assert code == 0, err
    assert "token authentication (token from ~/.ray/auth_token)" in err, err
    assert len(identity(store)) == 2
    check_store(store).close()


@pytest.mark.parametrize("token, message", [
    (None, "uses token authentication and this machine has no token: run `ray get-auth-token` on the head node"),
    ("0" * 32, "refused this machine's token (from ~/.ray/auth_token): it is not the cluster's token; run "
               "`ray get-auth-token`"),
])
def test_a_token_cluster_refuses_a_machine_without_its_token(tmp_path, ray_token_cluster, token, message):
    store = tmp_path / "store"
    env = machine_with_token(tmp_path, token) if token else machine_without_token(tmp_path)
    done = subprocess.run(demoforge_argv("generate", "--task", "toy-point", "--episodes", "1", "--store", str(store),
                                         *executor_args("ray", ray_token_cluster.address, 1)),
                          env=cli_env(**env), capture_output=True, text=True, timeout=300)
    assert done.returncode == 2, done.stderr
    # The message is the driver's own check of the token, made before it asks Ray to connect (whose refusal
    # comes after 20 s of retries and names no token).
    assert f"the Ray cluster at {ray_token_cluster.address} {message}" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr and not store.exists()


# ------------------------------------------------------------------------------------------ backpressure
@pytest.mark.campaign
def test_a_slow_writer_slows_the_workers_and_memory_stays_bounded(tmp_path, monkeypatch) -> None:
    """The driver's writer sleeps per frame: workers block on their in-flight limit, nothing is dropped, and
    neither the driver's Python heap nor a worker's RSS grows with what the run produces."""
    delay = 0.005
    monkeypatch.setenv("DEMOFORGE_STAGE_DELAY", f"write:{delay}")
    size, steps, episodes, workers = 128, 250, 16, 2
    config = ExecutorConfig(kind="process", workers=workers, max_in_flight=2, batch_frames=8)
    spec = JobSpec(task="toy-noise", episodes=episodes, task_options={"size": size, "steps": steps},
                   video=VideoSettings(codec="h264", crf=10), queue_frames=8)
    pids: list[int] = []
    rss: dict[int, list[int]] = {}
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            for pid in list(pids):
                try:
                    rss.setdefault(pid, []).append(psutil.Process(pid).memory_info().rss)
                except psutil.Error:
                    pass
            time.sleep(0.1)

    def on_event(line: str) -> None:
        if m := re.search(r"pid (\d+)\) ready", line):
            pids.append(int(m.group(1)))

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    runner = JobRunner(spec, tmp_path / "store", executor=config, on_event=on_event)
    import anyio

    tracemalloc.start()
    started = time.monotonic()
    try:
        report = anyio.run(runner.run)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
        done.set()
        sampler.join()
    elapsed = time.monotonic() - started
    produced = steps * episodes
    assert report.frames_this_run == produced and report.committed_total == episodes  # nothing dropped
    assert elapsed >= produced * delay  # the writer paced the run
    with open_store(tmp_path / "store") as view:
        encoded = sum(sum(r.video_bytes.values()) for r in view.committed())
    per_frame = encoded / produced
    # What the driver may hold: two queues of queue_frames records plus, per worker, the pieces in flight
    # (max_in_flight + the one being forwarded) of batch_frames frames (x2 for per-record overhead); the
    # write stage's buffers of each attempt being written (staging writes whole shards: up to one video shard
    # per camera buffered, with its growth slack, plus the copy being written); 2 MiB for the rest.
    held_frames = 2 * spec.queue_frames + workers * (config.max_in_flight + 1) * config.batch_frames
    bound = held_frames * per_frame * 2 + workers * 3 * VIDEO_SHARD_BYTES + (2 << 20)
    assert peak < bound, f"driver peak {peak / 2**20:.1f} MiB > bound {bound / 2**20:.1f} MiB"
    assert encoded > 2 * bound, "the run must produce far more than the bound for the check to mean anything"
    print(f"driver peak {peak / 2**20:.1f} MiB, bound {bound / 2**20:.1f} MiB, encoded {encoded / 2**20:.1f} MiB")
    assert len(rss) == workers
    for pid, samples in rss.items():
        # After its first episode a worker's memory is flat: it never holds more than its in-flight pieces.
        settled = samples[len(samples) // 4:]
        growth = max(settled) - settled[0]
        print(f"worker {pid}: RSS {settled[0] / 2**20:.0f} -> max {max(settled) / 2**20:.0f} MiB")
        assert growth < 32 << 20, f"worker {pid} grew by {growth / 2**20:.1f} MiB"


def test_stop_discards_in_flight_attempts_of_remote_workers_and_keeps_committed(tmp_path):
    import threading

    import anyio

    from demoforge.storage.schema import AttemptState

    # Episodes of 2 s: a worker sends a piece every 0.5 s, so an attempt is staged long before it ends.
    spec = JobSpec(task="toy-point", episodes=40, task_options={"step_sleep": 0.01, "steps": 200},
                   video=VideoSettings(codec="h264"))
    runner = JobRunner(spec, tmp_path / "store", executor=ExecutorConfig(kind="process", workers=2))
    done = threading.Event()

    def stop_with_an_attempt_staged() -> None:
        # Stop once 2 episodes are committed and an attempt is in flight (staged in the catalog): the state the
        # test is about, waited for (not timed).
        while not done.is_set():
            rows = attempts_now(tmp_path / "store")
            committed = sum(r.state == AttemptState.COMMITTED for r in rows)
            if committed >= 2 and any(r.state == AttemptState.STAGING for r in rows):
                runner.stop()
                return
            done.wait(0.05)

    watcher = threading.Thread(target=stop_with_an_attempt_staged, daemon=True)
    watcher.start()
    try:
        report = anyio.run(runner.run)
    finally:
        done.set()
        watcher.join()
    assert report.interrupted and 2 <= report.committed_total < 40
    catalog = check_store(tmp_path / "store")
    discarded = catalog.attempts(("discarded",))
    committed = catalog.attempts(("committed",))
    catalog.close()
    assert len(committed) == report.committed_total
    assert discarded and all(r.terminal_reason == "interrupted" and not r.counted for r in discarded)


# ------------------------------------------------------------------------------------------ hung worker
def test_a_hung_worker_is_replaced_and_its_attempt_fails_like_a_hung_thread(tmp_path):
    from noise_tasks import STALL_SEED

    assert STALL_SEED == derive_seed(0, 1, 0)
    # The stalled worker never answers: the job finishing at all is the watchdog's doing (the reason below).
    report = run_job(JobSpec(task="toy-stall", episodes=4, video=VideoSettings(codec="h264"), step_timeout_s=1.0),
                     tmp_path / "store", executor=ExecutorConfig(kind="process", workers=2))
    assert report.committed_total == 4 and report.discarded == {"error": 1}
    catalog = check_store(tmp_path / "store")
    attempts = catalog.attempts()
    catalog.close()
    (hung,) = [r for r in attempts if r.state == "discarded"]
    assert (hung.episode_index, hung.attempt, hung.counted) == (1, 0, True)
    assert hung.reason is not None and "did not return within 1 s" in hung.reason
    assert [r.attempt for r in attempts if r.episode_index == 1 and r.state == "committed"] == [1]


# ------------------------------------------------------------------------------------------ bad input
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("args, message", [
    (("--executor", "spark"), "invalid choice: 'spark'"),
    (("--executor", "process", "--workers", "0"), "number of workers (--workers) must be an integer in [1, 1024]"),
    (("--executor", "ray", "--workers", "0"), "number of workers (--workers) must be an integer in [1, 1024]"),
    (("--executor", "thread", "--ray-address", "127.0.0.1:6379"), "use --executor ray"),
])
def test_bad_executor_settings_exit_2_and_touch_nothing(tmp_path, args, message):
    store = tmp_path / "store"
    done = subprocess.run(demoforge_argv("generate", "--task", "toy-point", "--episodes", "1", "--store", str(store),
                                         *args), env=cli_env(), capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and message in done.stderr, done.stderr
    assert "Traceback" not in done.stderr and not store.exists()


def test_an_unreachable_ray_address_fails_fast_and_touches_nothing(tmp_path):
    store = tmp_path / "store"
    done = subprocess.run(demoforge_argv("generate", "--task", "toy-point", "--episodes", "1", "--store", str(store),
                                         "--executor", "ray", "--ray-address", f"127.0.0.1:{_free_port()}"),
                          env=cli_env(), capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    # The driver's own probe of the address answers (Ray's connect would retry first and say something else).
    assert "no Ray cluster is reachable at 127.0.0.1:" in done.stderr and "ray start --head" in done.stderr
    assert "Traceback" not in done.stderr and "token" not in done.stderr and not store.exists()


def test_without_ray_installed_the_ray_executor_says_how_to_install_it(tmp_path):
    store = tmp_path / "store"
    code = ("import sys; sys.modules['ray'] = None; from demoforge.pipeline.cli import main; "
            f"sys.exit(main(['generate', '--task', 'toy-point', '--episodes', '1', '--store', {str(store)!r}, "
            "'--executor', 'ray']))")
    done = subprocess.run([sys.executable, "-c", code], env=cli_env(), capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    assert "needs Ray, which is not installed" in done.stderr and "pip install 'demoforge[ray]'" in done.stderr
    assert "Traceback" not in done.stderr and not store.exists()


def test_a_task_the_workers_cannot_import_is_named(tmp_path, ray_cluster):
    """A task plugin installed on the driver only: the Ray workers cannot import it."""
    plugins = tmp_path / "driver_only"
    plugins.mkdir()
    (plugins / "driver_only_task.py").write_text(
        "from demoforge.pipeline.tasks.registry import TaskEntry, register\n"
        "from toy_tasks import DEFAULTS, CameraPointEnv, describe\n"
        "register(TaskEntry(name='driver-only', defaults=DEFAULTS, describe=describe,\n"
        "                   make_env=lambda o: CameraPointEnv(dict(o))))\n")
    env = cli_env(DEMOFORGE_TASK_MODULES="toy_tasks,driver_only_task")
    env["PYTHONPATH"] = os.pathsep.join([str(plugins), env["PYTHONPATH"]])
    store = tmp_path / "store"
    done = subprocess.run(demoforge_argv("generate", "--task", "driver-only", "--episodes", "1", "--store", str(store),
                                         "--codec", "h264", "--executor", "ray", "--ray-address", ray_cluster),
                          env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2, done.stderr
    assert "cannot import task 'driver-only'" in done.stderr and "driver_only_task" in done.stderr
    assert "Install the project and the task's plugin on every worker machine" in done.stderr
    assert "Traceback" not in done.stderr and not store.exists()


# ------------------------------------------------------------------------------------------ daemon job file
def _job_file(tmp_path: Path, job_extra: str, tail: str = "") -> Path:
    path = tmp_path / "job.toml"
    path.write_text(f'[job]\ntask = "toy-point"\nepisodes = 2\n{job_extra}\n[store]\ndir = "store"\n'
                    f'[metrics]\naddress = "off"\n{tail}')
    return path


def test_the_daemon_job_file_chooses_the_executor(tmp_path):
    from demoforge.pipeline.daemon_config import load_config

    config = load_config(_job_file(tmp_path, 'executor = "ray"\nworkers = 2',
                                   '[ray]\naddress = "head:6379"\nnum_workers = 100\ncpus_per_worker = 0.5\n'
                                   'start_timeout_seconds = 30\n'))
    assert config.executor == ExecutorConfig(kind="ray", workers=100, ray_address="head:6379", cpus_per_worker=0.5,
                                             start_timeout_s=30)
    assert load_config(_job_file(tmp_path, 'executor = "process"\nworkers = 3')).executor == \
        ExecutorConfig(kind="process", workers=3)
    assert load_config(_job_file(tmp_path, "")).executor == ExecutorConfig()


@pytest.mark.parametrize("job_extra, tail, message", [
    ('executor = "spark"', "", "unknown executor 'spark'"),
    ('executor = "process"\nworkers = 0', "", "number of workers (--workers) must be"),
    ('executor = "ray"', "[ray]\nnum_workers = 0\n", "number of workers (--workers) must be"),
    ('executor = "thread"', '[ray]\naddress = "auto"\n', "a [ray] section is set but job.executor is 'thread'"),
    ('executor = "ray"', "[ray]\ncpus = 2\n", "unknown key ray.cpus"),
    ('executor = "ray"', "[ray]\nstart_timeout_seconds = 0\n", "start timeout (--start-timeout) must be in"),
])
def test_bad_executor_settings_in_the_job_file_are_named(tmp_path, job_extra, tail, message):
    from demoforge.pipeline.daemon_config import DaemonConfigError, load_config

    with pytest.raises(DaemonConfigError) as info:
        load_config(_job_file(tmp_path, job_extra, tail))
    assert message in str(info.value)


@pytest.mark.campaign  # the suite checks policy-driven process workers against threads (test_policy_loop)
def test_ray_actors_make_the_same_policy_driven_episodes_as_threads(tmp_path, ray_cluster) -> None:
    """A policy drives (the expert takes over by its rule) with noise on top: two Ray actors commit exactly the
    episodes one thread does for the same seeds (the policy is loaded in each actor; the noise and the takeover
    depend on the attempt alone)."""
    args = ("--task", "metaworld-push-v3", "--option", "camera=none", "--option", "full_state=true",
            "--episodes", "3", "--driver", "toy_policies:down", "--takeover", "gap:0.5:3", "--noise", "gaussian:0.05")
    hashes = []
    for kind in ("thread", "ray"):
        store = tmp_path / kind
        done = subprocess.run(demoforge_argv("generate", *args, "--store", str(store),
                                             *(executor_args("ray", ray_cluster) if kind == "ray" else ())),
                              env=cli_env(**machine_with_token(tmp_path)), capture_output=True, text=True,
                              timeout=600, stdin=subprocess.DEVNULL)
        assert done.returncode == 0, done.stderr
        catalog = check_store(store)
        hashes.append(sorted((r.episode_index, r.attempt, r.content_hash, (r.record or {}).get("interventions"))
                             for r in catalog.committed()))
        catalog.close()
    assert hashes[0] == hashes[1] and all(h[3] for h in hashes[0]), hashes


# ------------------------------------------------------------------------------------------ the worker's encoders
def test_an_encoder_failure_in_a_worker_fails_that_attempt_and_the_next_one_encodes_afresh(monkeypatch):
    """A remote worker encodes through its own RecordEncoder, as env threads do. An encoder that raises mid-attempt ends
    that attempt as an error naming the worker (its frames never reach the driver), the lanes are replaced, and
    the next attempt's frames and video tail come whole from fresh encoders (their bytes decode to every frame)."""
    from demoforge.pipeline.workers.episode_worker import EpisodeWorker, WorkerSpec
    from demoforge.stages.recipe import WorkerRecipe
    from demoforge.stages import camera_encoder
    from demoforge.stages.records import AttemptEnded, EncodedFrame, VideoTail
    from helpers import decode_frames

    real, calls = camera_encoder.CameraEncoder.encode, {"n": 0}

    def failing(self, image):
        calls["n"] += 1
        if calls["n"] == 5:  # the first attempt's fifth frame
            raise camera_encoder.EncoderError("camera 'cam' frame 4: simulated encoder failure")
        return real(self, image)

    monkeypatch.setattr(camera_encoder.CameraEncoder, "encode", failing)
    options = {**toy_tasks.DEFAULTS, "steps": 12}
    info = toy_tasks.describe(options)
    recipe = WorkerRecipe(task="toy-point", job_seed=0, max_attempts=3, video=VideoSettings(codec="h264"),
                          cameras=info.cameras, fps=info.fps)
    worker = EpisodeWorker(WorkerSpec(recipe, task_options=options, batch_frames=4))
    try:
        records = [r for piece in worker.run_lease(0, 0) for r in piece.records]
    finally:
        worker.close()
    ended = [r for r in records if isinstance(r, AttemptEnded)]
    assert [(e.key.attempt, e.result.terminal_reason.value) for e in ended] == [(0, "error"), (1, "success")]
    error = ended[0].result.error
    assert error is not None and "raised EncoderError" in error and "simulated encoder failure" in error
    first = [r for r in records if isinstance(r, EncodedFrame) and r.key.attempt == 0]
    assert ended[0].frames == len(first) < 5  # only frames encoded before the failure reached the driver
    second = [r for r in records if isinstance(r, EncodedFrame) and r.key.attempt == 1]
    (tail,) = [r for r in records if isinstance(r, VideoTail)]
    assert tail.key.attempt == 1 and len(second) == ended[1].frames == 12
    video = b"".join(f.video["cam"] for f in second) + tail.video["cam"]
    assert len(decode_frames(video)) == 12 and tail.stats["cam"]["count"].tolist() == [12]
