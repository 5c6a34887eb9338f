"""`demoforge convert` (LeRobot v2.1, robomimic HDF5, RLDS) and `demoforge edit --trim` against the v3.0 export
of the same fetch-pick-place store and against what LeRobot 0.6.1 offers for each, in one run (issue 60).

    MUJOCO_GL=egl HF_HUB_OFFLINE=1 nice -n 10 .venv/bin/python tools/bench_formats.py \\
        [--episodes 100] [--image-size 224] [--cycles 1] [--codec h264] [--work DIR]

The store is generated once into --work (not timed) and reused by later runs with the same settings.
Timed, each once (--repeat for more; the median is printed), each into a new output:
- baseline: ``export_stores`` of the store into a new v3.0 dataset (a fresh copy of the store each time);
- ``convert`` of that export to each format (time, size, and both as ratios to the v3.0 export's);
- LeRobot's own ``convert_dataset_v21_to_v30`` (what users run today to move between the two) on a copy of our
  v2.1 output (the copy is not timed; the script converts in place);
- ``edit --trim`` (default: the first and the last segment of every episode, ``segments=reach_0+release_<c>``)
  into a new dataset, against LeRobot re-encoding the same episodes. LeRobot 0.6.1's ``lerobot-edit-dataset``
  has no operation that drops frames (delete_episodes, split, merge, remove_feature, modify_tasks,
  convert_image_to_video, recompute_stats, reencode_videos, info); the closest is ``reencode_videos``, which
  decodes and re-encodes every frame, what a cut made by re-encoding costs at least. It is run as that command
  runs it with ``--new_root`` (copy the dataset, load it, re-encode every camera file with ``reencode_video``),
  with the source's own encoder settings (its ``reencode_dataset`` skips files already at the target settings,
  so the per-file step is called directly), in this process (no interpreter start-up or imports timed).
Imports (tensorflow, h5py, lerobot) happen before any timing. Sizes are the bytes of every file of the output.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

os.environ.setdefault("MUJOCO_GL", "egl")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
REPO = Path(__file__).resolve().parent.parent

FORMATS = ("lerobot-v2.1", "robomimic-hdf5", "rlds")


def make_store(work: Path, episodes: int, image_size: int, cycles: int, codec: str | None) -> Path:
    """The fetch-pick-place store, generated once per settings (a marker file records them)."""
    store, marker = work / "store", work / "store-settings.json"
    settings = {"episodes": episodes, "image_size": image_size, "cycles": cycles, "codec": codec}
    if marker.is_file() and json.loads(marker.read_text()) == settings:
        return store
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    command = [sys.executable, "-m", "demoforge.pipeline.cli", "generate", "--task", "fetch-pick-place",
               "--option", f"cycles={cycles}", "--option", f"image_size={image_size}", "--episodes", str(episodes),
               "--store", str(store)] + (["--codec", codec] if codec else [])
    print("generating:", " ".join(command[2:]), flush=True)
    subprocess.run(command, check=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    marker.write_text(json.dumps(settings))
    return store


def size_of(path: Path) -> int:
    """Bytes of every file under ``path`` (a file's own size; a dataset link is followed to its version)."""
    path = path.resolve()
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())


