"""The long-running generation service: the pipeline plus periodic export, metrics, disk budget, signals.

Lifecycle::

    start: lock the store (one daemon per store), recover, serve metrics
    run:   generate; export every N committed episodes or T seconds, whichever first
    disk:  below the free-space floor no new episode starts (in-flight ones finish); resumes when space returns
    SIGTERM/SIGINT: start no new episodes; in-flight ones may finish until the deadline, then are discarded;
           final export; exit 0.   A second signal: discard in-flight now, final export, exit 0.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sys
import time
from pathlib import Path
from typing import Any, TextIO

import anyio
import anyio.abc

from demoforge.pipeline.daemon_config import DaemonConfig
from demoforge.pipeline.error_report import EXIT_WRITE_FAILED, failed_write
from demoforge.pipeline.metrics import JobMetrics
from demoforge.storage.faults import free_space_override
from demoforge.pipeline.runner import JobRunner, JobStats
from demoforge.stages.records import StagedAttempt
from demoforge.storage.write_errors import free_bytes, is_write_error

EXIT_FAILING = 3  # the job stopped itself (too many episodes abandoned in a row): a restart would not help


def _write_failure(exc: BaseException) -> BaseException | None:
    """The OS write error (full disk, ...) inside ``exc`` or its exception-group leaves, if any."""
    if isinstance(exc, BaseExceptionGroup):
        for leaf in exc.exceptions:
            found = _write_failure(leaf)
            if found is not None:
                return found
        return None
    return exc if is_write_error(exc) else None


class EventLog:
    """One line per lifecycle event: human text, or JSON objects with ``--json-logs``."""

    def __init__(self, json_lines: bool, stream: TextIO | None = None) -> None:
        self.json_lines = json_lines
        self.stream = stream or sys.stderr

    def emit(self, event: str, **fields: Any) -> None:
        if self.json_lines:
            line = json.dumps({"ts": round(time.time(), 3), "event": event, **fields}, default=str)
        else:
            detail = " ".join(f"{k}={v}" for k, v in fields.items())
            line = f"{time.strftime('%Y-%m-%dT%H:%M:%S')} {event} {detail}".rstrip()
        print(line, file=self.stream, flush=True)


def free_megabytes(path: Path) -> float:
    override = free_space_override()  # tests
    if override is not None:
        return override
    existing = Path(path)
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent  # the store may not be created yet: measure the filesystem it will be on
    return shutil.disk_usage(existing).free / 2**20


class GenerationDaemon:
    def __init__(self, config: DaemonConfig, log: EventLog) -> None:
        self.config = config
        self.log = log
        self.metrics = JobMetrics()
        self.runner = JobRunner(config.spec, config.store, on_progress=self._on_progress,
                                on_outcome=self._on_outcome, executor=config.executor,
                                on_event=lambda line: self.log.emit("executor", detail=line))
        self._since_export = 0
        self._export_due = anyio.Event()
        self._signals = 0
        self._exported_total = 0

    # ----------------------------------------------------------------------------- callbacks
    def _on_outcome(self, item: StagedAttempt) -> None:
        self.metrics.on_outcome(item)
        result = item.ended.result
        if result.committable:
            # after the catalog commit returned: the episode is durable (what a power-loss test holds it to)
            self.log.emit("episode_committed", episode=item.ended.key.episode_id,
                          index=item.ended.key.episode_index, frames=item.ended.frames)
            self._since_export += 1
            if self.config.export_dir is not None and self._since_export >= self.config.export_every_episodes:
                self._export_due.set()
        elif result.kept:  # durable too, an episode of its own; it fills no slot of the target
            self.log.emit("failure_kept", episode=item.ended.key.episode_id, index=item.ended.key.episode_index,
                          frames=item.ended.frames, reason=result.terminal_reason.value, detail=result.failure_reason,
                          attempt=result.attempt, seed=result.seed)
        else:
            self.log.emit("episode_discarded", episode=item.ended.key.episode_id, reason=result.terminal_reason.value,
                          detail=result.failure_reason, attempt=result.attempt, seed=result.seed)

    def _on_progress(self, stats: JobStats) -> None:
        self.metrics.refresh(stats)
        self.metrics.export_lag.set(stats.total_committed - self._exported_total)

    # ----------------------------------------------------------------------------- tasks
    async def _export(self, why: str) -> None:
        if self.config.export_dir is None:
            return
        from demoforge.pipeline.export_child import export_in_child

        self._since_export = 0
        started = time.monotonic()
        # The disk floor covers the dataset's filesystem too: an export that would run it below the floor waits
        # (the export itself also refuses to start without room for the episodes it would add).
        free = await anyio.to_thread.run_sync(free_megabytes, self.config.export_dir)
        if free < self.config.min_free_mb:
            self.log.emit("export_deferred", why=why, reason="low disk space", path=self.config.export_dir,
                          free_mb=round(free), floor_mb=self.config.min_free_mb,
                          note="retried at the next export moment")
            return
        # A child process: the export's memory is returned when it ends, and its crash is not the daemon's.
        # DEMOFORGE_EXPORT_PAUSE (fault injection, tools/crash_campaign.py) reaches it through the environment.
        outcome = await export_in_child(self.config.store, self.config.export_dir, self.config.repo_id,
                                        progress_timeout_s=self.config.export_progress_timeout_seconds)
        if outcome.stalled is not None:
            self.log.emit("export_stalled", why=why, reason=outcome.stalled, published=outcome.ok,
                          stacks_file=outcome.stacks, stacks=outcome.stack_text.strip(),
                          note="the export child was ended after its threads' stacks were dumped; "
                               + ("its publish counts" if outcome.ok else "retried at the next export"))
        if not outcome.ok:
            self.metrics.export_failures.inc()
            self.log.emit("export_failed", why=why, child=outcome.exit_text(), error=outcome.error,
                          seconds=round(time.monotonic() - started, 2),
                          note="the dataset stays at its last published version; retried at the next export")
            return
        report = outcome.report or {}
        self._exported_total = int(report["total_episodes"])
        self.metrics.last_export.set(time.time())
        self.metrics.exported_total.set(self._exported_total)
        self.metrics.export_lag.set(max(0, self.runner.stats.total_committed - self._exported_total))
        self.log.emit("export", why=why, added=report["exported"], total_episodes=report["total_episodes"],
                      version=report["version"], quarantined=len(report["quarantined"]),
                      seconds=round(time.monotonic() - started, 2))
        if self.config.prune_after_export:
            pruned = await anyio.to_thread.run_sync(self._prune)
            self.log.emit("pruned", episodes=pruned.pruned + pruned.finished, freed_bytes=pruned.freed_bytes)

    def _prune(self):
        """Delete the staged data of exported episodes. The daemon's runner holds the store's writer lock, so
        this opens the store beside it (mode r+: it touches only exported episodes, which no writer uses)."""
        from demoforge.storage.store import open_store

        with open_store(self.config.store, "r+") as store:
            return store.prune_exported()

    async def _export_loop(self) -> None:
        while True:
            with anyio.move_on_after(self.config.export_every_seconds):
                await self._export_due.wait()
            self._export_due = anyio.Event()
            await self._export("periodic")

    async def _disk_loop(self) -> None:
        floor = self.config.min_free_mb
        while True:
            free = await anyio.to_thread.run_sync(free_megabytes, self.config.store)
            self.metrics.free_bytes.set(free * 2**20)
            paused = self.runner.paused
            if not paused and free < floor:
                self.runner.set_paused(True)
                self.metrics.paused.set(1)
                self.log.emit("generation_paused", reason="low disk space", free_mb=round(free), floor_mb=floor)
            elif paused and free >= floor:
                self.runner.set_paused(False)
                self.metrics.paused.set(0)
                self.log.emit("generation_resumed", free_mb=round(free), floor_mb=floor)
            await anyio.sleep(self.config.disk_check_seconds)

    async def _metrics_loop(self) -> None:
        while True:
            self._on_progress(self.runner.stats)
            await anyio.sleep(1.0)

    async def _signal_loop(self, tg: anyio.abc.TaskGroup) -> None:
        with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            async for signum in signals:
                self._signals += 1
                name = signal.Signals(signum).name
                if self._signals == 1:
                    self.log.emit("stopping", signal=name, deadline_s=self.config.shutdown_deadline_seconds,
                                  note="no new episodes; in-flight ones may finish until the deadline")
                    self.runner.drain()
                    tg.start_soon(self._deadline)
                elif self._signals == 2:
                    self.log.emit("stopping_now", signal=name, note="in-flight episodes are discarded")
                    self.runner.stop()
                else:
                    os._exit(1)

    def _log_write_failure(self, exc: BaseException) -> None:
        what, where, reason = failed_write(exc)
        self.log.emit("write_failed", what=what, path=where, reason=reason,
                      free_bytes=free_bytes(where or self.config.store),
                      committed_total=self.runner.stats.total_committed,
                      note="committed episodes are intact and the unfinished attempts' files were removed; free "
                           "space, then start the daemon again: it resumes")

    async def _deadline(self) -> None:
        await anyio.sleep(self.config.shutdown_deadline_seconds)
        self.log.emit("deadline_reached", note="discarding in-flight episodes")
        self.runner.stop()

    # ----------------------------------------------------------------------------- main
    def _save_multiply_source(self) -> None:
        """A ``[multiply]`` job: bind the store to the job, then write the extracted source beside it (as
        ``demoforge multiply`` does; the same file again on a restart), before any worker reads it."""
        from demoforge.storage.store import open_store

        job = self.config.multiply
        assert job is not None
        with open_store(self.config.store, "w", fingerprint=self.config.spec.fingerprint(self.runner.info)):
            job.save()
        self.log.emit("multiply_source", source=job.source, file=job.file,
                      episodes=len(job.prepared.source.episodes), segments=" ".join(job.prepared.source.sequence),
                      skipped=list(job.prepared.skipped))

    async def run(self) -> int:
        config = self.config
        if config.multiply is not None:
            self._save_multiply_source()
        close_http = None
        if config.metrics_port is not None:
            close_http = self.metrics.serve(config.metrics_host, config.metrics_port)
        self.log.emit("started", pid=os.getpid(), task=config.spec.task, store=config.store,
                      target="unbounded" if config.unbounded else config.spec.episodes,
                      metrics=f"http://{config.metrics_host}:{config.metrics_port}/metrics"
                      if config.metrics_port is not None else "off", export=config.export_dir)
        try:
            report = None
            try:
                async with anyio.create_task_group() as tg:
                    tg.start_soon(self._signal_loop, tg)
                    tg.start_soon(self._disk_loop)
                    tg.start_soon(self._metrics_loop)
                    if config.export_dir is not None:
                        tg.start_soon(self._export_loop)
                    report = await self.runner.run()
                    tg.cancel_scope.cancel()
                assert report is not None  # the runner returns its report; only an exception ends it without one
            except Exception as exc:  # a group, or one error
                failure = _write_failure(exc)
                if failure is None:
                    raise
                self._log_write_failure(failure)
                return EXIT_WRITE_FAILED
            self.log.emit("recovery", detail=report.recovery.describe())
            self._on_progress(self.runner.stats)
            if report.runaway is not None:
                self.metrics.failing.set(1)
                runaway = report.runaway
                self.log.emit("failing", consecutive_abandoned=runaway.consecutive, limit=runaway.limit,
                              top_reasons={reason: count for reason, count in runaway.top_reasons},
                              last_error=runaway.last_error,
                              note="generation stopped; committed episodes are kept; fix the task and restart")
            await self._export("final")
            self.log.emit("stopped", committed_total=report.committed_total,
                          committed_this_run=report.committed_this_run, discarded=report.discarded,
                          reason="failing" if report.runaway else "signal" if self._signals else "target reached")
            return EXIT_FAILING if report.runaway is not None else 0
        finally:
            if close_http is not None:
                close_http()
