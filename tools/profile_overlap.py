#!/usr/bin/env python
"""Where recording slows the simulator: the env thread's time, env only against generate, on one task.

Each round runs the task's episodes twice in fresh processes, interleaved: env only (the executor with
rendering, frames discarded, as ``demoforge run``) and ``run_job`` (the thread executor: encode, stage,
commit, as ``demoforge generate --encoder-process off``; ``--encoder-process`` adds the same with ``on`` at
normal priority, ``--encoder-idle`` with the process's encoders at idle priority (the default wherever the
process runs), and ``--apart`` env only with its frames piped to a bare encoder process). Inside each, the env is
wrapped to time every ``env.step`` (wall and the env thread's own CPU) and the step stage's hand-offs to the
event loop are timed, so the difference splits into: the simulator itself running slower beside the recorder
(``in env.step``), the recorder's work on the env thread (``outside step``, of which ``hand-offs``), and the
rest::

    MUJOCO_GL=egl HF_HUB_OFFLINE=1 .venv/bin/python tools/profile_overlap.py --task aloha-transfer-cube --episodes 2 --rounds 2

``--executor process`` runs every generate with one process worker (the walls and CPU only: the env steps in
the worker's process, where this tool does not time it; the CPU leaves out the worker's encoder process, which
no process waits for once the driver has killed the worker at the job's end).

Medians over the rounds; every number of one table comes from the same invocation.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from round_ratio import round_ratio

REPO = Path(__file__).resolve().parent.parent


def measure(mode: str, task: str, episodes: int, store: Path, executor: str = "thread") -> dict[str, Any]:
    """One run in this process (called in a child): the env thread's breakdown as a dict. With the process
    executor the env steps in the worker's process, so only the walls and the CPU (children included) count."""
    import gymnasium as gym

    from demoforge.pipeline.job import JobSpec
    from demoforge.pipeline.runner import run_job
    from demoforge.pipeline.tasks.registry import get_task
    from demoforge.pipeline.workers.config import ExecutorConfig
    from demoforge.stages import step as step_stage
    from demoforge.stages.executor import run_episodes

    timed = {"step_wall": 0.0, "step_cpu": 0.0, "steps": 0, "reset_wall": 0.0, "handoff_wall": 0.0, "handoffs": 0}

    class Timed(gym.Wrapper):
        def step(self, action: Any) -> Any:
            wall, cpu = time.perf_counter(), time.thread_time()
            timed.setdefault("first_step_at", wall - started)
            out = self.env.step(action)
            timed["last_step_at"] = time.perf_counter() - started
            timed["step_wall"] += time.perf_counter() - wall
            timed["step_cpu"] += time.thread_time() - cpu
            timed["steps"] += 1
            return out

        def reset(self, **kwargs: Any) -> Any:
            wall = time.perf_counter()
            out = self.env.reset(**kwargs)
            timed["reset_wall"] += time.perf_counter() - wall
            return out

    entry = get_task(task)
    build = entry.build
    flush = step_stage._EnvThread._send_batch

    def timed_flush(self: Any) -> None:
        wall = time.perf_counter()
        flush(self)
        timed["handoff_wall"] += time.perf_counter() - wall
        timed["handoffs"] += 1

    step_stage._EnvThread._send_batch = timed_flush  # type: ignore[method-assign]
    object.__setattr__(entry, "build", lambda options=None: Timed(build(options)))
    wall, cpu, children = time.perf_counter(), time.process_time(), _children_cpu()
    started = wall
    if mode == "env-only":
        env = entry.build({})
        info = entry.info({})
        for _record in run_episodes(env, task=task, episodes=episodes, job_seed=0, max_attempts=3,
                                    cameras=info.cameras):
            pass
        env.close()
    elif mode in ("apart", "apart-idle"):
        encoded = _encode_apart(entry, task, episodes, run_episodes, idle=mode == "apart-idle")
        timed["encoded_frames"] = encoded
    else:
        # "generate": beside the env; "generate-apart": in a process of their own; "generate-idle": that process
        # at idle scheduling priority (generate --encoder-priority idle)
        run_job(JobSpec(task=task, episodes=episodes, encoder_process=mode != "generate",
                        encoder_idle=mode == "generate-idle"), store, executor=ExecutorConfig(kind=executor))
    timed["wall"] = time.perf_counter() - wall
    timed["tail"] = timed["wall"] - timed.get("last_step_at", timed["wall"])
    timed["cpu"] = time.process_time() - cpu
    timed["cpu_all"] = timed["cpu"] + _children_cpu() - children  # with the encoder process (ended and reaped)
    return timed


