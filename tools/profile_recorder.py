#!/usr/bin/env python
"""Where the recorder spends its time per frame: demoforge's recording stages on table (b)'s frames.

Runs ``run_job`` on tools/bench_pipeline.py's in-script task (2 cameras 480x640, pre-rendered frames from
memory, 3 episodes x 120 frames per run), so only recording is timed, and prints CPU per frame: by thread
(``/proc/self/task``, sampled, so threads that end mid-run count: the event loop, each camera's lane, the
codecs' own threads, zarr's I/O thread, the env worker) and by function (the calling thread's CPU of the
encoder, staging and commit calls)::

    .venv/bin/python tools/profile_recorder.py --codec h264

For a flame graph of the same run, use py-spy (a profiling tool, not a dependency of demoforge)::

    pip install py-spy
    py-spy record --threads --nonblocking -o recorder.svg -- .venv/bin/python tools/profile_recorder.py
"""

from __future__ import annotations

import argparse
import collections
import os
import resource
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

# (label, module, attribute path): functions whose own thread's CPU time is summed per call.
TIMED: list[tuple[str, str, str]] = [
    ("encode: CameraEncoder.encode (calling thread)", "demoforge.stages.camera_encoder", "CameraEncoder.encode"),
    ("encode: open encoders", "demoforge.stages.camera_encoder", "CameraEncoder.__init__"),
    ("encode: CameraEncoder.finish", "demoforge.stages.camera_encoder", "CameraEncoder.finish"),
    ("statistics: keep each frame's sample (SampledFrames.add)", "demoforge.storage.sampled_frames", "SampledFrames.add"),
    ("statistics: the sums at each attempt's end", "demoforge.storage.sampled_frames", "SampledFrames.statistics"),
    ("write: open attempt (zarr arrays) (the write path before its I/O task)", "demoforge.storage.staging", "StagingStore.open_episode"),
    ("write: create the attempt's arrays", "demoforge.storage.staging", "EpisodeWriter.create"),
    ("write: chunk writes", "demoforge.storage.staging", "EpisodeWriter.write"),
    ("write: catalog begin_attempt", "demoforge.storage.catalog", "Catalog.begin_attempt"),
    ("write: buffer frame rows", "demoforge.storage.staging", "EpisodeWriter.add_frame"),
    ("write: buffer video bytes", "demoforge.storage.staging", "EpisodeWriter.add_video"),
    ("write: whole chunks to zarr (the write path before its I/O task)", "demoforge.storage.staging", "EpisodeWriter.flush_full"),
    ("write: tail chunks to zarr (the write path before its I/O task)", "demoforge.storage.staging", "EpisodeWriter.flush_all"),
    ("commit: fsync episode", "demoforge.storage.staging", "StagingStore.make_durable"),
    ("commit: catalog commit", "demoforge.storage.catalog", "Catalog.commit"),
    ("job: open the store", "demoforge.storage.store", "Store.__init__"),
]


def instrument() -> dict[str, list[float]]:
    """Wrap :data:`TIMED` so each call adds its thread's CPU time (and a call count) to the returned table."""
    import functools
    import importlib

    table: dict[str, list[float]] = {}
    for label, module, attr in TIMED:
        owner_name, name = attr.split(".")
        owner = getattr(importlib.import_module(module), owner_name)
        fn = getattr(owner, name, None)
        if fn is None:
            raise SystemExit(f"profile_recorder: {module}.{attr} is gone; update TIMED to the code")
        cell = table.setdefault(label, [0.0, 0])

        def wrapped(*a, _fn=fn, _cell=cell, **k):
            t0 = time.thread_time()
            try:
                return _fn(*a, **k)
            finally:
                _cell[0] += time.thread_time() - t0
                _cell[1] += 1

        functools.update_wrapper(wrapped, fn)
        setattr(owner, name, wrapped)
    return table


