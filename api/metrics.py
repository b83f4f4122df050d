"""The gateway's Prometheus metrics and ``GET /metrics`` (docs/operations.md lists every one).

Several gateway processes on one port (``inferq api --workers N``) each count their own requests;
prometheus-client's multiprocess mode adds them up at scrape time, so any process answers for all.
``inferq api`` turns it on (:func:`prepare_multiprocess`, before any metric exists); a gateway
started another way counts per process unless ``PROMETHEUS_MULTIPROC_DIR`` is set.

The queue's metrics are the cluster's, not a process's: they are read from Redis at scrape time
(:mod:`inferq.api.queue_metrics`), so they come out once, whichever process answers.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    REGISTRY,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
    multiprocess,
)
from starlette.types import ASGIApp, Message, Receive, Scope, Send

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"


class FrameLike(Protocol):
    """A stream frame as api/streams.py has it."""

    @property
    def type(self) -> str: ...
    @property
    def seq(self) -> int: ...
    @property
    def raw(self) -> str: ...

#: Whether this process's metrics live in multiprocess files: prometheus-client decides it once,
#: when it is imported, from the environment (a later PROMETHEUS_MULTIPROC_DIR changes nothing).
_MULTIPROCESS = bool(os.environ.get(MULTIPROC_ENV))

LATENCY_BUCKETS = (.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120, 300)

REQUESTS = Counter("inferq_http_requests_total", "HTTP requests and WebSocket sessions answered, by "
                   "route template, method and status.", ["route", "method", "status"])
LATENCY = Histogram("inferq_http_request_duration_seconds", "Time to answer a request (a stream: until it "
                    "ends), by route template and method.", ["route", "method"], buckets=LATENCY_BUCKETS)
OPEN_STREAMS = Gauge("inferq_open_streams", "Client streams open now, by kind (ws, sse, openai).", ["kind"],
                     multiprocess_mode="livesum")
STREAMED_TOKENS = Counter("inferq_streamed_tokens_total", "Tokens sent to streaming clients, by kind.", ["kind"])
CATCHUPS = Counter("inferq_stream_catchups_total", "Times a stream read missed events from the job's log: "
                   "on start (a resume or a late subscriber), after a gap in live messages, or after a quiet "
                   "spell.", ["reason"])
REJECTED = Counter("inferq_rejected_total", "Requests refused with 429, by reason (the error code).", ["reason"])
PROMPTS = Counter("inferq_prompts_total", "Jobs queued, by where their prompt is tokenized: gateway (the ids go "
                  "with the job), worker, or client (token ids given).", ["model", "tokenized_by"])
EMBED_SHARED = Counter("inferq_embed_shared_total", "/v1/embeddings requests that joined a shared job "
                       "(api/embed_coalesce.py), and the jobs they went as: requests over jobs is how many "
                       "requests a job carried.", ["kind"])
TTFT = Histogram("inferq_time_to_first_token_seconds", "From a job's submission to its first token reaching "
                 "a streaming client of this gateway (live streams only, not replays).", ["model"],
                 buckets=(.01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 300))


def prepare_multiprocess() -> None:
    """Give the gateway processes a fresh, shared folder for their metric files (call it in the
    parent before they start, and before any metric is created)."""
    current = os.environ.get(MULTIPROC_ENV)
    if current:  # an operator's folder: clear what a previous run left
        for f in Path(current).glob("*.db"):
            f.unlink()
        return
    folder = tempfile.mkdtemp(prefix="inferq-metrics-")
    os.environ[MULTIPROC_ENV] = folder
    import atexit

    atexit.register(shutil.rmtree, folder, ignore_errors=True)


def process_exit() -> None:
    """This gateway process stops: its live gauges (open streams) leave the sum."""
    if os.environ.get(MULTIPROC_ENV):
        multiprocess.mark_process_dead(os.getpid())


def exposition(extra: bytes = b"") -> tuple[bytes, str]:
    """Every process's metrics (summed in multiprocess mode), then ``extra`` (the queue's)."""
    if _MULTIPROCESS:
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)
    else:
        registry = REGISTRY
    return generate_latest(registry) + extra, CONTENT_TYPE_LATEST


class RequestMetrics:
    """ASGI middleware: counts and times every HTTP request and WebSocket session by its route
    template (``/v1/jobs/{job_id}``: bounded labels, no ids), and 429s by reason."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            return await self.app(scope, receive, send)
        started, status = time.perf_counter(), 0

        async def observe(message: Message) -> None:
            nonlocal status
            kind = message["type"]
            if kind == "http.response.start":
                status = message["status"]
            elif kind == "websocket.accept":
                status = 101
            elif kind == "websocket.close" and not status:
                status = 403  # closed before the handshake completed (refused)
            await send(message)

        try:
            await self.app(scope, receive, observe)
        finally:
            route = scope.get("route")
            path = getattr(route, "path", None) or "unmatched"
            method = scope.get("method", "WS")
            REQUESTS.labels(path, method, str(status or 500)).inc()
            LATENCY.labels(path, method).observe(time.perf_counter() - started)


def count_rejection(code: str | None) -> None:
    """A 429 went out (api/errors.py calls this)."""
    REJECTED.labels(code or "rate_limited").inc()


def token_count(raw: str) -> int:
    """A token event's ``n_tokens``, read off its JSON text (the field follows the text, whose
    quotes are escaped, so the last match is the field)."""
    at = raw.rfind('"n_tokens":')
    if at < 0:
        return 0
    end = at + 11
    while end < len(raw) and raw[end].isdigit():
        end += 1
    return int(raw[at + 11:end] or 0)


class StreamMeter:
    """One client stream's share of the metrics: open while inside, tokens as they are handed
    on (added to the counter every ``FLUSH_TOKENS`` and when the stream ends), and the job's time
    to first token when its first token goes out live. ``kind`` None: an internal reader (a
    non-streamed response being collected), not counted."""

    #: tokens counted here before they are added to the shared counter (a lock per addition)
    FLUSH_TOKENS = 64

    def __init__(self, kind: str | None) -> None:
        self.kind = kind
        self._tokens = STREAMED_TOKENS.labels(kind) if kind else None
        self._pending = 0

    def __enter__(self) -> StreamMeter:
        if self.kind:
            OPEN_STREAMS.labels(self.kind).inc()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.kind:
            OPEN_STREAMS.labels(self.kind).dec()
        if self._tokens is not None and self._pending:
            self._tokens.inc(self._pending)
            self._pending = 0

    async def __aenter__(self) -> StreamMeter:
        return self.__enter__()

    async def __aexit__(self, *exc: object) -> None:
        self.__exit__()

    def sent(self, frames: Sequence[FrameLike], model: str, created_at: float, live: bool) -> None:
        """``frames`` go to the client; ``live``: the job had not ended when they were read."""
        if self._tokens is None:
            return
        n = 0
        for f in frames:
            if f.type == "token":
                n += token_count(f.raw)
                if f.seq == 1 and live and created_at:
                    TTFT.labels(model).observe(max(0.0, time.time() - created_at))
        self._pending += n
        if self._pending >= self.FLUSH_TOKENS:
            self._tokens.inc(self._pending)
            self._pending = 0