def _children_cpu() -> float:
    import resource

    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _encode_apart(entry: Any, task: str, episodes: int, run_episodes: Any, idle: bool) -> int:
    """Env only in this process; every frame's images go by pipe to a separate encoder process (the recorder's
    encoders and statistics, as generate runs them), which takes them in a reader thread and encodes them."""
    import multiprocessing

    from demoforge.stages.records import AttemptEnded, AttemptStarted, Frame

    info = entry.info({})
    context = multiprocessing.get_context("spawn")
    ours, theirs = context.Pipe()
    proc = context.Process(target=_encoder_process, args=(theirs, info.cameras, info.fps, idle), daemon=True)
    proc.start()
    env = entry.build({})
    for record in run_episodes(env, task=task, episodes=episodes, job_seed=0, max_attempts=3, cameras=info.cameras):
        if isinstance(record, AttemptStarted):
            ours.send_bytes(b"S")
        elif isinstance(record, Frame):
            for camera in info.cameras:
                ours.send_bytes(b"F" + record.images[camera.name].tobytes())
        elif isinstance(record, AttemptEnded):
            ours.send_bytes(b"E")
    env.close()
    ours.send_bytes(b"Q")
    frames = int(ours.recv_bytes())
    proc.join()
    return frames


def _encoder_process(conn: Any, cameras: Any, fps: int, idle: bool) -> None:
    import queue
    import threading

    import numpy as np

    from demoforge.stages.camera_encoder import make_recording_encoder
    from demoforge.stages.settings import VideoSettings

    if idle:
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    jobs: queue.Queue[bytes] = queue.Queue(maxsize=64)

    def read() -> None:
        while True:
            data = conn.recv_bytes()
            jobs.put(data)
            if data == b"Q":
                return

    threading.Thread(target=read, daemon=True).start()
    settings = VideoSettings()
    encoders: list[Any] = []
    frames = 0
    while True:
        data = jobs.get()
        kind = data[:1]
        if kind == b"S":
            encoders = [make_recording_encoder(c, fps, settings) for c in cameras]
            turn = 0
        elif kind == b"F":
            camera = cameras[turn % len(cameras)]
            encoders[turn % len(cameras)].encode(np.frombuffer(data[1:], np.uint8).reshape(camera.shape))
            turn += 1
            frames += 1
        elif kind == b"E":
            for encoder in encoders:
                encoder.finish()
        else:
            conn.send_bytes(str(frames // max(1, len(cameras))).encode())
            return


def child(mode: str, task: str, episodes: int, executor: str) -> dict[str, Any]:
    store = Path(tempfile.mkdtemp(prefix="profile-overlap-")) / "store"
    try:
        out = subprocess.run([sys.executable, __file__, "--child", mode, "--task", task, "--episodes", str(episodes),
                              "--store", str(store), "--executor", executor],
                             capture_output=True, text=True, cwd=REPO, check=False)
        if out.returncode != 0:
            raise SystemExit(f"{mode} run failed:\n{out.stderr[-3000:]}")
        return json.loads(out.stdout.strip().splitlines()[-1])
    finally:
        shutil.rmtree(store.parent, ignore_errors=True)


def breakdown(runs: dict[str, list[dict[str, Any]]], modes: list[str], med: Any) -> None:
    """The env thread's time outside env.step, its start and its end, per mode (thread executor only)."""
    outside = {m: med(m, "wall") - med(m, "step_wall") - med(m, "reset_wall") for m in runs}
    print(f"| outside env.step (executor, records, hand-offs; start-up) | {outside['env-only']:.2f} | "
          f"{outside['generate']:.2f} | {outside['generate'] - outside['env-only']:+.2f} |")
    for label, key in (("start to the first env.step", "first_step_at"), ("the last env.step to the end", "tail")):
        a, b = (med(m, key) for m in ("env-only", "generate"))
        print(f"| {label} | {a:.2f} | {b:.2f} | {b - a:+.2f} |")
    for mode in modes[2:]:
        print(f"{mode} / env only: {med(mode, 'wall') / med('env-only', 'wall'):.3f} "
              f"(in env.step {med(mode, 'step_wall') - med('env-only', 'step_wall'):+.2f} s, "
              f"CPU {med(mode, 'cpu'):.2f} s in the env's process; outside env.step {outside[mode]:.2f} s, of which "
              f"start to the first env.step {med(mode, 'first_step_at'):.2f} s, the last env.step to the end "
              f"{med(mode, 'tail'):.2f} s)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--task", default="aloha-transfer-cube", help="task (default: aloha-transfer-cube)")
    parser.add_argument("--episodes", type=int, default=2, help="episodes per run (default: 2)")
    parser.add_argument("--rounds", type=int, default=2, help="interleaved rounds (default: 2)")
    parser.add_argument("--child", choices=("env-only", "generate", "generate-apart", "generate-idle", "apart", "apart-idle"), help=argparse.SUPPRESS)
    parser.add_argument("--encoder-process", action="store_true",
                        help="also run generate with --encoder-process on --encoder-priority normal (generate-apart: "
                             "each worker's encoders in a process of their own; its process CPU leaves out that "
                             "process); generate itself runs them beside the env (default: off)")
    parser.add_argument("--encoder-idle", action="store_true",
                        help="also run generate with --encoder-process on --encoder-priority idle (generate-idle: "
                             "the encoder process's encoders at idle priority, raised while the worker waits; what "
                             "--encoder-priority auto does wherever the process runs) (default: off)")
    parser.add_argument("--apart", action="store_true",
                        help="also run env only with the encoders in a separate process fed by pipe, at normal "
                             "and at idle scheduling priority: what moving the recorder out would leave "
                             "(default: off)")
    parser.add_argument("--executor", choices=("thread", "process"), default="thread",
                        help="the executor of every generate run, one worker (env only always steps in its own "
                             "process); with process the env steps in the worker's process, so the rows inside and "
                             "outside env.step are not measured, only walls and CPU (default: thread)")
    parser.add_argument("--store", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    os.environ.setdefault("MUJOCO_GL", "egl")
    if args.child:
        print(json.dumps(measure(args.child, args.task, args.episodes, args.store, args.executor)))
        return
    modes = (["env-only", "generate"] + (["generate-apart"] if args.encoder_process else [])
             + (["generate-idle"] if args.encoder_idle else [])
             + (["apart", "apart-idle"] if args.apart else []))
    runs: dict[str, list[dict[str, Any]]] = {m: [] for m in modes}
    for r in range(args.rounds):
        for mode in modes[r % len(modes):] + modes[:r % len(modes)]:
            runs[mode].append(child(mode, args.task, args.episodes, args.executor))
            print(f"round {r + 1} {mode}: wall {runs[mode][-1]['wall']:.2f} s; load {os.getloadavg()[0]:.2f}",
                  file=sys.stderr, flush=True)

    def med(mode: str, key: str) -> float:
        return statistics.median(x[key] for x in runs[mode])

    rows = [("wall", "wall"), ("process CPU", "cpu"), ("in env.step, wall", "step_wall"),
            ("in env.step, env thread CPU", "step_cpu"), ("reset, wall", "reset_wall"),
            ("hand-offs to the event loop", "handoff_wall")]
    steps = runs["env-only"][0]["steps"]
    print(f"{args.task}, {args.episodes} episode(s), {steps} steps, median of {args.rounds} round(s) (s); generate "
          f"with the {args.executor} executor\n")
    if args.executor != "thread":  # the env steps in the worker's process: no breakdown inside the env's steps
        print("(the env steps in the worker's process: only walls and CPU are measured for generate)\n")
        # The driver ends its worker with a kill at the job's end, so the worker's own encoder process is
        # nobody's waited-for child: its CPU is missing from this row.
        rows = [("wall", "wall"), ("CPU, children included (not the worker's encoder process)", "cpu_all")]
    print("| | env only | generate | difference |\n|---|---|---|---|")
    for label, key in rows:
        a, b = med("env-only", key), med("generate", key)
        print(f"| {label} | {a:.2f} | {b:.2f} | {b - a:+.2f} |")
    if args.executor == "thread":
        breakdown(runs, modes, med)
    else:
        for mode in modes[2:]:
            print(f"{mode} / env only: {med(mode, 'wall') / med('env-only', 'wall'):.3f}")
    # What two cores allow at best: the run cannot end before its env does, nor before all its CPU work is
    # done on the machine's cores.
    cores = len(os.sched_getaffinity(0))
    for mode in modes[1:]:
        floor = max(med("env-only", "wall"), med(mode, "cpu_all") / cores)
        print(f"{mode}: CPU {med(mode, 'cpu_all'):.2f} s in all (env only {med('env-only', 'cpu_all'):.2f} s); "
              f"floor max(env-only wall, CPU / {cores} cores) = {floor:.2f} s = "
              f"{floor / med('env-only', 'wall'):.3f} x env only; wall / floor {med(mode, 'wall') / floor:.3f}")
    env_walls = [x["wall"] for x in runs["env-only"]]
    for mode in modes[1:]:
        print(f"{mode} / env only, per round: {round_ratio([x['wall'] for x in runs[mode]], env_walls).describe(1.05)}")
    print(f"\ngenerate / env only: {med('generate', 'wall') / med('env-only', 'wall'):.3f}; "
          f"hand-offs: {statistics.median(x['handoffs'] for x in runs['generate']):.0f}; "
          f"load {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
