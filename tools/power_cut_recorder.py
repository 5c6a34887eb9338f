"""Power cuts under a Recorder loop: nothing that ``save_episode()`` returned may be lost.

A user's recording loop (tests/recorder_loop.py: deterministic frames, ``saved <index>`` printed after each
``save_episode`` returns, to a file off the cut disk) runs with its staging store and dataset on the power-cut
file system (tools/powercut_fs.py: whatever was not fsynced is forgotten, per mode). The power is cut at a
uniform mutating operation of a clean run; then the disk is mounted again and the same loop run to its target.

Checked after every trial:
- ``returned_kept``: no episode whose ``save_episode`` returned before the cut is recorded again after it;
- ``complete``: the final dataset loads with LeRobotDataset and holds every episode once, in order, with exactly
  the rows its loop made.

    nice -n 10 .venv/bin/python tools/power_cut_recorder.py --trials 30 [--seed 0] [--episodes 6]

Needs root, /dev/fuse, fuse3 and pyfuse3 (tools/setup.sh installs them).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tools"))
sys.path.insert(0, str(REPO / "tests"))

from powercut_fs import MODES, PowerCut  # noqa: E402

import recorder_loop as loop  # noqa: E402


def child_env() -> dict[str, str]:
    return {**os.environ, "HF_HUB_OFFLINE": "1", "MUJOCO_GL": "egl", "PYTHONUNBUFFERED": "1"}


def run_loop(folder: Path, episodes: int, mode: str, at_op: int | None, seed: int, tag: str) -> dict:
    """Mount the disk, run the loop on it (cut at ``at_op``, or to its end), unmount or wait for the cut."""
    fs = PowerCut(folder / "disk", folder / "mnt", mode=mode, seed=seed, log=folder / "fs.log").mount()
    saved = folder / f"{tag}.saved"
    with open(saved, "w") as out, open(folder / f"{tag}.err", "w") as err:
        proc = subprocess.Popen([sys.executable, str(REPO / "tests" / "recorder_loop.py"),
                                 str(folder / "mnt" / "d"), str(episodes)], env=child_env(), stdout=out,
                                stderr=err, stdin=subprocess.DEVNULL, start_new_session=True)
        fs.arm({"at_op": at_op} if at_op else None, kill_pgid=proc.pid)
        while proc.poll() is None and fs.cut_event is None:
            fs.wait_cut(0.05)
        cut = fs.cut_event is not None
        done = fs.wait_done() if cut else fs.unmount()
        code = proc.wait(timeout=120)
    lines = [line.split() for line in saved.read_text().splitlines() if line.startswith("saved ")]
    return {"cut": cut, "code": code, "ops": done.get("ops"), "saved": [int(parts[1]) for parts in lines],
            "stderr": (folder / f"{tag}.err").read_text(errors="replace")[-2000:]}


def check_dataset(root: Path, episodes: int) -> str | None:
    import pyarrow.parquet as pq
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    try:
        dataset = LeRobotDataset("local/power-cut", root=root)
        if dataset.meta.total_episodes != episodes:
            return f"{dataset.meta.total_episodes} episodes, expected {episodes}"
        table = pq.read_table(sorted(root.resolve().glob("data/*/*.parquet"))).to_pandas()
    except Exception as exc:  # noqa: BLE001 - any failure to load is the finding
        return f"does not load: {type(exc).__name__}: {exc}"
    expected = [loop.frame(e, s)["observation.state"].tolist() for e in range(episodes) for s in range(loop.length(e))]
    if [v.tolist() for v in table["observation.state"]] != expected:
        return "rows differ from what the loop recorded"
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter,
                                     epilog="example:\n  nice -n 10 .venv/bin/python tools/power_cut_recorder.py "
                                            "--trials 30 --seed 0")
    parser.add_argument("--trials", type=int, default=10, help="power cuts, one per trial (default: 10)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the cut moments and modes (default: 0)")
    parser.add_argument("--episodes", type=int, default=6, help="episodes the loop records (default: 6)")
    parser.add_argument("--modes", default=",".join(MODES),
                        help=f"what the file system forgets, cycled per trial (default: {','.join(MODES)})")
    parser.add_argument("--out", type=Path, default=None, help="write the trials as JSON here (default: none)")
    args = parser.parse_args(argv)
    modes = args.modes.split(",")
    rng = random.Random(args.seed)
    work = Path(tempfile.mkdtemp(prefix="power-cut-recorder-"))
    try:
        clean = run_loop(work / "clean", args.episodes, "strict", None, 0, "run")
        if clean["cut"] or clean["code"] != 0:
            raise SystemExit(f"the clean run failed (exit {clean['code']}): {clean['stderr']}")
        print(f"set-up: a clean run makes {clean['ops']} mutating operations", flush=True)
        trials, violations = [], 0
        for n in range(args.trials):
            folder = work / f"trial-{n:03d}"
            mode, at_op = modes[n % len(modes)], rng.randint(1, clean["ops"])
            started = time.monotonic()
            first = run_loop(folder, args.episodes, mode, at_op, n, "cut")
            last = run_loop(folder, args.episodes, "strict", None, n, "resume")
            problems = []
            if last["code"] != 0:
                problems.append(f"the run after the cut exited {last['code']}: {last['stderr'][-500:]}")
            again = sorted(set(first["saved"]) & set(last["saved"]))
            if again:
                problems.append(f"episodes {again} were saved before the cut and recorded again after it")
            problem = check_dataset(folder / "disk" / "d", args.episodes)
            if problem:
                problems.append(f"dataset: {problem}")
            violations += bool(problems)
            trial = {"trial": n, "mode": mode, "at_op": at_op, "cut": first["cut"], "saved_before": first["saved"],
                     "saved_after": last["saved"], "problems": problems, "seconds": round(time.monotonic() - started, 1)}
            trials.append(trial)
            print(f"trial {n:03d} {mode:7s} op {at_op:5d}: cut={first['cut']} saved before {first['saved']}, after "
                  f"{last['saved']}: {'; '.join(problems) or 'ok'}", flush=True)
            shutil.rmtree(folder, ignore_errors=True)
        cuts = sum(t["cut"] for t in trials)
        returned = sum(len(t["saved_before"]) for t in trials)
        print(f"SUMMARY: {len(trials)} trials, {cuts} cuts, {returned} episodes returned before a cut, "
              f"{violations} trials with violations")
        if args.out:
            args.out.write_text(json.dumps({"trials": trials, "violations": violations}, indent=2))
        return 1 if violations else 0
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
