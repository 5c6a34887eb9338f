"""`demoforge edit` against LeRobot 0.6.1's own dataset tools (what `lerobot-edit-dataset` runs) on the same
dataset, in one run: delete 10% of the episodes, and a 90/10 split. Wall time (ratio) and fidelity.

    MUJOCO_GL=egl HF_HUB_OFFLINE=1 .venv/bin/python tools/bench_edit.py [--episodes 200] [--work DIR]

The dataset is generated once (fetch-pick-place, one pick-and-place cycle, 64x64 camera, LeRobot's default
AV1 settings) into --work and reused by later runs (generation is not timed). Each side edits a fresh copy.
Timed: demoforge's ``edit_dataset`` (a new version in place / two sibling datasets) against
``lerobot.datasets.dataset_tools.delete_episodes`` / ``split_dataset`` (new datasets; they also load the result,
as they return a LeRobotDataset). Imports and one warm-up call of each happen before timing; each operation is
timed --repeat times on each side, the median reported.

Fidelity: every kept episode's packets are hashed in the source and in demoforge's result (they must be
identical: 0 mismatches); LeRobot's result is decoded and compared with the source's decoded frames (PSNR).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from fractions import Fraction
from pathlib import Path

os.environ.setdefault("MUJOCO_GL", "egl")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

import av  # noqa: E402
import numpy as np  # noqa: E402

from edit_helpers import copy_dataset, episodes_meta  # noqa: E402

CAM = "observation.images.front"


def make_dataset(work: Path, episodes: int) -> Path:
    dataset = work / "dataset"
    if dataset.is_symlink() and len(episodes_meta(dataset)) == episodes:
        return dataset
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    command = [sys.executable, "-m", "demoforge.pipeline.cli", "generate", "--task", "fetch-pick-place",
               "--option", "cycles=1", "--option", "image_size=64", "--episodes", str(episodes),
               "--store", str(work / "store"), "--export", str(dataset)]
    print("generating:", " ".join(command[2:]), flush=True)
    subprocess.run(command, check=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    return dataset


def spans(dataset: Path, key: str = CAM) -> list[tuple[Path, float, float]]:
    root = dataset.resolve()
    info = json.loads((root / "meta" / "info.json").read_text())
    return [(root / info["video_path"].format(video_key=key, chunk_index=m[f"videos/{key}/chunk_index"],
                                              file_index=m[f"videos/{key}/file_index"]),
             m[f"videos/{key}/from_timestamp"], m[f"videos/{key}/to_timestamp"]) for m in episodes_meta(dataset)]


def packets(path: Path, start: float, end: float, fps: int) -> list[str]:
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        if stream.time_base is None:
            raise ValueError(f"{path}: its video stream has no time base")
        tb = Fraction(stream.time_base)
        hashes = [hashlib.sha256(bytes(p)).hexdigest() for p in container.demux(stream)
                  if p.size and p.pts is not None and start - 0.5 / fps <= float(p.pts * tb) < end - 0.5 / fps]
    return hashes


def frames(path: Path, start: float, end: float, fps: int) -> list[np.ndarray]:
    from demoforge.storage.video import decode_span

    return decode_span(path, start, end, fps)


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2)
    return float("inf") if mse == 0 else 10 * np.log10(255.0**2 / mse)


def fidelity(source: Path, result: Path, kept: list[int], fps: int) -> dict[str, float]:
    """Packets identical (count of kept episodes whose packets differ) and decoded PSNR against the source."""
    src, out = spans(source), spans(result)
    differ, values = 0, []
    for new, old in enumerate(kept):
        if packets(*src[old], fps) != packets(*out[new], fps):
            differ += 1
        a, b = frames(*src[old], fps), frames(*out[new], fps)
        if len(a) != len(b):
            raise SystemExit(f"episode {old}: {len(a)} source frames, {len(b)} in {result}")
        values += [psnr(x, y) for x, y in zip(a, b)]
    finite = [v for v in values if np.isfinite(v)]
    return {"episodes_with_different_packets": differ,
            "psnr_mean_db": float(np.mean(finite)) if finite else float("inf"),
            "psnr_min_db": float(min(finite)) if finite else float("inf"),
            "identical_frames": sum(1 for v in values if not np.isfinite(v)), "frames": len(values)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--episodes", type=int, default=200,
                        help="episodes of the generated dataset (default 200; at least 10: every 10th is deleted)")
    parser.add_argument("--repeat", type=int, default=3, help="timed runs of each operation on each side (median)")
    parser.add_argument("--work", type=Path, default=Path("runs/bench-edit"),
                        help="where the dataset is generated (reused) and the edits are written")
    args = parser.parse_args()
    if args.episodes < 10:
        parser.error(f"--episodes must be at least 10 (every 10th episode is deleted), got {args.episodes}")
    load_before = Path("/proc/loadavg").read_text().split()[:3]
    from lerobot.datasets.dataset_tools import delete_episodes, split_dataset
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    from demoforge.storage.lerobot.edit_selection import parse_split
    from demoforge.storage.lerobot.edit import edit_dataset

    dataset = make_dataset(args.work, args.episodes)
    fps = json.loads((dataset.resolve() / "meta" / "info.json").read_text())["fps"]
    n = len(episodes_meta(dataset))
    deleted = list(range(5, n, 10))  # 10%, spread over the file
    kept = [i for i in range(n) if i not in deleted]
    runs = args.work / "runs"
    shutil.rmtree(runs, ignore_errors=True)
    runs.mkdir()

    def lerobot(root: Path) -> LeRobotDataset:
        return LeRobotDataset("bench/edit", root=root, video_backend="pyav")

    # warm-up, untimed: each side's first call pays lazy imports and codec set-up
    edit_dataset(copy_dataset(dataset, runs / "warm-ours"), delete="0")
    delete_episodes(lerobot(dataset.resolve()), [0], output_dir=runs / "warm-lerobot", repo_id="bench/warm")

    results: dict[str, list[float]] = {}

    def measure(name: str, fn) -> None:  # fn(k) does the k-th repetition into its own folder
        results[name] = []
        for k in range(args.repeat):
            started = time.perf_counter()
            fn(k)
            results[name].append(time.perf_counter() - started)

    copies = [copy_dataset(dataset, runs / f"ours-delete-{k}") for k in range(args.repeat)]  # (not timed)
    measure("delete 10%: demoforge", lambda k: edit_dataset(copies[k], delete=",".join(map(str, deleted))))
    measure("delete 10%: lerobot", lambda k: delete_episodes(
        lerobot(dataset.resolve()), deleted, output_dir=runs / f"lerobot-delete-{k}", repo_id="bench/deleted"))
    measure("split 90/10: demoforge", lambda k: edit_dataset(
        dataset, split=parse_split("train=0.9,val=0.1"), seed=0, out_root=runs / f"ours-split-{k}"))
    measure("split 90/10: lerobot", lambda k: split_dataset(
        lerobot(dataset.resolve()), {"train": 0.9, "val": 0.1}, output_dir=runs / f"lerobot-split-{k}"))
    load_after = Path("/proc/loadavg").read_text().split()[:3]

    ours_fidelity = fidelity(dataset, copies[0], kept, fps)
    lerobot_fidelity = fidelity(dataset, runs / "lerobot-delete-0", kept, fps)
    ours_train = [int(r["dataset_episode_index"]) for r in _sidecar_source_indices(dataset, runs / "ours-split-0" / "train")]
    split_fidelity = fidelity(dataset, runs / "ours-split-0" / "train", ours_train, fps)
    lerobot_train = list(range(int(n * 0.9)))  # LeRobot's split: the first 90% of the episodes
    lerobot_split_fidelity = fidelity(dataset, runs / "lerobot-split-0" / "train", lerobot_train, fps)

    print(f"\ndataset: {n} episodes, {sum(m['length'] for m in episodes_meta(dataset))} frames, camera "
          f"{CAM} (AV1, LeRobot's default settings); load average before {' '.join(load_before)}, after "
          f"{' '.join(load_after)}")
    print(f"median of {args.repeat} run(s) each (all runs in brackets)")
    print(f"{'operation':<14} {'demoforge s':>12} {'lerobot s':>10} {'ratio':>7}")
    for op in ("delete 10%", "split 90/10"):
        a, b = results[f"{op}: demoforge"], results[f"{op}: lerobot"]
        ma, mb = statistics.median(a), statistics.median(b)
        print(f"{op:<14} {ma:>12.2f} {mb:>10.2f} {mb / ma:>6.1f}x   "
              f"[{', '.join(f'{x:.2f}' for x in a)}] [{', '.join(f'{x:.2f}' for x in b)}]")
    print("\nfidelity (kept episodes against the source)")
    for name, f in (("delete, demoforge", ours_fidelity), ("delete, lerobot", lerobot_fidelity),
                    ("split train, demoforge", split_fidelity), ("split train, lerobot", lerobot_split_fidelity)):
        print(f"  {name:<24} packets differ in {f['episodes_with_different_packets']} episode(s); "
              f"{f['identical_frames']}/{f['frames']} frames bit-identical; PSNR mean {f['psnr_mean_db']:.1f} dB, "
              f"min {f['psnr_min_db']:.1f} dB")


def _sidecar_source_indices(source: Path, part: Path) -> list[dict]:
    """The source records of a part's episodes, in the part's order (matched by store and staging episode)."""
    from edit_helpers import sidecar

    by_id = {(r["store_id"], r["staging_episode_id"]): r for r in sidecar(source)}
    return [by_id[(r["store_id"], r["staging_episode_id"])] for r in sidecar(part)]


if __name__ == "__main__":
    main()
