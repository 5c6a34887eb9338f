"""Crash campaign: SIGKILL `demoforge generate`, `demoforge export` and `demoforge daemon` at random and at
targeted moments, recover, resume to completion, and check the durability invariants after every kill; and
kill the nodes of a real Ray cluster under a running `generate --executor ray`.

    HF_HUB_OFFLINE=1 .venv/bin/python tools/crash_campaign.py --trials 120 [--seed 0]
        [--kinds generate,export,daemon,nodes] [--task toy-point|fetch-pick-place] [--out report.json]
        [--cli-resume] [--keep] [--workdir DIR] [--nodes 2] [--node-kills 2-4]

Trials go round-robin over the kinds; each kind cycles through its kill targets:

- generate: ``random`` (a uniform moment of the whole run, under a random stage-delay profile),
  ``encode`` (``DEMOFORGE_STAGE_DELAY=encode:..``; killed while an attempt is in flight and its data is not
  flushed yet) and ``commit`` (``commit:..``; killed while an attempt's data is flushed and fsynced but its
  catalog row is not flipped yet). Windows are found by polling the catalog and the staged annotations.
- export (a store of N committed episodes; half the trials export into a dataset that already holds the
  first ones): ``metadata`` (``DEMOFORGE_EXPORT_PAUSE``; killed as soon as the first small metadata file of
  the new version is rewritten), ``publish`` (killed around the rename / link swap / catalog update) and
  ``random``.
- daemon (a job file with a target of N episodes and an export every 3): ``commit``, ``export`` (killed
  while a periodic export builds its version) and ``random``.
- nodes (``random``): a multi-node Ray cluster on this machine (``ray.cluster_utils.Cluster``: the head and
  ``--nodes`` more, one CPU each, kept for the whole campaign) runs `generate --executor ray --workers
  nodes+1`; at random moments a random node besides the head is removed (its raylet and workers SIGKILLed,
  as a lost machine), several times per trial (``--node-kills``), and after most kills a new node joins. The
  driver is never killed: the job itself must reach its target and exit 0. Each kill is labelled by what the
  node held (a worker with an attempt in flight, an idle worker, no worker), and the driver's lines give how
  long it took to notice the loss and to place a replacement.

Where each kill really landed is read from what the dead process left behind (catalog rows, staged data,
the dataset's version folders), not from the intent. After the kill the published dataset is checked, then
the job is resumed (generate: the same CLI command; export and daemon: the same code in this process, or the
CLI with ``--cli-resume``) and every invariant is checked. Prints tables of kills and violations; exits 1 on
any violation.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
TESTS = REPO / "tests"
os.environ.setdefault("MUJOCO_GL", "egl")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("DEMOFORGE_TASK_MODULES", "toy_tasks")
sys.path.insert(0, str(TESTS))

import numpy as np  # noqa: E402

from demoforge.storage.paths import CATALOG_FILE  # noqa: E402
from demoforge.storage.crash_invariants import (  # noqa: E402
    STORE_INVARIANTS,
    attempt_rows,
    check_committed_kept,
    check_resumed_store,
    identities,
    snapshot,
)
from demoforge.storage.lerobot.format import (  # noqa: E402
    APPEND_ONLY_FOLDERS,
    SMALL_METADATA,
    ExportMarker,
    read_sidecar,
)
from demoforge.storage.lerobot.publish import finished_versions, unfinished_leftovers, versions_dir  # noqa: E402
from demoforge.storage.store import open_store  # noqa: E402
from demoforge.storage.schema import READABLE_STATES, AttemptState  # noqa: E402
from demoforge.storage.staging import staged_episode_path  # noqa: E402

SMALL_META = SMALL_METADATA  # write order
CODEC = "h264"
TASKS: dict[str, dict[str, Any]] = {
    # step_sleep stretches a run a little so random kills land inside generation, not only in start-up
    "toy-point": {"options": {"steps": 20, "size": 32, "step_sleep": 0.01}, "episodes": 8, "first_export": 4,
                  "steps": 20},
    "fetch-pick-place": {"options": {"cycles": 1, "image_size": 64}, "episodes": 3, "first_export": 1,
                         "steps": 150},
}
PROFILES = ("", "encode:0.01", "write:0.005", "commit:0.2")  # stage-delay profiles of random generate kills
TARGETS = {"generate": ("random", "encode", "commit"), "export": ("metadata", "publish", "random"),
           "daemon": ("commit", "export", "random"), "nodes": ("random",)}
NODE_STEP_SLEEP = 0.25  # node trials step slower (no byte of an episode changes) so several kills fit in one run
WINDOWS = {("generate", "encode"): {"gen:in-flight"}, ("generate", "commit"): {"gen:commit-window"},
           ("export", "metadata"): {"export:metadata-writes"},
           ("export", "publish"): {"export:renamed-not-published", "export:published-catalog-pending"},
           ("daemon", "commit"): {"gen:commit-window"},
           ("daemon", "export"): {"export:building", "export:data-written", "export:metadata-writes",
                                  "export:fsync", "export:renamed-not-published",
                                  "export:published-catalog-pending"}}
INVARIANTS = {
    **STORE_INVARIANTS,  # the store-level ones, shared with tests/test_crash.py
    "published_consistent": "right after the kill the published dataset holds only committed, complete "
                            "episodes (the previous or the next version), its sidecar agrees, it validates",
    "export_complete": "after the resume the dataset's episode set equals the committed set; sidecar, marker "
                       "and catalog (exported, dataset_index) agree",
    "exported_unaltered": "files of episodes published before the kill are byte-identical afterwards",
    "dataset_validates": "validate_dataset (LeRobotDataset load, decoded frames) exits 0 after the resume",
    "resume_clean": "the resume exits 0, without a traceback",
    "job_completes": "a job whose Ray nodes were killed under it exits 0, without a traceback, with the target "
                     "committed and no re-run",
}
APPLIES = {"generate": ("committed_kept", "matches_clean_run", "no_duplicates", "no_index_gaps", "final_count",
                        "no_leftovers", "store_verifies", "resume_clean"),
           "export": ("committed_kept", "no_duplicates", "no_index_gaps", "final_count", "no_leftovers",
                      "published_consistent", "export_complete", "exported_unaltered", "dataset_validates",
                      "resume_clean"),
           "daemon": tuple(i for i in INVARIANTS if i != "job_completes"),
           "nodes": ("committed_kept", "matches_clean_run", "no_duplicates", "no_index_gaps", "final_count",
                     "no_leftovers", "store_verifies", "job_completes")}


# ------------------------------------------------------------------------------------------ helpers
def child_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("DEMOFORGE_STAGE_DELAY", "DEMOFORGE_EXPORT_PAUSE")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(TESTS), env.get("PYTHONPATH", "")]))
    env["DEMOFORGE_TASK_MODULES"] = "toy_tasks"
    env["PYTHONUNBUFFERED"] = "1"
    env.update({k: v for k, v in extra.items() if v})
    return env


def cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "demoforge.pipeline.cli", *args]


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def read_rows(store: Path) -> list[dict[str, Any]] | None:
    """The catalog's attempts in the order they were added, read through the store's read-only opener (works
    while a writer runs; None before the catalog exists or while it cannot be read yet)."""
    if not (store / CATALOG_FILE).exists():
        return None
    try:
        with open_store(store) as view:
            rows = sorted(view.attempts(), key=lambda r: r.row_id)
    except Exception:  # a catalog a killed or starting process is creating right now: read it again later
        return None
    return [{"episode_index": r.episode_index, "attempt": r.attempt, "episode_id": r.episode_id, "state": r.state,
             "seed": r.seed, "frames": r.frames, "content_hash": r.content_hash, "dataset_index": r.dataset_index,
             "worker": r.worker}
            for r in rows]


def live(rows: list[dict[str, Any]] | None) -> list[dict[str, Any]]:
    return [r for r in rows or [] if r["state"] in READABLE_STATES]


def episode_dir(store: Path, episode_id: str) -> Path:
    return staged_episode_path(store, episode_id)


def flushed(store: Path, episode_id: str) -> bool:
    """True when an attempt's last rows (its terminated/truncated flag) are on disk: the write stage has
    flushed it and it is in the commit stage (fsync, then the catalog flip)."""
    from demoforge.storage.schema import ANNOTATION_KEYS

    base = episode_dir(store, episode_id) / "annotations"
    try:
        chunks = sorted(int(p.name) for p in (base / "c").iterdir() if p.name.isdigit())
    except OSError:
        return False
    if not chunks:
        return False
    try:
        import zarr

        array = zarr.open_array(str(base), mode="r")
        c = (getattr(array, "shards", None) or array.chunks)[0]  # files are shards in staging format 2
        rows = np.asarray(array[chunks[-1] * c:(chunks[-1] + 1) * c])
    except Exception:  # a chunk being written right now: not flushed yet
        return False
    flags = rows[:, [ANNOTATION_KEYS.index("terminated"), ANNOTATION_KEYS.index("truncated")]]
    return bool(flags.any())


def published(out: Path) -> Path | None:
    return out.resolve() if out.is_symlink() else None


def dataset_state(out: Path) -> dict[str, Any] | None:
    current = published(out)
    if current is None:
        return None
    marker = ExportMarker.read(current).to_json()
    sidecar = read_sidecar(current)
    files = {str(p.relative_to(current)): sha(p) for p in sorted(current.rglob("*"))
             if p.is_file() and str(p.relative_to(current)).startswith(APPEND_ONLY_FOLDERS)}
    return {"version": current.name, "path": current, "marker": marker, "sidecar": sidecar, "files": files}


def gen_label(store: Path, target: int) -> str:
    rows = read_rows(store)
    if not rows:
        return "gen:startup"
    staging = [r for r in rows if r["state"] == AttemptState.STAGING]
    if any(flushed(store, r["episode_id"]) for r in staging):
        return "gen:commit-window"
    if staging:
        return "gen:in-flight"
    return "gen:between-episodes" if len(live(rows)) < target else "gen:target-reached"


def export_label(out: Path, store: Path, before: str | None = "?") -> str:
    """Where an export stood when its process died, read from the version folders it left. ``before``: the
    version published when a lone export started (its kills before or after the work are told apart)."""
    current = published(out)
    idle = "export:idle" if before == "?" else \
        "export:before-build" if (current.name if current else None) == before else "export:finished"
    versions = versions_dir(out)
    if not versions.exists():
        return idle
    partials = sorted(versions.glob("v*.partial"))
    if partials:
        build = partials[-1]

        def new(rel: str) -> bool:
            p = build / rel
            if not p.exists():
                return False
            old = current / rel if current is not None else None
            return old is None or not old.exists() or p.stat().st_ino != old.stat().st_ino

        meta_dir = build / "meta" / "episodes"
        episodes_new = meta_dir.exists() and any(new(str(p.relative_to(build))) for p in meta_dir.rglob("*.parquet"))
        if not episodes_new:
            return "export:building"
        k = sum(new(rel) for rel in SMALL_META)
        missing = current is not None and any(not (build / rel).exists() for rel in SMALL_META)
        if k == len(SMALL_META):
            return "export:fsync"
        return "export:metadata-writes" if k or missing else "export:data-written"
    finals = finished_versions(versions)
    if finals and (current is None or finals[-1].name > current.name):
        return "export:renamed-not-published"
    if current is not None:
        ids = {e.episode_id for e in ExportMarker.read(current).episodes}
        if any(r["state"] == AttemptState.COMMITTED and r["episode_id"] in ids for r in read_rows(store) or []):
            return "export:published-catalog-pending"
    return idle


# ------------------------------------------------------------------------------------------ a trial
@dataclass
class Trial:
    n: int
    kind: str
    target: str
    profile: str = ""
    pause: float = 0.0
    tries: int = 0
    killed: bool = False
    kills: int = 0  # kills that landed (one per trial, except node trials)
    kill_at_s: float | None = None
    committed_at_kill: int = 0
    landed: list[str] = field(default_factory=list)
    hit: bool | None = None
    resume_s: float = 0.0
    seconds: float = 0.0
    note: str = ""
    violations: dict[str, list[str]] = field(default_factory=dict)
    timings: list[dict[str, Any]] = field(default_factory=list)  # node trials: one entry per node kill

    def bad(self, invariant: str, message: str) -> None:
        assert invariant in INVARIANTS, invariant
        self.violations.setdefault(invariant, []).append(message)


class Campaign:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.task = args.task
        self.cfg = TASKS[args.task]
        self.n = int(args.episodes or self.cfg["episodes"])
        self.rng = random.Random(args.seed)
        self.work = Path(args.workdir or tempfile.mkdtemp(prefix="crash-campaign-"))
        self.work.mkdir(parents=True, exist_ok=True)
        self.est: dict[str, float] = {}
        self.reference: dict[int, tuple] = {}
        self.live: subprocess.Popen | None = None
        self.lerobot_import_s = 0.0
        self.cluster: Any = None  # the nodes kind's Ray cluster (ray_nodes.LocalCluster), started on first use

    # ------------------------------------------------------------------ set-up
    def option_args(self) -> list[str]:
        return [a for k, v in self.cfg["options"].items() for a in ("--option", f"{k}={json.dumps(v)}")]

    def gen_argv(self, store: Path, *extra: str) -> list[str]:
        return cli("generate", "--task", self.task, "--episodes", str(self.n), "--codec", CODEC,
                   *self.option_args(), *extra, "--store", str(store))

    def spec(self, episodes: int):
        from demoforge.pipeline.job import JobSpec, VideoSettings

        return JobSpec(task=self.task, episodes=episodes, task_options=dict(self.cfg["options"]),
                       video=VideoSettings(codec=CODEC))

    def setup(self) -> None:
        started = time.monotonic()
        ref = self.work / "reference"
        done = subprocess.run(self.gen_argv(ref / "store"), env=child_env(), capture_output=True, text=True,
                              timeout=900, stdin=subprocess.DEVNULL)
        if done.returncode != 0:
            raise SystemExit(f"crash_campaign: the clean reference run failed:\n{done.stderr[-3000:]}")
        self.est["generate"] = time.monotonic() - started
        self.reference = identities(attempt_rows(ref / "store"))
        if sorted(self.reference) != list(range(self.n)):
            raise SystemExit(f"crash_campaign: the clean run committed {sorted(self.reference)}, not 0..{self.n - 1} "
                             "(pick task options whose episodes all succeed)")
        t = time.monotonic()
        if set(self.args.kinds) & {"export", "daemon"}:
            import lerobot.datasets.lerobot_dataset  # noqa: F401  (the children pay this import too)

        self.lerobot_import_s = time.monotonic() - t
        self.est["export"] = self.lerobot_import_s + 3.0
        self.est["daemon"] = max(self.est["generate"], self.lerobot_import_s) + 4.0
        if "export" in self.args.kinds:
            from demoforge.pipeline.runner import run_job
            from demoforge.storage.lerobot.export import export_store

            first = self.work / "template-first"
            first.mkdir()
            shutil.copytree(ref / "store", first / "store")
            inc = self.work / "template-incremental"
            run_job(self.spec(self.cfg["first_export"]), inc / "store")
            export_store(inc / "store", inc / "dataset")
            run_job(self.spec(self.n), inc / "store")
            for template in (first, inc):
                got = identities(attempt_rows(template / "store"))
                if got != self.reference:
                    diff = {k: (self.reference.get(k), got.get(k)) for k in sorted(set(got) | set(self.reference))
                            if got.get(k) != self.reference.get(k)}
                    raise SystemExit(f"crash_campaign: template {template.name} differs from the clean run: "
                                     f"(clean, template) by episode index: {diff}")
        print(f"set-up: clean run {self.est['generate']:.1f} s, lerobot import {self.lerobot_import_s:.1f} s, "
              f"work dir {self.work}", flush=True)

    # ------------------------------------------------------------------ killing
    def spawn(self, argv: list[str], folder: Path, env: dict[str, str]) -> subprocess.Popen:
        out = open(folder / "child.out", "wb")
        err = open(folder / "child.err", "wb")
        proc = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=err, cwd=folder)
        out.close()
        err.close()
        self.live = proc
        return proc

    def kill_when(self, proc: subprocess.Popen, ready: Callable[[], bool], every: float, extra: float,
                  limit: float = 300.0) -> float | None:
        """Poll ``ready`` until true, wait ``extra`` seconds, SIGKILL. Returns the kill time, or None if the
        process ended first."""
        started = time.monotonic()
        while time.monotonic() - started < limit:
            if proc.poll() is not None:
                return None
            try:
                if ready():
                    break
            except (OSError, ValueError):
                pass
            time.sleep(every)
        if extra:
            time.sleep(extra)
        return self.kill(proc, started)

    def kill_at(self, proc: subprocess.Popen, seconds: float) -> float | None:
        started = time.monotonic()
        try:
            proc.wait(timeout=seconds)
            return None
        except subprocess.TimeoutExpired:
            return self.kill(proc, started)

    def kill(self, proc: subprocess.Popen, started: float) -> float | None:
        if proc.poll() is not None:
            return None
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=60)
        self.live = None
        return time.monotonic() - started if proc.returncode == -signal.SIGKILL else None

    def finish_child(self, proc: subprocess.Popen) -> None:
        if proc.poll() is None:
            try:
                proc.wait(timeout=600)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self.live = None

    def gen_est(self, profile: str) -> float:
        from demoforge.storage.faults import stage_delays

        d = stage_delays(profile)
        per_frame = d.get("encode", 0.0) + d.get("write", 0.0)
        return self.est["generate"] + self.n * (self.cfg["steps"] * per_frame + d.get("commit", 0.0))

    # ------------------------------------------------------------------ the three kinds
    def trial(self, n: int, kind: str, target: str) -> Trial:
        trial = Trial(n, kind, target)
        started = time.monotonic()
        folder = None
        try:
            for attempt in range(3):
                trial.tries = attempt + 1
                folder = self.work / f"trial{n:03d}-{kind}-{target}-{attempt}"
                if folder.exists():
                    shutil.rmtree(folder)
                folder.mkdir()
                state = getattr(self, f"_{kind}_kill")(trial, folder, shrink=0.6 ** attempt)
                if trial.killed:
                    break
                if attempt < 2:
                    shutil.rmtree(folder, ignore_errors=True)
            if not trial.killed:
                trial.note = "the process finished before every kill point (3 tries)"
            getattr(self, f"_{kind}_check")(trial, folder, state)
        except Exception as exc:  # a harness failure is reported, never hidden
            trial.note = f"harness error: {type(exc).__name__}: {exc}"
            trial.bad("resume_clean", f"harness: {traceback.format_exc()[-1500:]}")
        trial.seconds = time.monotonic() - started
        trial.kills = trial.kills or int(trial.killed)
        if trial.landed and (trial.kind, trial.target) in WINDOWS:
            trial.hit = bool(set(trial.landed) & WINDOWS[(trial.kind, trial.target)]) if trial.killed else False
        if folder is not None and not trial.violations and not self.args.keep:
            shutil.rmtree(folder, ignore_errors=True)
        return trial

    def _snapshot(self, trial: Trial, store: Path, out: Path | None) -> dict[str, Any]:
        rows = read_rows(store)
        committed = {r["episode_id"]: r for r in live(rows)}
        trial.committed_at_kill = len(committed)
        return {"committed": committed, "store": snapshot(store),
                "dataset": dataset_state(out) if out is not None else None}

    # generate ---------------------------------------------------------------------------------------
    def _generate_kill(self, trial: Trial, folder: Path, shrink: float) -> dict[str, Any]:
        store = folder / "store"
        rng = self.rng
        profile = {"random": rng.choice(PROFILES), "encode": "encode:0.03", "commit": "commit:0.3"}[trial.target]
        trial.profile = profile
        proc = self.spawn(self.gen_argv(store), folder, child_env(DEMOFORGE_STAGE_DELAY=profile))
        need = rng.randint(0, self.n // 2)  # committed episodes to wait for (data at risk at the kill)
        if trial.target == "random":
            at = self.kill_at(proc, rng.uniform(0.0, 1.0) * self.gen_est(profile) * shrink)
        else:
            want_flushed = trial.target == "commit"

            def ready() -> bool:
                rows = read_rows(store)
                if len(live(rows)) < need:
                    return False
                return any(flushed(store, r["episode_id"]) == want_flushed
                           for r in rows or [] if r["state"] == AttemptState.STAGING)

            at = self.kill_when(proc, ready, every=0.02, extra=rng.uniform(0.0, 0.15 if want_flushed else 0.3))
        self.finish_child(proc)
        trial.killed, trial.kill_at_s = at is not None, at
        if trial.killed:
            trial.landed = [gen_label(store, self.n)]
        return self._snapshot(trial, store, None)

    def _resume_generate(self, trial: Trial, store: Path, folder: Path) -> None:
        t = time.monotonic()
        done = subprocess.run(self.gen_argv(store), env=child_env(), capture_output=True, text=True, timeout=900,
                              stdin=subprocess.DEVNULL, cwd=folder)
        trial.resume_s += time.monotonic() - t
        if done.returncode != 0 or "Traceback" in done.stderr:
            trial.bad("resume_clean", f"generate resume exited {done.returncode}: {done.stderr[-800:]}")

    def _generate_check(self, trial: Trial, folder: Path, state: dict[str, Any]) -> None:
        store = folder / "store"
        self._resume_generate(trial, store, folder)
        self._check_store(trial, store, state)

    def _check_store(self, trial: Trial, store: Path, state: dict[str, Any]) -> None:
        violations = check_resumed_store(store, target=self.n, before=state["store"], reference=self.reference)
        for invariant, messages in violations.items():
            for message in messages:
                trial.bad(invariant, message)

    # export -----------------------------------------------------------------------------------------
    def _export_kill(self, trial: Trial, folder: Path, shrink: float) -> dict[str, Any]:
        rng = self.rng
        incremental = rng.random() < 0.5
        template = self.work / ("template-incremental" if incremental else "template-first")
        for name in ("store", "dataset", versions_dir(Path("dataset")).name):
            if (template / name).exists() or (template / name).is_symlink():
                src = template / name
                if src.is_symlink():
                    os.symlink(os.readlink(src), folder / name)
                else:
                    shutil.copytree(src, folder / name, symlinks=True)
        store, out = folder / "store", folder / "dataset"
        trial.note = "incremental" if incremental else "first export"
        before = self._snapshot(trial, store, out)
        trial.pause = 0.3 if trial.target != "random" else rng.choice((0.0, 0.1, 0.3))
        env = child_env(DEMOFORGE_EXPORT_PAUSE=str(trial.pause) if trial.pause else "")
        old = published(out)
        proc = self.spawn(cli("export", "--store", str(store), "--out", str(out)), folder, env)
        if trial.target == "random":
            at = self.kill_at(proc, rng.uniform(0.0, 1.0) * (self.est["export"] + 6 * trial.pause) * shrink)
        elif trial.target == "metadata":
            at = self._export_kill_metadata(proc, out, store)
        else:
            def renamed() -> bool:
                finals = finished_versions(versions_dir(out))
                return any(old is None or p.name > old.name for p in finals)

            at = self.kill_when(proc, renamed, every=0.02, extra=rng.uniform(0.0, 2 * trial.pause))
        self.finish_child(proc)
        trial.killed, trial.kill_at_s = at is not None, at
        if trial.killed:
            trial.landed = [export_label(out, store, old.name if old else None)]
        before["old_dataset"] = before.pop("dataset")
        before["dataset"] = dataset_state(out)
        return before

    def _export_kill_metadata(self, proc: subprocess.Popen, out: Path, store: Path) -> float | None:
        """Wait for the new version's data (the pause before the metadata), then poll fast and kill as soon
        as the first small metadata file is rewritten."""
        started = time.monotonic()
        phase_two = False
        while time.monotonic() - started < 300:
            if proc.poll() is not None:
                return None
            try:
                label = export_label(out, store)
            except (OSError, ValueError):
                label = ""
            if label == "export:metadata-writes" or label == "export:fsync":
                break
            if label == "export:data-written":
                phase_two = True
            time.sleep(0.002 if phase_two else 0.05)
        return self.kill(proc, started)

    def _check_published(self, trial: Trial, store: Path, out: Path, state: dict[str, Any],
                         allowed: list[set[str]] | None) -> None:
        """Right after the kill: the published dataset is complete and holds only committed episodes."""
        ds = state["dataset"]
        old = state.get("old_dataset")
        if ds is None:
            if old is not None:
                trial.bad("published_consistent", "the previously published dataset disappeared")
            return
        self._check_dataset_rows(trial, ds, state["committed"], "published_consistent")
        ids = {e["episode_id"] for e in ds["marker"]["episodes"]}
        if allowed is not None and ids not in allowed:
            trial.bad("published_consistent", f"published {len(ids)} episodes: neither the previous nor the next "
                                              "version")
        if old is not None:
            self._check_unaltered(trial, old, ds)
        from demoforge.storage.lerobot.validate import validate_dataset

        report = validate_dataset(out)
        if report.status != 0 or report.episodes != len(ids):
            trial.bad("published_consistent", f"after the kill validate says {report.status}: "
                                              f"{(report.problems or [str(report.load_error)])[:3]}")

    def _check_dataset_rows(self, trial: Trial, ds: dict[str, Any], committed: dict[str, dict], inv: str) -> None:
        episodes = ds["marker"]["episodes"]
        ids = [e["episode_id"] for e in episodes]
        if len(ids) != len(set(ids)):
            trial.bad("no_duplicates", f"dataset {ds['version']} lists an episode twice")
        if [e["dataset_index"] for e in episodes] != list(range(len(episodes))):
            trial.bad("no_index_gaps", f"dataset {ds['version']} indices are not 0..{len(episodes) - 1}")
        staging_order = [int(i[2:10]) for i in ids]
        if staging_order != sorted(staging_order):
            trial.bad("no_index_gaps", f"dataset {ds['version']} is not in staging-index order")
        stray = [i for i in ids if i not in committed]
        if stray:
            trial.bad(inv, f"dataset {ds['version']} holds episodes that are not committed: {stray}")
        sidecar = ds["sidecar"]
        if [r["staging_episode_id"] for r in sidecar] != ids or \
                [r["dataset_episode_index"] for r in sidecar] != list(range(len(ids))):
            trial.bad(inv, f"dataset {ds['version']}: sidecar episodes differ from the marker")
        for r in sidecar:
            row = committed.get(r["staging_episode_id"])
            if row is not None and (r["length"] != row["frames"] or r["content_hash"] != row["content_hash"]):
                trial.bad(inv, f"dataset {ds['version']}: {r['staging_episode_id']} length/hash differs from the "
                               "catalog (a partial episode?)")
        if ds["marker"]["total_episodes"] != len(ids):
            trial.bad(inv, f"dataset {ds['version']}: marker total {ds['marker']['total_episodes']} != {len(ids)}")

    def _check_unaltered(self, trial: Trial, before: dict[str, Any], after: dict[str, Any]) -> None:
        changed = [p for p, digest in before["files"].items() if after["files"].get(p) != digest]
        if changed:
            trial.bad("exported_unaltered", f"files of {before['version']} changed or vanished in "
                                            f"{after['version']}: {changed[:4]}")

    def _resume_export(self, trial: Trial, store: Path, out: Path, folder: Path) -> None:
        t = time.monotonic()
        if self.args.cli_resume:
            done = subprocess.run(cli("export", "--store", str(store), "--out", str(out)), env=child_env(),
                                  capture_output=True, text=True, timeout=900, stdin=subprocess.DEVNULL, cwd=folder)
            if done.returncode != 0 or "Traceback" in done.stderr:
                trial.bad("resume_clean", f"export resume exited {done.returncode}: {done.stderr[-800:]}")
        else:
            from demoforge.storage.lerobot.export import export_store

            try:
                export_store(store, out)
            except Exception as exc:
                trial.bad("resume_clean", f"export resume raised {type(exc).__name__}: {exc}")
        trial.resume_s += time.monotonic() - t

    def _check_final_dataset(self, trial: Trial, store: Path, out: Path, state: dict[str, Any]) -> None:
        rows = read_rows(store) or []
        committed = {r["episode_id"]: r for r in live(rows)}
        ds = dataset_state(out)
        if ds is None:
            trial.bad("export_complete", "no dataset published after the resume")
            return
        self._check_dataset_rows(trial, ds, committed, "export_complete")
        ids = [e["episode_id"] for e in ds["marker"]["episodes"]]
        if set(ids) != set(committed):
            trial.bad("export_complete", f"dataset holds {len(ids)} episodes, the store commits {len(committed)}: "
                                         f"missing {sorted(set(committed) - set(ids))[:4]}, extra "
                                         f"{sorted(set(ids) - set(committed))[:4]}")
        index = {e["episode_id"]: e["dataset_index"] for e in ds["marker"]["episodes"]}
        wrong = [r["episode_id"] for r in committed.values()
                 if r["state"] != AttemptState.EXPORTED or r["dataset_index"] != index.get(r["episode_id"])]
        if wrong:
            trial.bad("export_complete", f"catalog not reconciled with the dataset for {wrong[:4]}")
        if len(ids) != self.n:
            trial.bad("final_count", f"the dataset holds {len(ids)} episodes, target {self.n}")
        for previous in (state.get("old_dataset"), state.get("dataset")):
            if previous is not None:
                self._check_unaltered(trial, previous, ds)
        versions = versions_dir(out)
        left = unfinished_leftovers(versions)
        if left:
            trial.bad("no_leftovers", f"unfinished export leftovers {left}")
        from demoforge.storage.lerobot.validate import validate_dataset

        report = validate_dataset(out, expect_segments=None)
        if report.status != 0 or report.episodes != self.n:
            trial.bad("dataset_validates", f"validate status {report.status}, {report.episodes} episodes: "
                                           f"{(report.problems or [str(report.load_error)])[:3]}")

    def _export_check(self, trial: Trial, folder: Path, state: dict[str, Any]) -> None:
        store, out = folder / "store", folder / "dataset"
        old_ids = {e["episode_id"] for e in state["old_dataset"]["marker"]["episodes"]} if state["old_dataset"] \
            else set()
        self._check_published(trial, store, out, state, [old_ids, set(state["committed"])])
        self._resume_export(trial, store, out, folder)
        # committed_kept: an export never touches staged bytes or the committed rows' content
        for problem in check_committed_kept(state["store"], snapshot(store)):
            trial.bad("committed_kept", f"{problem} (after the export)")
        self._check_final_dataset(trial, store, out, state)

    # daemon -----------------------------------------------------------------------------------------
    def job_file(self, folder: Path) -> Path:
        opts = ", ".join(f"{k} = {json.dumps(v)}" for k, v in self.cfg["options"].items())
        job = folder / "job.toml"
        job.write_text(f"""[job]
