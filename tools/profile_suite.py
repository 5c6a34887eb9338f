"""Where the test suite's time goes: run pytest (the README's command by default) while sampling every process's
CPU time, then print the wall time, how busy the cores were, CPU-seconds by kind of process (the pytest workers,
each `demoforge COMMAND` subprocess, job workers, Ray, browsers, the kernel's own threads) and per test file.

Why: the suite's wall time moved between 619 and 989 s on one day with the same code, and a wall time alone
cannot say whether the tests grew, the machine slowed or something else took the cores. The per-file sums
are what `tests/conftest.py` FILE_SECONDS orders the files by. Processes shorter than one sampling interval
(0.5 s) are missed; their CPU is in the "not sampled" line (the machine's busy time less the sampled sum).

    .venv/bin/python tools/profile_suite.py                  # the whole suite, about 15 minutes
    .venv/bin/python tools/profile_suite.py -- -m "not slow"  # other pytest arguments after --
"""

from __future__ import annotations

import argparse
import collections
import os
import subprocess
import sys
import tempfile
import threading
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parent.parent
SUITE = ["-q", "-n", "2", "--dist", "loadfile"]  # the README's test command's pytest arguments
INTERVAL_S = 0.5


def kind(cmdline: list[str], name: str) -> str:
    """A short name for what a process is, so that hundreds of subprocesses sum into a few lines."""
    text = " ".join(cmdline)
    if "demoforge.pipeline.cli" in cmdline or (cmdline and cmdline[0].endswith("/demoforge")):
        args = cmdline[cmdline.index("demoforge.pipeline.cli") + 1:] if "demoforge.pipeline.cli" in cmdline \
            else cmdline[1:]
        command = next((a for a in args if not a.startswith("-")), "(no command: --help)")
        return f"demoforge {command}"
    if "multiprocessing.forkserver" in text:  # tests/helpers.py run_cli forks the CLI's commands from this server
        return "demoforge commands forked by the tests (run_cli)"
    if "xdist" in text or "pytest" in text or "exec(eval(sys.stdin.readline()))" in text:  # execnet's workers
        return "pytest (workers and controller)"
    if "process_main" in text or "spawn_main" in text or "encoder_child" in text or "export_child" in text:
        return "job workers and children"
    if "ray" in text or name in ("raylet", "gcs_server"):
        return "ray"
    if "chrom" in text:
        return "chromium"
    if cmdline and "python" in os.path.basename(cmdline[0]):
        return "other python (tests' scripts)"
    if not cmdline:
        return f"kernel threads ({name.split('/')[0]})"
    return f"other ({name})"


@dataclass
class Usage:
    """One process's CPU-s: when first seen (0 for one started while sampling) and at the last sample."""

    kind: str
    first: float
    last: float


class Sampler:
    """Polls every process's CPU time; keeps, per process, the CPU it used while sampled.

    Records are per process, not per pid: a pid the kernel hands to a new process after the first one ended
    starts a record of its own."""

    def __init__(self) -> None:
        self.records: list[Usage] = []
        self.live: dict[int, tuple[psutil.Process, Usage]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        self._sample(initial=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        self._sample(initial=False)

    def _run(self) -> None:
        while not self._stop.wait(INTERVAL_S):
            self._sample(initial=False)

    def _sample(self, initial: bool) -> None:
        """One pass: a process's command line is read once, then only its CPU times (one /proc read each), so
        that the sampling itself stays a small share of a core."""
        me = os.getpid()
        for pid in psutil.pids():
            if pid == me:
                continue
            try:
                if pid not in self.live:
                    proc = psutil.Process(pid)
                    used = sum(proc.cpu_times()[:2])
                    record = Usage(kind(proc.cmdline(), proc.name()), used if initial else 0.0, used)
                    self.live[pid] = (proc, record)
                    self.records.append(record)
                proc, record = self.live[pid]
                record.last = sum(proc.cpu_times()[:2])
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                self.live.pop(pid, None)  # ended: its record keeps the CPU it had used at the last sample

    def own_cpu_s(self) -> float:
        """The sampler's own CPU time (it shares the cores with the suite)."""
        return sum(psutil.Process().cpu_times()[:2])

    def by_kind(self) -> tuple[dict[str, float], dict[str, int]]:
        seconds: dict[str, float] = collections.defaultdict(float)
        counts: collections.Counter[str] = collections.Counter()
        for record in self.records:
            used = record.last - record.first
            if used > 0:
                seconds[record.kind] += used
                counts[record.kind] += 1
        return dict(seconds), dict(counts)


def per_file(junit: Path) -> dict[str, float]:
    """Seconds each test file took (setup, call and teardown of its tests), from pytest's JUnit XML."""
    sums: dict[str, float] = collections.defaultdict(float)
    for case in ET.parse(junit).iter("testcase"):
        sums[(case.get("classname") or "?").rsplit(".", 1)[-1] + ".py"] += float(case.get("time") or 0)
    return dict(sums)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--top", type=int, default=20, help="how many process kinds and test files to list "
                        "(default: 20)")
    parser.add_argument("pytest_args", nargs="*", help="pytest arguments after -- (default: the README's: "
                        + " ".join(SUITE) + ")")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as scratch:
        junit = Path(scratch) / "junit.xml"
        command = [sys.executable, "-m", "pytest", *(args.pytest_args or SUITE), f"--junitxml={junit}"]
        sampler = Sampler()
        before = psutil.cpu_times()
        sampler.start()
        started = time.monotonic()
        code = subprocess.call(command, cwd=REPO, stdin=subprocess.DEVNULL)
        wall = time.monotonic() - started
        sampler.stop()
        after = psutil.cpu_times()
        files = per_file(junit) if junit.exists() else {}
    # Linux counts guest time inside user and nice; steal is time the host ran something else, not busy here.
    busy = sum(getattr(after, f) - getattr(before, f) for f in after._fields
               if f not in ("idle", "iowait", "steal", "guest", "guest_nice"))
    idle = (after.idle - before.idle) + (getattr(after, "iowait", 0.0) - getattr(before, "iowait", 0.0))
    steal = getattr(after, "steal", 0.0) - getattr(before, "steal", 0.0)
    cores = psutil.cpu_count() or 1
    seconds, counts = sampler.by_kind()
    print(f"\npytest exit {code}; wall {wall:.0f} s on {cores} cores: busy {busy:.0f} CPU-s "
          f"({busy / (wall * cores):.0%}), idle {idle:.0f} s, steal {steal:.0f} s")
    print(f"\nCPU-s by kind of process (sampled every {INTERVAL_S} s):")
    for name, used in sorted(seconds.items(), key=lambda kv: -kv[1])[:args.top]:
        print(f"  {used:8.1f}  {counts[name]:5d} process(es)  {used / counts[name]:6.2f} each  {name}")
    own = sampler.own_cpu_s()
    print(f"  {own:8.1f}  this sampler")
    print(f"  {max(busy - sum(seconds.values()) - own, 0.0):8.1f}  not sampled (processes shorter than an interval)")
    if files:
        print(f"\nseconds per test file (sum {sum(files.values()):.0f} over the workers; tests/conftest.py "
              "FILE_SECONDS orders files by these):")
        for name, spent in sorted(files.items(), key=lambda kv: -kv[1])[:args.top]:
            print(f"  {spent:7.1f}  {name}")
    return code


if __name__ == "__main__":
    raise SystemExit(main())
