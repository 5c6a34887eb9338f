"""Power-cut campaign: run `demoforge generate`, `export` and `daemon` with their store and dataset on a file
system that forgets what was not fsynced (tools/powercut_fs.py), cut the power at random moments, mount what
survived, run the same job again, and check the durability invariants after every cut.

    nice -n 10 .venv/bin/python tools/power_cut.py --trials 60 [--seed 0] [--kinds generate,export,daemon]
        [--task fetch-pick-place|toy-point] [--modes strict,subset,renames] [--cuts-per-trial 2]
        [--out report.json] [--cli-resume] [--keep] [--workdir DIR]

Needs root, /dev/fuse, fuse3 and pyfuse3 (tools/setup.sh installs them); refuses to run without them.

Each trial mounts a fresh disk (a folder) on the file system and runs the kind's real CLI process in its own
process group; the file system cuts the power at the drawn moment (it answers EIO from then on, SIGKILLs the
group, unmounts and leaves on the disk only what was fsynced, per the trial's mode), and the state left is
checked at once. Then the disk is mounted again and the same command re-run, which may be cut again
(``--cuts-per-trial``: a cut during recovery), until a last run completes; then every invariant is checked.

Where a cut lands (targets, cycled per kind):

- ``ops``: at a uniform mutating operation (write, create, rename, fsync, ...) of a clean run on the file system;
- ``time``: at a uniform moment of a clean run;
- ``commit`` (generate, daemon): at one of the fsyncs that make an attempt durable (staging), or a few
  operations after it, before the catalog flip;
- ``catalog``: at a write or fsync of the catalog's SQLite WAL: inside a transaction, before it is durable;
- ``publish`` (export, daemon): at an fsync of the new dataset version, or 0-8 operations after the rename of
  ``vN.partial`` into place (link swap, catalog update).

Cuts after the first in a trial are drawn by ``ops`` over the re-run. Every invariant of tools/crash_campaign.py
is checked (the same code: this campaign extends it), plus what only a power cut can break: see
:data:`POWER_INVARIANTS`. Prints tables of cuts and violations; exits 1 on any violation.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import shutil
import subprocess
import sys
import time
import traceback
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import crash_campaign as cc  # noqa: E402  (sets the environment, finds the toy tasks)
from powercut_fs import MODES, FuseUnavailable, PowerCut  # noqa: E402

from demoforge.storage.crash_invariants import check_committed_kept, snapshot  # noqa: E402
from demoforge.storage.lerobot.publish import versions_dir  # noqa: E402

POWER_INVARIANTS = {
    **cc.INVARIANTS,
    "reported_durable": "every episode a process reported committed before a cut (its episode_committed line) is "
                        "committed after it; every dataset version it reported published is still published "
                        "(or a later one)",
    "cut_state_verifies": "right after every cut, before any recovery: the store opens read-only and every "
                          "committed episode verifies (checksums, counts, content hash, decoded frames); nothing "
                          "uncommitted is readable",
    "dataset_verifies": "`demoforge verify DATASET` after the last run: every file matches the checksum its "
                        "export recorded and every video decodes",
}
APPLIES = {
    "generate": ("reported_durable", "cut_state_verifies", "committed_kept", "matches_clean_run", "no_duplicates",
                 "no_index_gaps", "final_count", "no_leftovers", "store_verifies", "resume_clean"),
    "export": ("reported_durable", "cut_state_verifies", "committed_kept", "no_duplicates", "no_index_gaps",
               "final_count", "no_leftovers", "published_consistent", "export_complete", "exported_unaltered",
               "dataset_validates", "dataset_verifies", "resume_clean"),
    "daemon": tuple(POWER_INVARIANTS),
}
TARGETS = {"generate": ("ops", "commit", "catalog", "time"), "export": ("ops", "publish", "catalog", "time"),
           "daemon": ("ops", "commit", "publish", "catalog", "time")}
PATTERNS = {  # trigger patterns; what the clean runs count, to draw the nth
    "commit": (("fsync", "fsyncdir"), "*/staging.zarr/episodes/*"),
    "catalog": (("write", "fsync"), "*/catalog.sqlite-wal"),
    "publish-fsync": (("fsync", "fsyncdir"), "*/dataset.versions/v*.partial*"),
    "publish-rename": (("rename",), "*/dataset.versions/v*.partial"),
}


@dataclass
class PowerTrial(cc.Trial):
    mode: str = "strict"
    cuts: list[dict[str, Any]] = field(default_factory=list)
    runs: int = 0
    reported_episodes: int = 0

    def bad(self, invariant: str, message: str) -> None:
        assert invariant in POWER_INVARIANTS, invariant
        self.violations.setdefault(invariant, []).append(message)


@dataclass
class Reported:
    """What the processes of a trial said before the cuts: durable episodes and published versions."""

    episodes: set[str] = field(default_factory=set)
    version: str | None = None

    def read(self, kind: str, stdout: str, stderr: str) -> None:
        for line in (stdout + "\n" + stderr).splitlines():
            line = line.strip()
            if not line.startswith("{"):
                continue
            try:
                msg = json.loads(line)
            except ValueError:
                continue
            if msg.get("event") == "episode_committed":
                self.episodes.add(str(msg["episode"]))
            version = msg.get("version") if msg.get("event") == "export" or kind == "export" else None
            if isinstance(version, str) and (self.version is None or version > self.version):
                self.version = version


class PowerCutCampaign(cc.Campaign):
    def __init__(self, args: argparse.Namespace) -> None:
        super().__init__(args)
        if args.workdir is None:
            shutil.rmtree(self.work, ignore_errors=True)  # the crash campaign's own temp folder: not used
        self.work = Path(args.workdir or Path(os.environ.get("TMPDIR", "/tmp")) / f"power-cut-{os.getpid()}")
        self.work.mkdir(parents=True, exist_ok=True)
        self.clean: dict[str, dict[str, Any]] = {}  # per kind: ops, seconds, matching counts of a clean FS run

    # ------------------------------------------------------------------ set-up
    def setup(self) -> None:
        super().setup()
        for kind in self.args.kinds:
            folder = self.work / f"clean-{kind}"
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir()
            self.prepare(kind, folder)
            counters = [{"ops": list(ops), "path": path, "nth": 10**9} for ops, path in PATTERNS.values()]
            started = time.monotonic()
            run = self.run_once(kind, folder, "strict", None, None, counters=counters)
            if run["cut"] is not None or run["code"] != 0:
                raise SystemExit(f"power_cut: the clean {kind} run on the file system failed (exit {run['code']}):\n"
                                 f"{run['stderr'][-3000:]}")
            self.clean[kind] = {"ops": run["ops"], "seconds": time.monotonic() - started,
                                "matches": dict(zip(PATTERNS, run["matches"]))}
            if kind == "generate":
                got = cc.identities(cc.attempt_rows(folder / "disk" / "store"))
                if got != self.reference:
                    raise SystemExit("power_cut: the clean generate run on the file system differs from the one "
                                     f"on a plain folder: {got} vs {self.reference}")
            print(f"set-up: clean {kind} run on the file system: {run['ops']} mutating operations, "
                  f"{self.clean[kind]['seconds']:.1f} s, matches {self.clean[kind]['matches']}", flush=True)
            shutil.rmtree(folder, ignore_errors=True)

    def prepare(self, kind: str, folder: Path) -> None:
        disk = folder / "disk"
        disk.mkdir(parents=True)
        if kind == "export":
            incremental = self.rng.random() < 0.5
            template = self.work / ("template-incremental" if incremental else "template-first")
            for name in ("store", "dataset", versions_dir(Path("dataset")).name):
                src = template / name
                if src.is_symlink():
                    os.symlink(os.readlink(src), disk / name)
                elif src.exists():
                    subprocess.run(["cp", "-a", str(src), str(disk / name)], check=True)  # keeps hard links
            (folder / "note").write_text("incremental" if incremental else "first export")
        if kind == "daemon":
            self.job_file(folder)

    def job_file(self, folder: Path) -> Path:
        """The crash campaign's job file, with the store and dataset on the mount (absolute paths)."""
        job = super().job_file(folder)
        mnt = folder / "mnt"
        text = job.read_text().replace('dir = "store"', f'dir = "{mnt / "store"}"')
        text = text.replace('dir = "dataset"', f'dir = "{mnt / "dataset"}"')
        text = text.replace("every_episodes = 3", f"every_episodes = {max(1, self.n - 1)}")
        job.write_text(text)
        return job

    def argv(self, kind: str, folder: Path) -> list[str]:
        mnt = folder / "mnt"
        if kind == "generate":
            return [*self.gen_argv(mnt / "store"), "--json-logs"]
        if kind == "export":
            return cc.cli("export", "--store", str(mnt / "store"), "--out", str(mnt / "dataset"), "--json")
        return cc.cli("daemon", "--config", str(folder / "job.toml"), "--json-logs")

    # ------------------------------------------------------------------ one run on the file system
    def run_once(self, kind: str, folder: Path, mode: str, trigger: dict[str, Any] | None, at_s: float | None,
                 counters: list[dict[str, Any]] | None = None, seed: int = 0) -> dict[str, Any]:
        """Mount the disk, run the kind's CLI on it, cut as drawn (or not), unmount. What happened."""
        runs = sorted(folder.glob("run*.out"))
        tag = f"run{len(runs)}"
        fs = PowerCut(folder / "disk", folder / "mnt", mode=mode, seed=seed, log=folder / "fs.log").mount()
        try:
            with open(folder / f"{tag}.out", "wb") as out, open(folder / f"{tag}.err", "wb") as err:
                proc = subprocess.Popen(self.argv(kind, folder), env=cc.child_env(), stdin=subprocess.DEVNULL,
                                        stdout=out, stderr=err, cwd=folder, start_new_session=True)
            self.live = proc
            fs.arm(trigger, kill_pgid=proc.pid)
            for counter in counters or []:
                fs.arm(counter)
            started = time.monotonic()
            while proc.poll() is None and fs.cut_event is None:
                if at_s is not None and time.monotonic() - started >= at_s:
                    fs.send("cut", reason=f"at {at_s:.2f} s")
                    break
                fs.wait_cut(0.02)
            matches: list[int] = []
            stats = None
            if fs.cut_event is None and proc.poll() is not None:
                proc.wait()
                try:
                    stats = fs.stats()
                except queue.Empty:  # the trigger fired as the run ended (a loaded machine): a cut after all
                    stats = None
            if stats is not None:
                seen = [t["seen"] for t in stats.get("triggers", [])]
                matches = seen[1:] if trigger else seen
                done = fs.unmount()
                cut = None
            else:
                done = fs.wait_done()
                cut = done["cut"]
            code = proc.wait(timeout=120)
        finally:
            self.live = None
            if fs.proc is not None and fs.proc.poll() is None:
                fs._abort()
        return {"cut": cut, "code": code, "ops": done.get("ops"), "matches": matches,
                "seconds": time.monotonic() - started, "stdout": (folder / f"{tag}.out").read_text(errors="replace"),
                "stderr": (folder / f"{tag}.err").read_text(errors="replace")}

    # ------------------------------------------------------------------ drawing a cut
    def draw(self, kind: str, target: str, shrink: float, fraction: float = 1.0
             ) -> tuple[dict[str, Any] | None, float | None]:
        clean, rng = self.clean[kind], self.rng
        if target == "time":
            return None, rng.uniform(0.0, clean["seconds"]) * shrink * fraction
        if target == "ops":
            return {"at_op": max(1, int(rng.uniform(1, clean["ops"] * shrink * fraction)))}, None
        if target == "publish":
            name = rng.choice(("publish-fsync", "publish-rename"))
        else:
            name = target
        ops, path = PATTERNS[name]
        count = max(1, int(clean["matches"].get(name, 1) * shrink))
        after = rng.randint(0, 8) if name == "publish-rename" else rng.choice((0, 0, 1, 2, 3))
        return {"ops": list(ops), "path": path, "nth": rng.randint(1, count), "after": after}, None

    # ------------------------------------------------------------------ a trial
    def trial(self, n: int, kind: str, target: str) -> PowerTrial:  # type: ignore[override]
        modes = self.args.modes
        trial = PowerTrial(n, kind, target, mode=modes[(n // len(self.args.kinds)) % len(modes)])
        started = time.monotonic()
        folder = self.work / f"trial{n:03d}-{kind}-{target}-{trial.mode}"
        try:
            self._trial(trial, folder)
        except Exception as exc:  # a harness failure is reported, never hidden
            trial.note = f"harness error: {type(exc).__name__}: {exc}"
            trial.bad("resume_clean", f"harness: {traceback.format_exc()[-1500:]}")
        trial.seconds = time.monotonic() - started
        trial.killed = bool(trial.cuts)
        if folder.exists() and not trial.violations and not self.args.keep:
            shutil.rmtree(folder, ignore_errors=True)
        return trial

    def _trial(self, trial: PowerTrial, folder: Path) -> None:
        kind = trial.kind
        disk = folder / "disk"
        store, out = disk / "store", disk / "dataset"
        reported = Reported()
        snapshots: list[dict[str, Any]] = []
        first_state: dict[str, Any] | None = None
        for k in range(self.args.cuts_per_trial):
            run = None
            for attempt in range(3 if k == 0 else 1):
                if k == 0:  # a fresh disk for every try: what an earlier try's process reported is gone with it
                    shutil.rmtree(folder, ignore_errors=True)
                    folder.mkdir(parents=True)
                    self.prepare(kind, folder)
                    reported = Reported()
                    first_state = self._snapshot(trial, store, out)
                    trial.note = (folder / "note").read_text() if (folder / "note").exists() else ""
                target = trial.target if k == 0 else "ops"
                trigger, at_s = self.draw(kind, target, 0.6 ** attempt, 1.0 if k == 0 else 0.5)
                before = self._snapshot(trial, store, out)["dataset"]
                run = self.run_once(kind, folder, trial.mode, trigger, at_s, seed=self.rng.randrange(2**31))
                trial.runs += 1
                trial.tries = attempt + 1
                reported.read(kind, run["stdout"], run["stderr"])
                if run["cut"] is not None:
                    break
            assert run is not None
            if run["cut"] is None:  # the run finished first: it was the last run
                if run["code"] != 0 or "Traceback" in run["stderr"]:
                    trial.bad("resume_clean", f"{kind} run {trial.runs} exited {run['code']}: {run['stderr'][-800:]}")
                if k == 0:
                    trial.note += " (the process finished before every cut point, 3 tries)"
                break
            cut = dict(run["cut"])
            cut["landed"] = self.landed(cut)
            cut["at_s"] = round(run["seconds"], 2)
            trial.cuts.append(cut)
            trial.landed.append(cut["landed"])
            state = self._snapshot(trial, store, out)
            state["old_dataset"] = before
            self._check_cut(trial, store, out, state, reported, first_state)
            snapshots.append(state)
        else:
            self._last_run(trial, folder)
        trial.reported_episodes = len(reported.episodes)
        trial.committed_at_kill = snapshots[0]["store"].committed if snapshots else 0
        self._final_checks(trial, folder, snapshots, first_state)

    def landed(self, cut: dict[str, Any]) -> str:
        """Where the cut fell, from the file system's trail of the operations before it (the last one failed)."""
        trail = cut.get("trail") or ["? ?"]
        op, _, path = trail[-1].partition(" ")
        swapped = any(".link-" in t and t.startswith("rename") for t in trail)
        if "/.link-" in path or (op == "rename" and ".partial" in path and ".versions/" in path):
            return "publish:rename" if ".partial" in path else "publish:link-swap"
        if ".versions/" in path and ".partial" in path:
            return "publish:fsync" if op.startswith("fsync") else "export:build"
        if path.endswith(".versions") or (op == "fsyncdir" and path == "/"):
            return "publish:fsync-folder"
        if "catalog.sqlite" in path:
            where = "fsync" if op.startswith("fsync") else "write"
            if path.endswith("catalog.sqlite"):
                where = "checkpoint"
            return f"publish:catalog-{where}" if swapped else f"catalog:{where}"
        if "staging.zarr/episodes" in path:
            return "staging:commit-fsync" if op.startswith("fsync") else "staging:write"
        if ".versions/" in path:
            return "export:prune-or-clean"
        return "store:other" if "/store" in path else f"other:{op}"

    def _last_run(self, trial: PowerTrial, folder: Path) -> None:
        """Run the job to its end after the last cut (export and daemon in this process unless --cli-resume)."""
        kind, mnt = trial.kind, folder / "mnt"
        if kind == "generate" or self.args.cli_resume:
            run = self.run_once(kind, folder, trial.mode, None, None)
            trial.runs += 1
            if run["code"] != 0 or "Traceback" in run["stderr"]:
                trial.bad("resume_clean", f"the last {kind} run exited {run['code']}: {run['stderr'][-800:]}")
            return
        with PowerCut(folder / "disk", mnt, mode=trial.mode, log=folder / "fs.log"):
            trial.runs += 1
            if kind == "export":
                self._resume_export(trial, mnt / "store", mnt / "dataset", folder)
            else:
                self._resume_daemon(trial, folder)

    # ------------------------------------------------------------------ checks
    def _snapshot(self, trial: cc.Trial, store: Path, out: Path | None) -> dict[str, Any]:
        try:
            return super()._snapshot(trial, store, out)
        except Exception as exc:  # the published version cannot even be read: a broken publish
            trial.bad("published_consistent", f"after cut {len(getattr(trial, 'cuts', []))} the published dataset "
                                              f"cannot be read: {type(exc).__name__}: {exc}")
            return super()._snapshot(trial, store, None)

    def _check_cut(self, trial: PowerTrial, store: Path, out: Path, state: dict[str, Any], reported: Reported,
                   first: dict[str, Any] | None) -> None:
        committed = state["committed"]
        lost = sorted(reported.episodes - set(committed))
        if lost:
            trial.bad("reported_durable", f"cut {len(trial.cuts)}: episodes reported committed are not committed "
                                          f"after the cut: {lost[:4]}")
        if reported.version is not None:
            now = state["dataset"]["version"] if state["dataset"] else None
            if now is None or now < reported.version:
                trial.bad("reported_durable", f"cut {len(trial.cuts)}: version {reported.version} was reported "
                                              f"published; after the cut the dataset is at {now}")
        self._verify_cut_store(trial, store)
        if trial.kind != "generate":
            old = state.get("old_dataset")
            old_ids = {e["episode_id"] for e in old["marker"]["episodes"]} if old else set()
            allowed = [old_ids, set(committed)] if trial.kind == "export" else None
            if state["dataset"] is not None or old is not None:
                self._check_published(trial, store, out, state, allowed)
        if first is not None:
            for problem in check_committed_kept(first["store"], state["store"]):
                trial.bad("committed_kept", f"cut {len(trial.cuts)}: {problem}")

    def _verify_cut_store(self, trial: PowerTrial, store: Path) -> None:
        rows = cc.attempt_rows(store)
        if rows is None:
            # A hot rollback journal (a cut while a new catalog switched to WAL, before anything was committed)
            # blocks read-only readers until the next writer rolls it back: not a loss.
            hot = (store / f"{cc.CATALOG_FILE}-journal").exists()
            if (store / cc.CATALOG_FILE).exists() and (store / cc.CATALOG_FILE).stat().st_size and not hot:
                trial.bad("cut_state_verifies", f"cut {len(trial.cuts)}: the catalog cannot be read after the cut")
            return
        from demoforge.storage.store import open_store

        try:
            with open_store(store) as view:
                if view.fingerprint is None:
                    return
                report = view.verify()
        except Exception as exc:
            trial.bad("cut_state_verifies", f"cut {len(trial.cuts)}: the store cannot be opened: "
                                            f"{type(exc).__name__}: {exc}")
            return
        if not report.ok:
            trial.bad("cut_state_verifies", f"cut {len(trial.cuts)}: " + "; ".join(
                f"{p.episode_id}: {p.problem}" for p in report.problems)[:800])

    def _final_checks(self, trial: PowerTrial, folder: Path, snapshots: list[dict[str, Any]],
                      first: dict[str, Any] | None) -> None:
        disk = folder / "disk"
        store, out = disk / "store", disk / "dataset"
        if trial.kind == "export":
            for problem in check_committed_kept(first["store"] if first else snapshot(store), snapshot(store)):
                trial.bad("committed_kept", f"{problem} (after the last export)")
        else:
            state = snapshots[0] if snapshots else {"store": None}
            self._check_store(trial, store, {"store": state["store"]})
            for later in snapshots[1:]:
                for problem in check_committed_kept(later["store"], snapshot(store)):
                    trial.bad("committed_kept", problem)
        if trial.kind == "generate":
            return
        final_state = {"old_dataset": first.get("dataset") if first else None,
                       "dataset": snapshots[-1]["dataset"] if snapshots else None}
        try:
            self._check_final_dataset(trial, store, out, final_state)
        except Exception as exc:  # an unreadable dataset after the last run
            trial.bad("export_complete", f"the dataset cannot be read after the last run: {type(exc).__name__}: {exc}")
        from demoforge.storage.lerobot.file_checksums import verify_dataset

        try:
            report = verify_dataset(out)
            if not report.ok:
                trial.bad("dataset_verifies", "; ".join(f"{p.path}: {p.problem}" for p in report.problems)[:800])
        except Exception as exc:
            trial.bad("dataset_verifies", f"{type(exc).__name__}: {exc}")

    # ------------------------------------------------------------------ the campaign
    targets = TARGETS  # the crash campaign's run() cycles these

    def describe(self, trial: cc.Trial) -> str:
        assert isinstance(trial, PowerTrial)
        bad = sum(len(v) for v in trial.violations.values())
        where = ", ".join(trial.landed) or "-"
        return (f"trial {trial.n:3d} {trial.kind:8s} {trial.target:7s} {trial.mode:7s} cuts {len(trial.cuts)} "
                f"runs {trial.runs} landed {where:45s} committed@cut {trial.committed_at_kill} reported "
                f"{trial.reported_episodes} violations {bad} ({trial.seconds:.1f} s)"
                f"{'  ' + trial.note if trial.note else ''}")


def summarize(trials: list[PowerTrial], kinds: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for kind in kinds:
        mine = [t for t in trials if t.kind == kind]
        out[kind] = {
            "trials": len(mine), "cuts": sum(len(t.cuts) for t in mine),
            "by_target": dict(Counter(t.target for t in mine for _ in t.cuts)),
            "by_mode": dict(Counter(t.mode for t in mine for _ in t.cuts)),
            "landed": dict(sorted(Counter(label for t in mine for label in t.landed).items())),
            "violations": {inv: sum(len(t.violations.get(inv, [])) for t in mine) for inv in APPLIES[kind]},
            "seconds": round(sum(t.seconds for t in mine), 1)}
    return out


def render(summary: dict[str, Any], kinds: list[str]) -> str:
    lines = ["| kind | trials | cuts | by target (first cut of a trial; later cuts: ops) | by mode | where the cuts "
             "landed (the last operation) |", "|---|---|---|---|---|---|"]
    for kind in kinds:
        s = summary[kind]
        fmt = lambda d: ", ".join(f"{k} {v}" for k, v in d.items())  # noqa: E731
        lines.append(f"| {kind} | {s['trials']} | {s['cuts']} | {fmt(s['by_target'])} | {fmt(s['by_mode'])} | "
                     f"{fmt(s['landed'])} |")
    return "\n".join(lines + [""] + cc.invariant_table(summary, kinds, POWER_INVARIANTS, "cuts"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, required=True, help="trials in all (round-robin over the kinds)")
    parser.add_argument("--seed", type=int, default=0, help="seed of every draw (default: 0)")
    parser.add_argument("--kinds", default="generate,export,daemon", help="default: generate,export,daemon")
    parser.add_argument("--task", default="fetch-pick-place", choices=sorted(cc.TASKS),
                        help="default: fetch-pick-place (1 cycle, 64x64, h264)")
    parser.add_argument("--episodes", type=int, default=None, help="target episodes per trial (default: the task's)")
    parser.add_argument("--modes", default="strict,subset,renames",
                        help="file-system models, cycled over trials (default: strict,subset,renames)")
    parser.add_argument("--cuts-per-trial", type=int, default=2,
                        help="cuts per trial: the first run, then re-runs, are cut (default: 2)")
    parser.add_argument("--out", type=Path, default=None, help="write the JSON report here")
    parser.add_argument("--cli-resume", action="store_true",
                        help="run the last export / daemon run as a CLI process too (default: in this process)")
    parser.add_argument("--workdir", type=Path, default=None, help="where trials run (default: a temp folder)")
    parser.add_argument("--keep", action="store_true", help="keep every trial's folder")
    args = parser.parse_args(argv)
    args.kinds = [k.strip() for k in args.kinds.split(",") if k.strip()]
    args.modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if [k for k in args.kinds if k not in TARGETS] or not args.kinds or args.trials < 1 \
            or [m for m in args.modes if m not in MODES] or not args.modes or args.cuts_per_trial < 1:
        parser.error("--kinds takes generate, export, daemon; --modes strict, subset, renames; --trials and "
                     "--cuts-per-trial must be >= 1")
    started = time.monotonic()
    campaign = PowerCutCampaign(args)
    try:
        campaign.setup()
        trials = [t for t in campaign.run() if isinstance(t, PowerTrial)]
    except FuseUnavailable as exc:
        print(f"power_cut: {exc}", file=sys.stderr)
        return 2
    finally:
        if campaign.live is not None and campaign.live.poll() is None:
            campaign.live.kill()
            campaign.live.wait()
    summary = summarize(trials, args.kinds)
    total = sum(len(m) for t in trials for m in t.violations.values())
    cuts = sum(len(t.cuts) for t in trials)
    print()
    print(render(summary, args.kinds))
    print(f"\n{len(trials)} trials, {cuts} power cuts, {total} violations, {time.monotonic() - started:.0f} s "
          f"(task {args.task}, {campaign.n} episodes per trial, modes {','.join(args.modes)}, seed {args.seed})")
    return cc.finish(args, campaign, started, total, {
        "modes": args.modes, "clean_runs": campaign.clean, "trials_total": len(trials), "cuts": cuts,
        "invariants": POWER_INVARIANTS, "summary": summary, "trials": [t.__dict__ for t in trials]})

if __name__ == "__main__":
    sys.exit(main())
