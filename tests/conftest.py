"""Fixtures that start real processes: redis-server, Celery workers with vLLM (CPU), the gateway.

Every process is started on a free port with its own environment and stopped at the end of the
session, whatever happened in between.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
import redis

from inferq.cli.procs import Proc as Service
from inferq.cli.procs import RedisProc, free_port, http_ok, start_redis, wait_until
from tests.otlp import Receiver

ROOT = Path(__file__).resolve().parent.parent
__all__ = ["Service", "Stack", "RedisServer", "free_port", "http_ok", "inferq_env", "spawn", "wait_for"]


def wait_for(predicate: Callable[[], bool], timeout: float, what: str, procs: list | None = None) -> None:
    """Until ``predicate()`` holds; fails early if one of ``procs`` (Service or Popen) exits."""
    wait_until(predicate, timeout, what, procs or [])


def spawn(name: str, cmd: list[str], env: dict[str, str], logdir: Path) -> Service:
    """Start ``cmd`` in a session of its own, output to ``logdir/name.log``."""
    return Service(name, cmd, env, logdir / f"{name}.log", cwd=ROOT)


@dataclass
class RedisServer:
    url: str
    port: int
    service: RedisProc

    def client(self) -> redis.Redis:
        return redis.Redis.from_url(self.url, decode_responses=True)


@pytest.fixture(scope="session")
def logdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("logs")


@pytest.fixture(scope="session")
def redis_server(logdir: Path) -> Iterator[RedisServer]:
    svc = start_redis(free_port(), logdir)
    yield RedisServer(svc.url, svc.port, svc)
    svc.stop(signal.SIGKILL)


def inferq_env(redis_url: str, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("INFERQ_")}
    env.update(
        INFERQ_REDIS_URL=redis_url,
        INFERQ_MAX_NUM_SEQS="64",
        INFERQ_CPU_KV_CACHE_GIB="0.5",
        INFERQ_HEARTBEAT_S="0.5",
        INFERQ_WORKER_TTL_S="3",
        INFERQ_DEFAULT_MAX_TOKENS="32",
        INFERQ_METRICS_PORT="0",  # a test that scrapes a worker gives it a free port
        PYTHONUNBUFFERED="1",
        VLLM_NO_USAGE_STATS="1",
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
    )
    env.update(extra)
    return env


@dataclass
class Stack:
    base: str
    ws: str
    redis: RedisServer
    workers: dict[str, Service] = field(default_factory=dict)
    gateway: Service | None = None
    metrics_ports: dict[str, int] = field(default_factory=dict)  # worker id -> its /metrics port

    def http(self) -> httpx.Client:
        return httpx.Client(base_url=self.base, timeout=60)


@pytest.fixture(scope="session")
def otlp() -> Iterator[Receiver]:
    """An OTLP/HTTP receiver the session stack sends its traces to."""
    receiver = Receiver()
    yield receiver
    receiver.stop()


@pytest.fixture(scope="session")
def stack(redis_server: RedisServer, logdir: Path, otlp: Receiver) -> Iterator[Stack]:
    """Two workers on the default model's queue and one gateway, all real processes, tracing to
    ``otlp``; the workers parse tool calls as vLLM's ``pythonic`` parser does."""
    py = [sys.executable, "-m", "inferq.cli"]
    port = free_port()
    st = Stack(f"http://127.0.0.1:{port}", f"ws://127.0.0.1:{port}", redis_server)
    try:
        for wid in ("w1", "w2"):
            st.metrics_ports[wid] = free_port()
            st.workers[wid] = spawn(f"worker-{wid}", [*py, "worker"], inferq_env(
                redis_server.url, INFERQ_WORKER_ID=wid, INFERQ_METRICS_PORT=str(st.metrics_ports[wid]),
                INFERQ_OTEL_ENDPOINT=otlp.endpoint, INFERQ_TOOL_CALL_PARSER="pythonic"), logdir)
        st.gateway = spawn("gateway", [*py, "api", "--port", str(port)],
                           inferq_env(redis_server.url, INFERQ_OTEL_ENDPOINT=otlp.endpoint), logdir)

        def ready() -> bool:
            return http_ok(f"{st.base}/readyz", lambda body: body["workers"] == 2)

        try:
            wait_for(ready, 240, "two workers and the gateway", [*st.workers.values(), st.gateway])
        except Exception:
            for s in [*st.workers.values(), st.gateway]:
                print(f"--- {s.name} ---\n{s.tail()}", file=sys.stderr)
            raise
        yield st
    finally:
        for s in [st.gateway, *st.workers.values()]:
            if s is not None:
                s.stop()