def timed(repeat: int, fn: Callable[[int], Path],
          setup: Callable[[int], object] = lambda _k: None) -> tuple[list[float], Path]:
    """Wall seconds of ``repeat`` runs of ``fn(k)`` (each writes its own output; ``setup(k)`` before it, not
    timed) and the first run's output."""
    seconds, outputs = [], []
    for k in range(repeat):
        setup(k)
        started = time.perf_counter()
        outputs.append(fn(k))
        seconds.append(time.perf_counter() - started)
    return seconds, outputs[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--episodes", type=int, default=100, help="fetch-pick-place episodes (default 100)")
    parser.add_argument("--image-size", type=int, default=224, help="camera size in pixels (default 224)")
    parser.add_argument("--cycles", type=int, default=1, help="pick-and-place cycles per episode (default 1)")
    parser.add_argument("--codec", default=None, choices=("libsvtav1", "h264", "hevc", "libaom-av1"),
                        help="the cameras' codec (default: generate's default, AV1 with LeRobot's settings)")
    parser.add_argument("--trim", default=None,
                        help="the --trim spec (default: segments=reach_0+release_<cycles-1>, each episode's first "
                             "and last segment)")
    parser.add_argument("--repeat", type=int, default=1, help="timed runs of each operation (median; default 1)")
    parser.add_argument("--work", type=Path, default=Path("runs/bench-formats"),
                        help="where the store is generated (reused) and the outputs written")
    args = parser.parse_args()
    if args.episodes < 1 or args.repeat < 1 or args.cycles < 1:
        parser.error("--episodes, --repeat and --cycles must be at least 1")
    trim_spec = args.trim or f"segments=reach_0+release_{args.cycles - 1}"
    load_before = Path("/proc/loadavg").read_text().split()[:3]

    # every import that a timed call would otherwise pay first
    for name in ("tensorflow", "tensorflow_datasets", "h5py", "demoforge.storage.convert.lerobot_v21",
                 "demoforge.storage.convert.robomimic_hdf5", "demoforge.storage.convert.rlds"):
        importlib.import_module(name)
    from lerobot.configs.video import encoder_config_from_video_info
    from lerobot.datasets.lerobot_dataset import LeRobotDataset
    from lerobot.datasets.video_utils import reencode_video
    from lerobot.scripts.convert_dataset_v21_to_v30 import convert_dataset

    from demoforge.storage.convert import convert
    from demoforge.storage.lerobot.edit import edit_dataset
    from demoforge.storage.lerobot.edit_trim import parse_trim
    from demoforge.storage.lerobot.export import export_stores

    store = make_store(args.work.resolve(), args.episodes, args.image_size, args.cycles, args.codec)
    runs = args.work.resolve() / "runs"
    shutil.rmtree(runs, ignore_errors=True)
    runs.mkdir()
    results: dict[str, tuple[list[float], Path]] = {}

    def export(k: int) -> Path:
        export_stores([runs / f"store-{k}"], runs / f"v30-{k}")
        return runs / f"v30-{k}"

    # each export from a fresh copy of the store (export writes each episode once per store)
    results["v3.0 export (baseline)"] = timed(args.repeat, export, lambda k: shutil.copytree(
        store, runs / f"store-{k}", symlinks=True))
    dataset = results["v3.0 export (baseline)"][1]
    info = json.loads((dataset.resolve() / "meta" / "info.json").read_text())
    videos = [k for k, f in info["features"].items() if f.get("dtype") == "video"]
    codec = info["features"][videos[0]]["info"]["video.codec"] if videos else "none"

    def converter(fmt: str) -> Callable[[int], Path]:
        def run(k: int) -> Path:
            out = runs / (f"{fmt}-{k}.hdf5" if fmt == "robomimic-hdf5" else f"{fmt}-{k}")
            convert(dataset, fmt, out)
            return out
        return run

    for fmt in FORMATS:
        results[f"convert {fmt}"] = timed(args.repeat, converter(fmt))

    def lerobot_back(k: int) -> Path:
        convert_dataset(repo_id=f"bench/back{k}", root=str(runs / f"lerobot-v21-to-v30-{k}"), push_to_hub=False)
        return runs / f"lerobot-v21-to-v30-{k}"

    # on a copy of our v2.1 output (LeRobot's script converts in place)
    results["lerobot v2.1 -> v3.0 (our v2.1)"] = timed(args.repeat, lerobot_back, lambda k: shutil.copytree(
        results["convert lerobot-v2.1"][1], runs / f"lerobot-v21-to-v30-{k}"))

    spec = parse_trim(trim_spec)

    def trim(k: int) -> Path:
        edit_dataset(dataset, trim=spec, out=runs / f"trimmed-{k}")
        return runs / f"trimmed-{k}"

    results[f"edit --trim {trim_spec}"] = timed(args.repeat, trim)

    def lerobot_reencode(k: int) -> Path:
        """What ``lerobot-edit-dataset --operation.type reencode_videos --new_root`` does (copy, load, re-encode
        every camera file) with the source's own encoder settings: its ``reencode_dataset`` skips a key whose
        settings already equal the target's, so its per-file step (``reencode_video``) is called directly."""
        out = runs / f"lerobot-reencoded-{k}"
        shutil.copytree(dataset.resolve(), out)
        meta = LeRobotDataset(f"bench/reencoded{k}", root=out).meta
        for key in meta.video_keys:
            encoder = encoder_config_from_video_info(meta.info.features[key].get("info", {}))
            for path in sorted((out / "videos" / key).rglob("*.mp4")):
                reencode_video(path, path, video_encoder=encoder, overwrite=True)
        return out

    results["lerobot re-encode (reencode_videos' step)"] = timed(args.repeat, lerobot_reencode)
    load_after = Path("/proc/loadavg").read_text().split()[:3]
    report(args, results, dataset, info, codec, trim_spec, load_before, load_after)
    if videos:
        print_fidelity(dataset, results, info["fps"])


def report(args: argparse.Namespace, results: dict[str, tuple[list[float], Path]], dataset: Path,
           info: dict, codec: str, trim_spec: str, load_before: list[str], load_after: list[str]) -> None:
    """One line per operation: median seconds, size, both against the v3.0 export's."""
    from edit_helpers import episodes_meta

    frames = sum(m["length"] for m in episodes_meta(dataset))
    trimmed = next(p for name, (_, p) in results.items() if name.startswith("edit --trim"))
    kept = sum(m["length"] for m in episodes_meta(trimmed))
    print(f"\nstore: {args.episodes} fetch-pick-place episodes, cycles={args.cycles}, {frames} frames, camera "
          f"{args.image_size}x{args.image_size}, codec {codec}; load average before {' '.join(load_before)}, "
          f"after {' '.join(load_after)}")
    print(f"trim {trim_spec}: {kept} of {frames} frames kept")
    print(f"median of {args.repeat} run(s) each (all runs in brackets)")
    base_s = statistics.median(results["v3.0 export (baseline)"][0])
    base_b = size_of(dataset)
    print(f"{'operation':<48} {'s':>8} {'time x':>9} {'MB':>9} {'size x':>9}")
    for name, (seconds, out) in results.items():
        s, b = statistics.median(seconds), size_of(out)
        print(f"{name:<48} {s:>8.2f} {s / base_s:>9.2f} {b / 1e6:>9.2f} {b / base_b:>9.2f}   "
              f"[{', '.join(f'{x:.2f}' for x in seconds)}]")


def print_fidelity(dataset: Path, results: dict[str, tuple[list[float], Path]], fps: int) -> None:
    """The trim's packets found unchanged in the source episode's (only those up to a keyframe re-encoded), and
    LeRobot's re-encoded frames against the source's (PSNR; tools/bench_edit.py's measures, first camera)."""
    from bench_edit import fidelity, packets, spans

    trimmed = next(p for name, (_, p) in results.items() if name.startswith("edit --trim"))
    kept = total = 0
    for source_span, trimmed_span in zip(spans(dataset), spans(trimmed)):
        source = set(packets(*source_span, fps))
        ours = packets(*trimmed_span, fps)
        kept += sum(1 for p in ours if p in source)
        total += len(ours)
    print(f"\nfidelity: edit --trim: {kept} of {total} packets copied unchanged from the source (the rest re-encoded "
          "up to each episode's first keyframe)")
    reencoded = results["lerobot re-encode (reencode_videos' step)"][1]
    f = fidelity(dataset, reencoded, list(range(len(spans(dataset)))), fps)
    print(f"fidelity: lerobot re-encode: packets differ in {f['episodes_with_different_packets']} episode(s); "
          f"{f['identical_frames']}/{f['frames']} frames bit-identical; PSNR mean {f['psnr_mean_db']:.1f} dB, "
          f"min {f['psnr_min_db']:.1f} dB")


if __name__ == "__main__":
    sys.path.insert(0, str(REPO / "tests"))
    sys.path.insert(0, str(REPO / "tools"))
    main()