task = "{self.task}"
episodes = {self.n}
options = {{ {opts} }}
[video]
codec = "{CODEC}"
[store]
dir = "store"
[export]
dir = "dataset"
every_episodes = 3
every_seconds = 600
[metrics]
address = "off"
[disk]
min_free_mb = 0
check_seconds = 1
[shutdown]
deadline_seconds = 5
[log]
json = true
""")
        return job

    def _daemon_kill(self, trial: Trial, folder: Path, shrink: float) -> dict[str, Any]:
        rng = self.rng
        job = self.job_file(folder)
        store, out = folder / "store", folder / "dataset"
        if trial.target == "random":
            trial.profile, trial.pause = rng.choice(PROFILES), rng.choice((0.0, 0.2))
        elif trial.target == "commit":
            trial.profile, trial.pause = "commit:0.3", 0.0
        else:
            trial.profile, trial.pause = "", 0.3
        env = child_env(DEMOFORGE_STAGE_DELAY=trial.profile,
                        DEMOFORGE_EXPORT_PAUSE=str(trial.pause) if trial.pause else "")
        proc = self.spawn(cli("daemon", "--config", str(job), "--json-logs"), folder, env)
        if trial.target == "random":
            est = max(self.gen_est(trial.profile), self.lerobot_import_s) + 4.0 + 6 * trial.pause
            at = self.kill_at(proc, rng.uniform(0.0, 1.0) * est * shrink)
        elif trial.target == "commit":
            need = rng.randint(0, self.n // 2)

            def ready() -> bool:
                rows = read_rows(store)
                return len(live(rows)) >= need and any(
                    flushed(store, r["episode_id"]) for r in rows or [] if r["state"] == AttemptState.STAGING)

            at = self.kill_when(proc, ready, every=0.02, extra=rng.uniform(0.0, 0.15))
        else:
            at = self.kill_when(proc, lambda: any(versions_dir(out).glob("v*.partial")), every=0.05,
                                extra=rng.uniform(0.0, 6 * trial.pause))
        self.finish_child(proc)
        trial.killed, trial.kill_at_s = at is not None, at
        if trial.killed:
            trial.landed = [gen_label(store, self.n), export_label(out, store)]
        return self._snapshot(trial, store, out)

    def _resume_daemon(self, trial: Trial, folder: Path) -> None:
        job = folder / "job.toml"
        t = time.monotonic()
        if self.args.cli_resume:
            done = subprocess.run(cli("daemon", "--config", str(job), "--json-logs"), env=child_env(),
                                  capture_output=True, text=True, timeout=900, stdin=subprocess.DEVNULL, cwd=folder)
            if done.returncode != 0 or "Traceback" in done.stderr:
                trial.bad("resume_clean", f"daemon restart exited {done.returncode}: {done.stderr[-800:]}")
        else:
            import anyio

            from demoforge.pipeline.daemon import EventLog, GenerationDaemon
            from demoforge.pipeline.daemon_config import load_config

            try:
                with open(folder / "restart.log", "w") as log:
                    code = anyio.run(GenerationDaemon(load_config(job), EventLog(True, stream=log)).run)
                if code != 0:
                    trial.bad("resume_clean", f"daemon restart returned {code}")
            except Exception as exc:
                trial.bad("resume_clean", f"daemon restart raised {type(exc).__name__}: {exc}")
        trial.resume_s += time.monotonic() - t

    def _daemon_check(self, trial: Trial, folder: Path, state: dict[str, Any]) -> None:
        store, out = folder / "store", folder / "dataset"
        self._check_published(trial, store, out, state, None)
        self._resume_daemon(trial, folder)
        self._check_store(trial, store, state)
        self._check_final_dataset(trial, store, out, state)

    # nodes ------------------------------------------------------------------------------------------
    def ray_cluster(self) -> Any:
        if self.cluster is None:
            from ray_nodes import LocalCluster

            started = time.monotonic()
            self.cluster = LocalCluster(self.work / "ray-cluster", auth=False, head_cpus=1, nodes=self.args.nodes)
            print(f"ray cluster: head + {self.args.nodes} node(s) at {self.cluster.address} in "
                  f"{time.monotonic() - started:.1f} s", flush=True)
        return self.cluster

    def nodes_argv(self, store: Path) -> list[str]:
        cluster = self.ray_cluster()
        return self.gen_argv(store, "--option", f"step_sleep={NODE_STEP_SLEEP}", "--executor", "ray",
                             "--ray-address", cluster.address, "--workers", str(self.args.nodes + 1))

    def _nodes_kill(self, trial: Trial, folder: Path, shrink: float) -> dict[str, Any]:
        import re
        import threading

        rng = self.rng
        cluster = self.ray_cluster()
        cluster.resize(self.args.nodes)
        store = folder / "store"
        trial.profile = rng.choice(PROFILES)
        lines: list[tuple[float, str]] = []
        out = open(folder / "child.out", "wb")
        proc = subprocess.Popen(self.nodes_argv(store), env=child_env(DEMOFORGE_STAGE_DELAY=trial.profile),
                                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.PIPE, text=True, cwd=folder)
        out.close()
        self.live = proc
        t0 = time.monotonic()

        def read() -> None:
            assert proc.stderr is not None
            for line in proc.stderr:
                lines.append((time.monotonic(), line.rstrip("\n")))

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        while proc.poll() is None and not any("ready on" in text for _, text in list(lines)):
            time.sleep(0.05)
        low, high = self.args.node_kills
        before = None
        for _ in range(rng.randint(low, high)):
            time.sleep(rng.uniform(0.3, 3.0) * shrink)
            if proc.poll() is not None:
                break
            nodes = cluster.nodes()
            if not nodes:
                cluster.add_node()
                continue
            node = rng.choice(nodes)
            pids = set(cluster.pids(node))
            slots = {int(m.group(2)): int(m.group(1)) for _, text in list(lines)
                     if (m := re.search(r"worker (\d+) \(Ray actor, pid (\d+)\)", text))}
            hosted = [(slots[p], p) for p in pids if p in slots]
            staging = {r["worker"] for r in read_rows(store) or [] if r["state"] == AttemptState.STAGING}
            before = snapshot(store)
            removed_at = time.monotonic()
            cluster.remove_node(node)
            if proc.poll() is not None:
                break
            label = "node:no-worker" if not hosted else \
                "node:attempt-in-flight" if any(slot in staging for slot, _ in hosted) else "node:idle-worker"
            trial.landed.append(label)
            trial.kills += 1
            trial.kill_at_s = trial.kill_at_s if trial.kill_at_s is not None else removed_at - t0
            kill: dict[str, Any] = {"at_s": round(removed_at - t0, 2), "label": label, "removed_at": removed_at,
                                    "slots": [slot for slot, _ in hosted], "committed": before.committed}
            if rng.random() < 0.7:  # most lost machines come back (or are replaced) while the job runs
                time.sleep(rng.uniform(0.0, 2.0) * shrink)
                kill["added_at"] = time.monotonic()
                cluster.add_node()
            trial.timings.append(kill)
        try:
            proc.wait(timeout=900)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        reader.join(timeout=10)
        self.live = None
        trial.killed = trial.kills > 0
        self._node_timings(trial, lines)
        state = self._snapshot(trial, store, None)
        state["code"] = proc.returncode
        state["stderr"] = "\n".join(text for _, text in lines)
        if before is not None:
            state["store"] = before  # committed at the last kill (a superset of what the earlier ones saw)
            trial.committed_at_kill = len(before.rows)
        return state

    @staticmethod
    def _node_timings(trial: Trial, lines: list[tuple[float, str]]) -> None:
        """From the driver's lines: seconds from a node's removal to the loss of its worker being noticed,
        and to the next worker placed (a replacement, or a start that was waiting for room)."""
        for kill in trial.timings:
            removed = kill.pop("removed_at")
            added = kill.pop("added_at", None)
            after = [(t - removed, text) for t, text in lines if t >= removed]
            for slot in kill["slots"]:
                gone = next((dt for dt, text in after if text.startswith(f"worker {slot} (Ray actor") and
                             "is gone" in text), None)
                if gone is not None:
                    kill.setdefault("noticed_s", []).append(round(gone, 2))
            placed = next((dt for dt, text in after if "replaces a lost worker" in text or "joining the run" in text),
                          None)
            if placed is not None:
                kill["next_placed_s"] = round(placed, 2)
                if added is not None:
                    kill["node_added_s"] = round(added - removed, 2)
            kill["waited_for_room"] = any("waits for room" in text for dt, text in after if dt < 30)

    def _nodes_check(self, trial: Trial, folder: Path, state: dict[str, Any]) -> None:
        store = folder / "store"
        err = state["stderr"]
        if state["code"] != 0 or "Traceback" in err:
            trial.bad("job_completes", f"the job exited {state['code']}: {err[-800:]}")
            t = time.monotonic()  # still check what it left, after a plain re-run
            subprocess.run(self.nodes_argv(store), env=child_env(), capture_output=True, text=True, timeout=900,
                           stdin=subprocess.DEVNULL, cwd=folder)
            trial.resume_s += time.monotonic() - t
        self._check_store(trial, store, state)

    # ------------------------------------------------------------------ the campaign
    targets = TARGETS  # per kind, cycled over its trials

    def describe(self, trial: Trial) -> str:
        """One line per trial in the campaign's output."""
        where = ", ".join(trial.landed) or "-"
        bad = sum(len(v) for v in trial.violations.values())
        return (f"trial {trial.n:3d} {trial.kind:8s} {trial.target:8s} {'killed' if trial.killed else 'NO KILL'} "
                f"at {trial.kill_at_s or 0:5.2f} s  landed {where:55s} committed@kill {trial.committed_at_kill:2d}  "
                f"violations {bad}  ({trial.seconds:.1f} s){'  ' + trial.note if trial.note else ''}")

    def run(self) -> list[Trial]:
        kinds = self.args.kinds
        trials: list[Trial] = []
        for i in range(self.args.trials):
            kind = kinds[i % len(kinds)]
            targets = self.targets[kind]
            target = targets[(i // len(kinds)) % len(targets)]
            trial = self.trial(i, kind, target)
            trials.append(trial)
            print(self.describe(trial), flush=True)
            for inv, messages in trial.violations.items():
                for m in messages[:3]:
                    print(f"    VIOLATION {inv}: {m}", flush=True)
        return trials


def summarize(trials: list[Trial], kinds: list[str]) -> dict[str, Any]:
    per_kind: dict[str, Any] = {}
    for kind in kinds:
        mine = [t for t in trials if t.kind == kind]
        targets = {}
        for target in TARGETS[kind]:
            these = [t for t in mine if t.target == target]
            targets[target] = {"trials": len(these), "killed": sum(t.kills for t in these),
                               "in_window": sum(bool(t.hit) for t in these) if (kind, target) in WINDOWS else None}
        landed = Counter(label for t in mine if t.killed for label in t.landed)
        violations = {inv: sum(len(t.violations.get(inv, [])) for t in mine) for inv in APPLIES[kind]}
        per_kind[kind] = {"trials": len(mine), "kills": sum(t.kills for t in mine), "targets": targets,
                          "landed": dict(sorted(landed.items())), "violations": violations,
                          "seconds": round(sum(t.seconds for t in mine), 1)}
        if kind == "nodes":
            per_kind[kind]["timings"] = node_timings([k for t in mine for k in t.timings])
    return per_kind


def node_timings(kills: list[dict[str, Any]]) -> dict[str, Any]:
    """Seconds from a node's removal to its worker's loss noticed by the driver, and to the next worker placed."""
    import statistics

    def spread(values: list[float]) -> str:
        if not values:
            return "n/a"
        values = sorted(values)
        return (f"median {statistics.median(values):.2f} s, min {values[0]:.2f}, max {values[-1]:.2f} "
                f"({len(values)})")

    noticed = [v for k in kills for v in k.get("noticed_s", [])]
    placed = [k["next_placed_s"] for k in kills if "next_placed_s" in k]
    return {"noticed": spread(noticed), "next_placed": spread(placed),
            "node_added": spread([k["node_added_s"] for k in kills if "node_added_s" in k]),
            "waited_for_room": sum(bool(k.get("waited_for_room")) for k in kills), "kills": len(kills)}


def render(summary: dict[str, Any], kinds: list[str]) -> str:
    lines = ["| kind | trials | kills | targeted kills landed in their window | where the kills landed (from the "
             "state left behind) |", "|---|---|---|---|---|"]
    for kind in kinds:
        s = summary[kind]
        targeted = ", ".join(f"{t}: {v['in_window']}/{v['trials']}" if v["in_window"] is not None
                             else f"{t}: {v['killed']}/{v['trials']} killed" for t, v in s["targets"].items())
        landed = ", ".join(f"{k} {v}" for k, v in s["landed"].items())
        lines.append(f"| {kind} | {s['trials']} | {s['kills']} | {targeted} | {landed} |")
    if "nodes" in summary:
        t = summary["nodes"]["timings"]
        lines += ["", f"node kills: loss noticed by the driver {t['noticed']}; next worker placed {t['next_placed']}"
                      f" after the removal (node re-added {t['node_added']} after it); the job said it waits for "
                      f"room after {t['waited_for_room']} of {t['kills']} kills"]
    return "\n".join(lines + [""] + invariant_table(summary, kinds, INVARIANTS, "trials"))


def invariant_table(summary: dict[str, Any], kinds: list[str], invariants: dict[str, str], per: str) -> list[str]:
    """Rows of violations per invariant and kind, out of ``summary[kind][per]`` (n/a where one does not apply)."""
    lines = ["| invariant | " + " | ".join(kinds) + " |", "|---|" + "---|" * len(kinds)]
    for inv in invariants:
        cells = [f"{summary[k]['violations'][inv]} / {summary[k][per]}" if inv in summary[k]["violations"] else "n/a"
                 for k in kinds]
        lines.append(f"| {inv} | " + " | ".join(cells) + " |")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, required=True, help="kill trials in all (round-robin over kinds)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the trials' kill moments and jobs (default 0)")
    parser.add_argument("--kinds", default="generate,export,daemon",
                        help="comma-separated kinds of trial among generate, export, daemon, nodes "
                             "(default generate,export,daemon)")
    parser.add_argument("--task", default="toy-point", choices=sorted(TASKS),
                        help="the task the trials' jobs run (default toy-point)")
    parser.add_argument("--episodes", type=int, default=None, help="target episodes per trial")
    parser.add_argument("--out", type=Path, default=None, help="write the JSON report here")
    parser.add_argument("--cli-resume", action="store_true",
                        help="resume export and daemon with the CLI too (slower: each pays the lerobot import)")
    parser.add_argument("--workdir", type=Path, default=None,
                        help="where the trials' folders go, kept afterwards (default a temporary folder, removed "
                             "when no invariant was violated and --keep is off)")
    parser.add_argument("--keep", action="store_true", help="keep every trial's folder")
    parser.add_argument("--nodes", type=int, default=2,
                        help="nodes kind: Ray nodes of one CPU besides the head (the job runs nodes+1 workers)")
    parser.add_argument("--node-kills", default="2-4", metavar="LOW-HIGH",
                        help="nodes kind: node removals per trial, drawn uniformly in this range")
    args = parser.parse_args(argv)
    try:
        low, high = (int(x) for x in args.node_kills.split("-"))
        assert 1 <= low <= high and args.nodes >= 1
    except (ValueError, AssertionError):
        parser.error(f"--node-kills takes LOW-HIGH with 1 <= LOW <= HIGH, and --nodes >= 1 "
                     f"(got {args.node_kills!r}, {args.nodes})")
    args.node_kills = (low, high)
    args.kinds = [k.strip() for k in args.kinds.split(",") if k.strip()]
    unknown = [k for k in args.kinds if k not in TARGETS]
    if unknown or not args.kinds or args.trials < 1:
        parser.error(f"--kinds takes generate, export, daemon, nodes (got {args.kinds}); --trials must be >= 1")
    started = time.monotonic()
    campaign = Campaign(args)
    try:
        campaign.setup()
        trials = campaign.run()
    finally:
        if campaign.live is not None and campaign.live.poll() is None:
            campaign.live.kill()
            campaign.live.wait()
        if campaign.cluster is not None:
            campaign.cluster.close()
    summary = summarize(trials, args.kinds)
    total = sum(len(m) for t in trials for m in t.violations.values())
    kills = sum(t.kills for t in trials)
    print()
    print(render(summary, args.kinds))
    print(f"\n{len(trials)} trials, {kills} kills, {total} violations, {time.monotonic() - started:.0f} s "
          f"(task {args.task}, {campaign.n} episodes per trial, seed {args.seed})")
    return finish(args, campaign, started, total, {"trials_total": len(trials), "kills": kills,
                                                    "invariants": INVARIANTS, "summary": summary,
                                                    "trials": [t.__dict__ for t in trials]})


def finish(args: argparse.Namespace, campaign: Campaign, started: float, violations: int,
           fields: dict[str, Any]) -> int:
    """Write the JSON report (``--out``), clear the work folder unless something failed; the exit status."""
    report = {"command": " ".join([Path(sys.executable).name, *sys.argv]),
              "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "task": args.task, "episodes": campaign.n, "seed": args.seed, "kinds": args.kinds,
              "violations": violations, "elapsed_s": round(time.monotonic() - started, 1), **fields}
    if args.out is not None:
        args.out.write_text(json.dumps(report, indent=2, default=str) + "\n")
    if violations == 0 and not args.keep and args.workdir is None:
        shutil.rmtree(campaign.work, ignore_errors=True)
    elif violations:
        print(f"failing trials kept under {campaign.work}")
    return 1 if violations else 0


if __name__ == "__main__":
    sys.exit(main())
