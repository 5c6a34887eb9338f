"""Peak memory of one export against the number of pending episodes: a streaming export should not grow.

    .venv/bin/python tools/bench_export_memory.py [--counts 20,400] [--seed-episodes 4] [--compare-with DIR]

Generates a few small fetch-pick-place episodes (1 cycle, 64x64, h264) into a seed store (with the code being
measured, so the staging format is the one it reads), then builds stores
with 20 and 400 pending episodes by copying those staged episodes under new episode ids and catalog rows
(real Zarr folders and rows, the same bytes and content hashes, so export reads and checks them as usual).
Each store is exported once by ``demoforge export`` in a child process; its peak RSS comes from
``wait4``'s rusage. Prints episodes, frames, seconds, frames/s and peak RSS per count and the ratio of the
peaks. ``--compare-with DIR`` also runs the same exports with the code checked out in DIR (e.g. ``git archive
main | tar -x -C DIR``), for a before/after in one run.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def run(argv: list[str], code_dir: Path) -> tuple[float, float, str]:
    """Run a child; (seconds, peak RSS in MB, stderr)."""
    env = dict(os.environ, PYTHONPATH=str(code_dir), HF_HUB_OFFLINE="1", MUJOCO_GL=os.environ.get("MUJOCO_GL", "egl"))
    started = time.monotonic()
    proc = subprocess.Popen(argv, env=env, cwd=code_dir, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _pid, status, usage = os.wait4(proc.pid, 0)
    seconds = time.monotonic() - started
    out, err = proc.stdout.read(), proc.stderr.read()  # type: ignore[union-attr]
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(argv[2:5])} failed ({proc.returncode}):\n{out}\n{err[-3000:]}")
    return seconds, usage.ru_maxrss / 1024, out


def replicate(seed: Path, dest: Path, count: int) -> int:
    """A copy of ``seed`` holding ``count`` committed episodes (the seed's, repeated); returns the frames.
    The copies are staged by copying folders and recorded through the catalog's own transitions."""
    from demoforge.storage.catalog import Catalog
    from demoforge.storage.staging import staged_episode_path

    shutil.copytree(seed, dest)
    catalog = Catalog.open_existing(dest)
    try:
        rows = catalog.committed()
        for i in range(len(rows), count):
            row = rows[i % len(rows)]
            new_id = f"ep{i:08d}-a00"
            shutil.copytree(staged_episode_path(dest, row.episode_id), staged_episode_path(dest, new_id))
            catalog.begin_attempt(i, 0, new_id, row.seed)
            catalog.commit(new_id, frames=row.frames or 0, video_bytes=row.video_bytes,
                           content_hash=row.content_hash or "", record=dict(row.record or {}, episode_index=i))
        return sum(r.frames or 0 for r in catalog.committed())
    finally:
        catalog.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--counts", default="20,400", help="pending episodes per export (default: 20,400)")
    parser.add_argument("--seed-episodes", type=int, default=4, help="episodes generated for real (default: 4)")
    parser.add_argument("--compare-with", type=Path, default=None, metavar="DIR",
                        help="also export with the code in DIR (default: off)")
    args = parser.parse_args()
    counts = [int(c) for c in args.counts.split(",")]
    work = Path(tempfile.mkdtemp(prefix="demoforge-export-memory-"))
    try:
        codes = [("this checkout", REPO)] + ([("compare", args.compare_with.resolve())] if args.compare_with else [])
        print(f"{'code':<14}{'episodes':>9}{'frames':>9}{'seconds':>9}{'frames/s':>10}{'peak RSS MB':>13}")
        peaks: dict[str, list[float]] = {}
        for label, code in codes:
            # Each code generates its own seed store: its staging format is the one it reads.
            seed = work / f"seed-{label.replace(' ', '-')}"
            run([sys.executable, "-m", "demoforge.pipeline.cli", "generate", "--task", "fetch-pick-place",
                 "--option", "cycles=1", "--option", "image_size=64", "--codec", "h264",
                 "--episodes", str(args.seed_episodes), "--store", str(seed)], code)
            for count in counts:
                store = work / f"{label.replace(' ', '-')}-{count}"
                frames = replicate(seed, store, count)
                seconds, peak, _out = run([sys.executable, "-m", "demoforge.pipeline.cli", "export", "--store",
                                           str(store), "--out", str(work / f"{store.name}-dataset")], code)
                peaks.setdefault(label, []).append(peak)
                print(f"{label:<14}{count:>9}{frames:>9}{seconds:>9.1f}{frames / seconds:>10.0f}{peak:>13.1f}",
                      flush=True)
                shutil.rmtree(store)
        for label, values in peaks.items():
            print(f"{label}: peak RSS at {counts[-1]} vs {counts[0]} pending episodes: "
                  f"{(values[-1] / values[0] - 1) * 100:+.1f}%")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