class ThreadCPU:
    """Samples every thread's CPU time (``/proc/self/task``) so threads that end mid-run still count; Python
    threads are named by ``threading``, the others are the codecs' own (libx264 slices, SVT-AV1 workers)."""

    def __init__(self, period_s: float = 0.05) -> None:
        self.period_s = period_s
        self.seen: dict[int, tuple[str, float]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="profile-sampler", daemon=True)
        self._tick = os.sysconf("SC_CLK_TCK")

    def _run(self) -> None:
        while not self._stop.wait(self.period_s):
            self.sample()

    def sample(self) -> None:
        names = {t.native_id: t.name for t in threading.enumerate()}
        for tid_s in os.listdir("/proc/self/task"):
            try:
                fields = Path(f"/proc/self/task/{tid_s}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            tid = int(tid_s)
            cpu = (int(fields[11]) + int(fields[12])) / self._tick
            name = names.get(tid, self.seen.get(tid, ("codec threads (native)", 0.0))[0])
            name = "AnyIO worker threads" if name.startswith("AnyIO worker") else name
            name = "fsync pool" if name.startswith("fsync_") else name
            self.seen[tid] = (name, cpu)

    def __enter__(self) -> ThreadCPU:
        self.sample()
        self.start = dict(self.seen)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.sample()

    def by_name(self) -> dict[str, float]:
        out: dict[str, float] = collections.defaultdict(float)
        for tid, (name, cpu) in self.seen.items():
            out[name] += cpu - self.start.get(tid, (name, 0.0))[1]
        return dict(sorted(out.items(), key=lambda item: -item[1]))


def process_and_children_cpu() -> float:
    """CPU seconds of this process and its reaped children (a job's encoder process ends with the job)."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--codec", choices=("h264", "av1"), default="h264", help="h264 ultrafast or LeRobot's AV1 "
                   "(default h264)")
    p.add_argument("--episodes", type=int, default=3, help="episodes per run (default 3)")
    p.add_argument("--frames", type=int, default=120, help="frames per episode (default 120)")
    p.add_argument("--runs", type=int, default=2, help="runs, each on a fresh store (default 2)")
    p.add_argument("--encoder-process", choices=("auto", "on", "off"), default="auto",
                   help="where the encoders run: the job's default (auto: a process of their own at this size), "
                        "in a process of their own (on) or beside the env (off); the process's CPU is counted in "
                        "the total, not in the by-thread and by-function rows (default auto)")
    args = p.parse_args(argv)
    encoder_process = {"auto": None, "on": True, "off": False}[args.encoder_process]
    import bench_pipeline as bench
    from demoforge.pipeline.job import VideoSettings

    settings = (VideoSettings(codec="h264", crf=23, g=2, preset="ultrafast") if args.codec == "h264"
                else VideoSettings(codec="libsvtav1", crf=30, g=2, preset=12))
    bench.quiet_ffmpeg()
    bench._POOL[:] = bench.make_pool(48, 480, 640, 2)
    table = instrument()
    process_cpu = 0.0
    frames = 0
    with tempfile.TemporaryDirectory(prefix="profile-recorder-") as tmp, ThreadCPU() as threads:
        for run in range(args.runs):
            c0 = process_and_children_cpu()
            r = bench.bench_demoforge_recorder(args.episodes, args.frames, settings, Path(tmp) / f"s{run}",
                                               encoder_process=encoder_process)
            cpu = process_and_children_cpu() - c0
            process_cpu, frames = process_cpu + cpu, frames + r["frames"]
            print(f"run {run + 1}: {r['fps']:.1f} frames/s, {1000 * cpu / r['frames']:.2f} ms CPU/frame, "
                  f"load {bench.load()}", flush=True)
    by_thread = threads.by_name()
    own = by_thread.pop("profile-sampler", 0.0)
    print(f"\nCPU per frame over {frames} frames ({args.codec}, {args.runs} runs), process total "
          f"{1000 * (process_cpu - own) / frames:.2f} ms (the encoder process's included; without this tool's "
          f"sampler):")
    print("  by thread (sampled every 50 ms, in 10 ms clock ticks):")
    for name, seconds in by_thread.items():
        print(f"    {name:<60} {1000 * seconds / frames:6.2f} ms")
    print("  by function (CPU of the calling thread only; zarr does its I/O in its zarr_io thread):")
    for label, (seconds, calls) in table.items():
        if not calls:
            continue
        print(f"  {label:<62} {1000 * seconds / frames:6.2f} ms  ({int(calls)} calls)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
