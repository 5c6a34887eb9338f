"""Faults the pipeline must survive: a hanging env, NaN observations, a catalog killed mid-transaction."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

import toy_tasks
from demoforge.pipeline.job import JobSpec, VideoSettings
from demoforge.pipeline.runner import run_job
from demoforge.pipeline.tasks.registry import TaskEntry, registered
from demoforge.stages.contract import RecordedObservation
from demoforge.stages.executor import derive_seed
from demoforge.storage.catalog import Catalog
from demoforge.storage.store import open_store
from helpers import committed_files

H264 = VideoSettings(codec="h264")
HANG_SEED = derive_seed(0, 1, 0)  # episode 1, attempt 0 hangs


class HangingEnv(toy_tasks.CameraPointEnv):
    def step(self, action):
        if self._seed == HANG_SEED and self.t == 5:
            time.sleep(3600)  # never returns within the test: the watchdog must give up on it
        return super().step(action)


class NaNObservationEnv(toy_tasks.CameraPointEnv):
    def demo_record(self, observation):
        rec = super().demo_record(observation)
        if self._seed == derive_seed(0, 0, 0) and self.t == 3:
            return RecordedObservation(state={"observation.state": np.array([np.nan, 0], np.float32)},
                                       images=rec.images)
        return rec


@pytest.fixture(scope="module", autouse=True)
def fault_tasks():
    """toy-hang and toy-nan, registered while this module's tests run."""
    with registered(TaskEntry(name="toy-hang", defaults=toy_tasks.DEFAULTS, describe=toy_tasks.describe,
                              make_env=lambda o: HangingEnv(dict(o))),
                    TaskEntry(name="toy-nan", defaults=toy_tasks.DEFAULTS, describe=toy_tasks.describe,
                              make_env=lambda o: NaNObservationEnv(dict(o)))) as entries:
        yield entries


def rows(store):
    with open_store(store) as view:
        return view.attempts()


def test_a_hanging_env_times_out_and_the_episode_is_retried_on_a_fresh_worker(tmp_path):
    # The env never returns from its hang: the job finishing at all is the watchdog's doing (the reason below).
    report = run_job(JobSpec(task="toy-hang", episodes=4, video=H264, step_timeout_s=1.0), tmp_path / "store")
    assert report.committed_total == 4 and report.discarded == {"error": 1}
    attempts = rows(tmp_path / "store")
    (hung,) = [r for r in attempts if r.state == "discarded"]
    assert (hung.episode_index, hung.attempt, hung.counted) == (1, 0, True)
    assert "did not return within 1 s" in hung.reason
    retried = [r for r in attempts if r.episode_index == 1 and r.state == "committed"]
    assert [r.attempt for r in retried] == [1]
    assert sorted(r.episode_index for r in attempts if r.state == "committed") == [0, 1, 2, 3]


def test_nan_observation_discards_the_attempt_with_a_typed_error(tmp_path):
    report = run_job(JobSpec(task="toy-nan", episodes=2, video=H264), tmp_path / "store")
    assert report.committed_total == 2
    (bad,) = [r for r in rows(tmp_path / "store") if r.state == "discarded"]
    assert bad.record["error_type"] == "ObservationError"
    assert "contains NaN or inf" in bad.reason and "step 3" in bad.reason


KILL_MID_TRANSACTION = r"""
import os, signal, sqlite3, sys
db = sqlite3.connect(sys.argv[1], isolation_level=None)
db.execute("PRAGMA journal_mode=WAL")
db.execute("BEGIN IMMEDIATE")
db.execute("UPDATE attempts SET state = 'committed', frames = 20 WHERE state = 'staging'")
db.execute("UPDATE attempts SET state = 'discarded' WHERE state = 'committed' AND episode_index = 0")
os.kill(os.getpid(), signal.SIGKILL)  # dies before COMMIT
"""


def test_catalog_killed_mid_transaction_rolls_back_and_recovery_cleans(tmp_path):
    store = tmp_path / "store"
    run_job(JobSpec(task="toy-point", episodes=2, video=H264), store)
    before = committed_files(store)
    # Leave a staging attempt behind, as a run killed mid-episode would.
    catalog = Catalog(store)
    catalog.begin_attempt(2, 0, "ep00000002-a00", derive_seed(0, 2, 0))
    catalog.close()
    killed = subprocess.run([sys.executable, "-c", KILL_MID_TRANSACTION, str(store / "catalog.sqlite")])
    assert killed.returncode == -signal.SIGKILL
    # The half-done transaction is gone: committed rows are intact, the staging row is still staging.
    states = {(r.episode_index, r.state) for r in rows(store)}
    assert states == {(0, "committed"), (1, "committed"), (2, "staging")}
    report = run_job(JobSpec(task="toy-point", episodes=3, video=H264), store)
    assert report.recovery.interrupted == ["ep00000002-a00"] and report.committed_total == 3
    after = committed_files(store)
    assert all(after[k] == v for k, v in before.items())
    with open_store(store) as view:
        assert view.verify().ok
