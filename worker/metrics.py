"""The worker's Prometheus metrics, served on ``INFERQ_METRICS_PORT`` (docs/operations.md lists them).

One registry per process: prometheus-client's default one, where vLLM's own stat logger already
registers its ``vllm:*`` metrics (labelled ``model_name``), so the port serves both. inferq's own
are the ``inferq_worker_*`` metrics below; the ones read from the running worker (heartbeat age,
draining, held jobs) are collected at scrape time by :class:`WorkerCollector`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Protocol

from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

log = logging.getLogger(__name__)

JOBS_CLAIMED = Counter("inferq_worker_jobs_claimed_total", "Jobs this worker claimed (attempts started).",
                       ["model_name"])
ADAPTER_JOBS = Counter("inferq_worker_adapter_jobs_total", "Jobs this worker claimed that run with a LoRA "
                       "adapter, by adapter.", ["model_name", "adapter"])
JOBS_PASSED = Counter("inferq_worker_jobs_passed_total", "Jobs this worker took from its model's queue and "
                      "passed to the lane of a worker holding their prompt's prefix or adapter (cache-affine "
                      "pull).", ["model_name"])
JOBS_FINISHED = Counter(
    "inferq_worker_jobs_finished_total", "Attempts that ended on this worker, by outcome: the status it "
    "wrote (succeeded, failed, cancelled), or not_ended (handed back to the queue, superseded, fenced out).",
    ["model_name", "outcome"])
EVENT_BATCH = Histogram("inferq_worker_event_batch_size", "Events the event writer sent in one round trip.",
                        ["model_name"], buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024))
EVENT_WRITE = Histogram("inferq_worker_event_write_seconds", "Time of one event-writer round trip to Redis.",
                        ["model_name"], buckets=(.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 5))


class WorkerState(Protocol):
    """What the collector reads from the running worker (worker/runtime.py)."""

    id: str
    draining: bool

    def held_jobs(self) -> int: ...
    def last_beat(self) -> float | None: ...


class WorkerCollector(Collector):
    """The worker's live state, read at scrape time."""

    def __init__(self, worker: WorkerState, model: str, frontend: int,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.worker, self.model, self.frontend, self.clock = worker, model, str(frontend), clock

    def collect(self) -> Iterator[Metric]:
        w, labels = self.worker, [self.model]
        info = GaugeMetricFamily("inferq_worker_info", "This worker: 1, labelled with its id.",
                                 labels=["model_name", "worker_id", "frontend"])
        info.add_metric([self.model, w.id, self.frontend], 1)
        yield info
        beat = w.last_beat()
        age = GaugeMetricFamily("inferq_worker_heartbeat_age_seconds", "Seconds since Redis last took "
                                "this worker's heartbeat (+Inf before the first).", labels=["model_name"])
        age.add_metric(labels, float("inf") if beat is None else self.clock() - beat)
        yield age
        draining = GaugeMetricFamily("inferq_worker_draining", "1 while the worker drains (SIGTERM).",
                                     labels=["model_name"])
        draining.add_metric(labels, 1.0 if w.draining else 0.0)
        yield draining
        held = GaugeMetricFamily("inferq_worker_jobs_running", "Jobs this worker holds now.",
                                 labels=["model_name"])
        held.add_metric(labels, w.held_jobs())
        yield held


class _Handler(BaseHTTPRequestHandler):
    """``GET /metrics`` in Prometheus' text format, always: under OpenMetrics negotiation
    prometheus-client would rename ``vllm:*`` to ``vllm_*``, and dashboards and alerts written
    against vLLM use the standard names."""

    ready: Callable[[], bool] = staticmethod(lambda: True)

    def do_GET(self) -> None:  # noqa: N802 (the http.server API)
        path = self.path.split("?")[0]
        if path == "/ready":  # a readiness probe: 200 while the heartbeat is fresh and not draining
            ok = self.ready()
            body = b"ready\n" if ok else b"not ready\n"
            self.send_response(200 if ok else 503)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        if path not in ("/metrics", "/"):
            self.send_error(404)
            return
        body = generate_latest(REGISTRY)
        self.send_response(200)
        self.send_header("Content-Type", CONTENT_TYPE_LATEST)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:  # scrapes are not news
        pass


def serve(port: int, collector: Collector, ready: Callable[[], bool]) -> Callable[[], None]:
    """Register ``collector`` and serve the registry on ``port`` (0: only register), with
    ``/ready`` answering ``ready()``. Returns the function that unregisters it and stops the
    server. A port that is taken is logged, not fatal: jobs matter more."""
    REGISTRY.register(collector)
    server = None
    if port:
        try:
            handler = type("Handler", (_Handler,), {"ready": staticmethod(ready)})
            server = ThreadingHTTPServer(("0.0.0.0", port), handler)
            server.daemon_threads = True
            threading.Thread(target=server.serve_forever, name="metrics", daemon=True).start()
            log.info("metrics on :%d/metrics", port)
        except OSError as e:
            log.warning("metrics port %d unavailable (%s); serving without /metrics", port, e)

    def close() -> None:
        REGISTRY.unregister(collector)
        if server is not None:
            server.shutdown()
            server.server_close()
    return close
