"""Prometheus metrics of a running job, in a registry of its own (no process-global collectors)."""

from __future__ import annotations

import time
from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server

from demoforge.pipeline.runner import JobStats
from demoforge.stages.records import StagedAttempt


class JobMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.committed = Counter("demoforge_episodes_committed", "Episodes committed", registry=r)
        self.discarded = Counter("demoforge_episodes_discarded", "Attempts discarded, by reason", ["reason"],
                                 registry=r)
        self.failures_kept = Counter("demoforge_failures_kept", "Failed attempts committed as episodes of their own "
                                     "(job.keep_failures), by reason; not counted as committed episodes",
                                     ["reason"], registry=r)
        self.attempts = Counter("demoforge_attempts", "Attempts that ended (committed, kept or discarded)",
                                registry=r)
        self.frames = Counter("demoforge_frames", "Frames committed", registry=r)
        self.frames_per_s = Gauge("demoforge_frames_per_second", "Committed frames per second since start",
                                  registry=r)
        self.committed_total = Gauge("demoforge_store_committed_episodes", "Committed episodes in the store",
                                     registry=r)
        self.queue_depth = Gauge("demoforge_queue_depth", "Items waiting in each inter-stage queue", ["queue"],
                                 registry=r)
        self.stage_busy = Gauge("demoforge_stage_busy_seconds", "Seconds each stage spent working", ["stage"],
                                registry=r)
        self.last_commit = Gauge("demoforge_last_commit_timestamp_seconds", "Unix time of the last commit",
                                 registry=r)
        self.last_export = Gauge("demoforge_last_export_timestamp_seconds", "Unix time of the last export",
                                 registry=r)
        self.export_failures = Counter("demoforge_export_failures", "Exports whose child process failed or was "
                                       "killed (the dataset kept its last version)", registry=r)
        self.export_lag = Gauge("demoforge_export_lag_episodes", "Committed episodes not yet exported", registry=r)
        self.exported_total = Gauge("demoforge_exported_episodes", "Episodes in the published dataset", registry=r)
        self.paused = Gauge("demoforge_generation_paused", "1 while generation is paused (low disk space)",
                            registry=r)
        self.failing = Gauge("demoforge_job_failing", "1 when the job stopped itself: the last "
                             "max_consecutive_abandoned episodes were all abandoned", registry=r)
        self.workers_running = Gauge("demoforge_workers_running", "Remote workers (process / Ray executors) "
                                     "running now; below demoforge_workers_wanted when the cluster lacks room",
                                     registry=r)
        self.workers_wanted = Gauge("demoforge_workers_wanted", "The most remote workers the job runs at once "
                                    "(workers / ray.num_workers)", registry=r)
        self.workers_lost = Gauge("demoforge_workers_lost", "Remote workers lost in this run (died, node lost, "
                                  "hung, or failed to start)", registry=r)
        self.free_bytes = Gauge("demoforge_store_free_bytes", "Free bytes on the store's filesystem", registry=r)
        self.up = Gauge("demoforge_up_timestamp_seconds", "Unix time the daemon started", registry=r)
        self.up.set(time.time())

    def on_outcome(self, item: StagedAttempt) -> None:
        result = item.ended.result
        self.attempts.inc()
        if result.committable:
            self.committed.inc()
            self.frames.inc(item.ended.frames)
            self.last_commit.set(time.time())
        elif result.kept:
            self.failures_kept.labels(result.terminal_reason.value).inc()
        else:
            self.discarded.labels(result.terminal_reason.value).inc()

    def refresh(self, stats: JobStats) -> None:
        self.frames_per_s.set(stats.frames_per_s())
        self.committed_total.set(stats.total_committed)
        if stats.workers is not None:
            self.workers_running.set(stats.workers.running)
            self.workers_wanted.set(stats.workers.wanted)
            self.workers_lost.set(stats.workers.lost)
        for name, depth in stats.queue_depths().items():
            self.queue_depth.labels(name).set(depth)
        busy: dict[str, float] = {}
        for key, seconds in stats.busy.snapshot().items():
            stage = key.partition(":")[0]
            busy[stage] = busy.get(stage, 0.0) + seconds
        for stage, seconds in busy.items():
            self.stage_busy.labels(stage).set(seconds)

    def serve(self, host: str, port: int) -> Callable[[], None]:
        """Serve /metrics over HTTP; returns a function that shuts the server down."""
        server, thread = start_http_server(port, addr=host, registry=self.registry)

        def close() -> None:
            server.shutdown()
            thread.join(timeout=5)

        return close


def scrape(url: str, timeout: float = 5.0) -> dict[str, float]:
    """Read a /metrics page into ``{'name{label="v"}': value}`` with prometheus_client's own parser."""
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(url, timeout=timeout) as response:
        text = response.read().decode()
    values: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(sample.labels.items()))
            values[f"{sample.name}{{{labels}}}" if labels else sample.name] = sample.value
    return values
