"""The generation daemon as a real subprocess: metrics over HTTP, signals, restart, lock, config errors."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

from demoforge.pipeline.daemon_config import DaemonConfigError, load_config
from demoforge.pipeline.metrics import scrape as scrape_metrics
from demoforge.storage.lerobot.validate import validate_dataset
from demoforge.storage.store import open_store
from helpers import cli_env, daemon_events, demoforge_argv

pytestmark = pytest.mark.slow


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def write_job(tmp_path: Path, episodes="unbounded", step_sleep=0.01, every=5, extra="") -> tuple[Path, int]:
    port = free_port()
    episodes_toml = f'"{episodes}"' if isinstance(episodes, str) else str(episodes)
    path = tmp_path / "job.toml"
    path.write_text(f"""
[job]
task = "toy-point"
episodes = {episodes_toml}
options = {{ steps = 20, size = 32, step_sleep = {step_sleep} }}
[video]
codec = "h264"
[store]
dir = "store"
[export]
dir = "dataset"
every_episodes = {every}
every_seconds = 600
[metrics]
address = "127.0.0.1:{port}"
[disk]
min_free_mb = 1
check_seconds = 0.2
[shutdown]
deadline_seconds = 5
{extra}
""")
    return path, port


class Daemon(subprocess.Popen):
    """A daemon subprocess whose output goes to files (a full pipe would block it), read by communicate()."""

    out_path: Path
    err_path: Path

    def communicate(self, input=None, timeout=None):  # noqa: A002
        self.wait(timeout=timeout)
        return self.out_path.read_text(), self.err_path.read_text()


def start(job: Path, *args: str, **env: str) -> Daemon:
    out_path, err_path = job.parent / "daemon.out", job.parent / "daemon.err"
    with open(out_path, "w") as out, open(err_path, "w") as err:
        proc = Daemon(demoforge_argv("daemon", "--config", str(job), "--json-logs", *args), env=cli_env(**env),
                      stdin=subprocess.DEVNULL, stdout=out, stderr=err, text=True)
    proc.out_path, proc.err_path = out_path, err_path
    return proc


def scrape(port: int) -> dict[str, float]:
    return scrape_metrics(f"http://127.0.0.1:{port}/metrics")


def wait_for(predicate, timeout=180.0, every=0.25):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            value = predicate()
            if value:
                return value
        except (OSError, KeyError):
            pass
        time.sleep(every)
    raise AssertionError("condition not met in time")


def committed(store: Path) -> tuple[list, list]:
    with open_store(store) as view:
        return view.attempts(("committed", "exported")), view.attempts(("staging",))


def test_metrics_show_progress_and_sigterm_stops_gracefully(tmp_path):
    job, port = write_job(tmp_path)
    proc = start(job)
    try:
        first = wait_for(lambda: (m := scrape(port)).get("demoforge_episodes_committed_total", 0) >= 2 and m)
        later = wait_for(lambda: (m := scrape(port))["demoforge_episodes_committed_total"]
                         > first["demoforge_episodes_committed_total"] and m)
        assert later["demoforge_frames_total"] > first["demoforge_frames_total"]
        assert 'demoforge_queue_depth{queue="encode->write"}' in later
        assert later['demoforge_stage_busy_seconds{stage="encode"}'] > 0
        assert later['demoforge_stage_busy_seconds{stage="step"}'] > 0
        wait_for(lambda: scrape(port)["demoforge_exported_episodes"] >= 5)  # a periodic export happened
        status = subprocess.run(demoforge_argv("status", "--store", str(tmp_path / "store"), "--json"),
                                env=cli_env(), capture_output=True, text=True, timeout=60)
        # status works while the daemon runs, and counts what it has kept so far
        assert status.returncode == 0, status.stderr
        by_state = json.loads(status.stdout)["attempts_by_state"]
        assert by_state.get("committed", 0) + by_state.get("exported", 0) >= 5, by_state
        stopped_at = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    log = daemon_events(err)
    names = [e["event"] for e in log]
    assert names[0] == "started" and "stopping" in names and names[-1] == "stopped"
    final = next(e for e in log if e["event"] == "export" and e["why"] == "final")
    stopping = next(e["ts"] for e in log if e["event"] == "stopping")
    # The final export starts at the 5 s deadline, not when generation would have finished on its own (it
    # runs in a child process, whose start-up and work are its own ``seconds``); the margin is generous, for
    # a loaded machine: it catches a daemon that ignores its deadline, it measures nothing.
    assert final["ts"] - final["seconds"] - stopping <= 5 + 20
    assert time.monotonic() - stopped_at < 60
    rows, staging = committed(tmp_path / "store")
    assert not staging  # no partial episode left
    report = validate_dataset(tmp_path / "dataset")
    assert report.status == 0 and report.episodes == len(rows)  # the final export holds every committed episode


def test_sigkill_then_restart_resumes_and_keeps_every_committed_episode(tmp_path):
    job, port = write_job(tmp_path, episodes=12)
    proc = start(job)
    wait_for(lambda: scrape(port).get("demoforge_episodes_committed_total", 0) >= 3)
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=30)
    before = {r.episode_id: r.content_hash for r in committed(tmp_path / "store")[0]}
    assert len(before) >= 3
    proc = start(job)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    rows, staging = committed(tmp_path / "store")
    after = {r.episode_id: r.content_hash for r in rows}
    assert len(after) == 12 and not staging
    assert all(after[k] == v for k, v in before.items())
    assert validate_dataset(tmp_path / "dataset").episodes == 12


def test_second_daemon_on_the_same_store_is_refused(tmp_path):
    job, port = write_job(tmp_path)
    proc = start(job)
    try:
        wait_for(lambda: scrape(port).get("demoforge_attempts_total", 0) >= 1)
        second = subprocess.run(demoforge_argv("daemon", "--config", str(job), "--metrics-address", "off"),
                                env=cli_env(), capture_output=True, text=True, timeout=120)
        assert second.returncode == 2
        assert "another demoforge process is writing" in second.stderr
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 0


def test_second_signal_stops_at_once(tmp_path):
    job, port = write_job(tmp_path, step_sleep=0.05, extra="")
    # Episodes of 2,000 steps (100 s): the one in flight outlasts the test, so only the second signal can end it
    # (with 20 steps it could finish, and the daemon stop, before a loaded machine delivered the second signal).
    job.write_text(job.read_text().replace("deadline_seconds = 5", "deadline_seconds = 120")
                   .replace("steps = 20", "steps = 2000"))
    proc = start(job)
    try:
        wait_for(lambda: scrape(port).get('demoforge_stage_busy_seconds{stage="step"}', 0) > 0)
        proc.send_signal(signal.SIGTERM)
        # The first signal is being handled (the daemon said so) before the second is sent.
        wait_for(lambda: '"event": "stopping"' in proc.err_path.read_text())
        sent = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=110)
    finally:
        proc.kill()
    # At once: well before the 120 s deadline the first signal granted (a generous bound for a loaded machine).
    assert proc.returncode == 0 and time.monotonic() - sent < 100
    assert "stopping_now" in [e["event"] for e in daemon_events(err)]
    rows, staging = committed(tmp_path / "store")
    assert not staging


def test_low_disk_space_pauses_and_resumes_generation(tmp_path):
    job, port = write_job(tmp_path)
    job.write_text(job.read_text().replace("min_free_mb = 1", "min_free_mb = 500"))
    free = tmp_path / "free_mb"
    free.write_text("100")
    proc = start(job, DEMOFORGE_FREE_SPACE_FILE=str(free))
    try:
        wait_for(lambda: scrape(port)["demoforge_generation_paused"] == 1)
        held = scrape(port)["demoforge_episodes_committed_total"]
        time.sleep(2)
        assert scrape(port)["demoforge_episodes_committed_total"] <= held + 1  # at most the in-flight one
        free.write_text("100000")
        wait_for(lambda: scrape(port)["demoforge_generation_paused"] == 0)
        wait_for(lambda: scrape(port)["demoforge_episodes_committed_total"] > held + 2)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    names = [e["event"] for e in daemon_events(err)]
    assert "generation_paused" in names and "generation_resumed" in names


@pytest.mark.parametrize("body, message", [
    ('[job]\ntask = "toy-point"\nepisods = 3\n[store]\ndir = "s"\n', "unknown key job.episods"),
    ('[job]\ntask = "toy-point"\nepisodes = -1\n[store]\ndir = "s"\n', "episodes"),
    ('[job]\ntask = "toy-point"\n[store]\ndir = "s"\n[metrics]\naddress = "nowhere"\n', "metrics.address"),
    ('[job]\ntask = "toy-point"\n[stor]\ndir = "s"\n', "unknown section [stor]"),
    ('[job]\ntask = "toy-point"\nworkers = "two"\n[store]\ndir = "s"\n', "job.workers"),
    ('[job]\ntask = "toy-point"\noptions = { size = "big" }\n[store]\ndir = "s"\n', "size"),
    ('[job]\ntask = "toy-point"\n', "missing required key store.dir"),
    ('job = [\n', "not valid TOML"),
    ('[job]\ntask = "toy-point"\n[store]\ndir = "s"\n[control]\nnoise = "gaussian:-1"\n', "[control]: --noise"),
    ('[job]\ntask = "toy-point"\n[store]\ndir = "s"\n[control]\nnoise = "gaussian:0.1"\n',
     "[control]: --noise: the expert of task 'toy-point' cannot label states it did not choose"),
    ('[job]\ntask = "toy-point"\n[store]\ndir = "s"\n[control]\nnoyse = "gaussian:0.1"\n', "unknown key control.noyse"),
    ('[job]\ntask = "toy-point"\nencoder_process = "sometimes"\n[store]\ndir = "s"\n',
     'job.encoder_process must be true, false or "auto", got \'sometimes\''),
    ('[job]\ntask = "toy-point"\nencoder_priority = "low"\n[store]\ndir = "s"\n',
     'job.encoder_priority must be "auto", "normal" or "idle", got \'low\''),
    ('[job]\ntask = "toy-point"\nencoder_process = false\nencoder_priority = "idle"\n[store]\ndir = "s"\n',
     "the idle encoder priority needs the encoder process"),
])
def test_invalid_job_files_are_refused_naming_the_key(tmp_path, body, message):
    import toy_tasks  # noqa: F401

    path = tmp_path / "bad.toml"
    path.write_text(body)
    with pytest.raises(DaemonConfigError) as info:
        load_config(path)
    assert message in str(info.value)


def test_invalid_job_file_exits_2_naming_the_key(tmp_path):
    path = tmp_path / "bad.toml"
    path.write_text('[job]\ntask = "toy-point"\nepisods = 3\n[store]\ndir = "s"\n')
    result = subprocess.run(demoforge_argv("daemon", "--config", str(path)), env=cli_env(), capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 2 and "unknown key job.episods" in result.stderr
    assert not (tmp_path / "s").exists()  # nothing was created


def test_a_control_table_makes_a_policy_in_the_loop_job(tmp_path):
    path = tmp_path / "job.toml"
    path.write_text('[job]\ntask = "metaworld-push-v3"\noptions = { camera = "none", full_state = true }\n'
                    '[store]\ndir = "s"\n[control]\ndriver = "toy_policies:down"\nbeta = 0.5\n'
                    'takeover = "gap:0.5:3"\nnoise = "gaussian:0.1@grasp"\n')
    control = load_config(path).spec.control
    assert control is not None and control.driver == "toy_policies:down" and control.beta == 0.5
    assert control.takeover is not None and control.takeover.text() == "gap:0.5:3"
    assert control.noise is not None and control.noise.text() == "gaussian:0.1@grasp"


def test_example_job_file_in_docs_is_valid():
    config = load_config(Path(__file__).resolve().parent.parent / "docs" / "daemon.example.toml")
    assert config.spec.task == "fetch-pick-place" and config.export_dir is not None
    assert config.spec.encoder_process is None and config.spec.encoder_idle is None  # "auto", "auto"
