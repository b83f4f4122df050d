"""Fixtures that start real processes: redis-server, Celery workers with vLLM (CPU), the gateway.

Every process is started on a free port with its own environment and stopped at the end of the
session, whatever happened in between.
"""

from __future__ import annotations

import os
import random
import signal
import socket
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, TypeVar

import httpx
import psutil
import pytest
import redis

from inferq.cli.procs import Proc as Service
from inferq.cli.procs import RedisProc, http_ok, start_redis
from tests.otlp import Receiver
from tests.procs import free_port
from tests.wait import eventually

ROOT = Path(__file__).resolve().parent.parent
__all__ = ["Service", "Stack", "RedisServer", "ahead", "take", "free_port", "quiet_port", "http_ok", "inferq_env",
           "spawn"]


def quiet_port() -> int:
    """A free port below the OS's ephemeral range, for a process that binds it only once it has
    started up (a worker's metrics, after its engine): ``free_port()`` (port 0) hands out ports
    from that range, so no other test's server can take this one in the meantime."""
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    while True:
        port = random.randrange(10_000, max(low, 10_001))
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        return port


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


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Unit tests first: they need no engine, and the session stack's engines start up beside them
    (:func:`_boot_early`) instead of ahead of everything else (about a minute on 2 cores)."""
    items.sort(key=lambda item: "/integration/" in str(item.path).replace(os.sep, "/"))


class Stoppable(Protocol):
    def stop(self) -> None: ...


S = TypeVar("S", bound=Stoppable)
#: fixture name -> what starts the processes it serves (without waiting for them to be ready)
_STARTERS: dict[str, Callable[[pytest.FixtureRequest], Stoppable]] = {}
#: what a starter started ahead of its fixture and no fixture has taken yet
_STARTED: dict[str, Stoppable] = {}
#: memory to keep free, and what one fixture's processes are counted to take (an engine ~2.5 GiB),
#: when starting them ahead: a fixture that does not fit starts when its module does
AHEAD_SPARE_BYTES, AHEAD_EACH_BYTES = 4 * 2**30, 5 * 2**30 // 2


def ahead(fixture: str) -> Callable[[Callable[[pytest.FixtureRequest], S]], Callable[[pytest.FixtureRequest], S]]:
    """Register a module's starter for ``fixture``: once the session stack is ready, the processes
    of every registered fixture the run uses are started in the background (their engines start up
    while the stack's tests run: CPU a 2-core machine has idle then); the fixture takes them with
    :func:`take`."""
    def register(starter: Callable[[pytest.FixtureRequest], S]) -> Callable[[pytest.FixtureRequest], S]:
        _STARTERS[fixture] = starter
        return starter
    return register


def take(fixture: str, request: pytest.FixtureRequest) -> Any:
    """What was started ahead for ``fixture``, or what its starter starts now. The fixture owns
    it from here (stops it)."""
    started = _STARTED.pop(fixture, None)
    return started if started is not None else _STARTERS[fixture](request)


def _used(request: pytest.FixtureRequest) -> set[str]:
    """The fixtures the run's selected tests use."""
    return {name for item in request.session.items for name in getattr(item, "fixturenames", ())}


def _start_ahead(request: pytest.FixtureRequest) -> None:
    used = _used(request)
    budget = psutil.virtual_memory().available - AHEAD_SPARE_BYTES
    for fixture, starter in _STARTERS.items():
        if fixture in used and fixture not in _STARTED and budget >= AHEAD_EACH_BYTES:
            try:
                _STARTED[fixture] = starter(request)
            except Exception as e:  # its own module starts it again, and fails there, where it belongs
                print(f"starting {fixture!r} ahead failed: {e!r}", file=sys.stderr)
                continue
            budget -= AHEAD_EACH_BYTES


@pytest.fixture(scope="session", autouse=True)
def _boot_early(request: pytest.FixtureRequest) -> Iterator[None]:
    """Start the session stack's processes before the first test when any test of the run uses
    it; ``stack`` then waits for them to be ready. At the end, stop what was started ahead and
    never taken."""
    if "stack" in _used(request):
        request.getfixturevalue("booting_stack")
    yield
    while _STARTED:
        _STARTED.popitem()[1].stop()


#: The LoRA adapters of the session stack's workers (and of vLLM's server in the differential suite):
#: name -> seed of its random weights (built by ``lora_adapters``).
ADAPTER_SEEDS = {"tiny-a": 1, "tiny-b": 2}


@pytest.fixture(scope="session")
def lora_adapters(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Random LoRA adapters for the built-in model, written here: name -> folder."""
    from inferq.shared.settings import Settings
    from inferq.worker.engine.models import tiny_model_dir
    from tests.lora import build_tiny_adapter

    base, root = tiny_model_dir(Settings()), tmp_path_factory.mktemp("adapters")
    return {name: build_tiny_adapter(root / name, base, seed) for name, seed in ADAPTER_SEEDS.items()}


def lora_modules(adapters: dict[str, Path]) -> str:
    """INFERQ_LORA_MODULES for ``adapters``."""
    return ",".join(f"{name}={path}" for name, path in adapters.items())


@pytest.fixture(scope="session")
def booting_stack(redis_server: RedisServer, logdir: Path, otlp: Receiver,
                  lora_adapters: dict[str, Path]) -> Iterator[Stack]:
    """The session stack's processes, started and not yet waited for (see ``stack``)."""
    py = [sys.executable, "-m", "inferq.cli"]
    port = quiet_port()
    st = Stack(f"http://127.0.0.1:{port}", f"ws://127.0.0.1:{port}", redis_server)
    try:
        for wid in ("w1", "w2"):
            st.metrics_ports[wid] = quiet_port()
            st.workers[wid] = spawn(f"worker-{wid}", [*py, "worker"], inferq_env(
                redis_server.url, INFERQ_WORKER_ID=wid, INFERQ_METRICS_PORT=str(st.metrics_ports[wid]),
                INFERQ_OTEL_ENDPOINT=otlp.endpoint, INFERQ_TOOL_CALL_PARSER="pythonic",
                INFERQ_LORA_MODULES=lora_modules(lora_adapters)), logdir)
        st.gateway = spawn("gateway", [*py, "api", "--port", str(port)],
                           inferq_env(redis_server.url, INFERQ_OTEL_ENDPOINT=otlp.endpoint,
                                      INFERQ_LORA_RUNTIME_UPDATES="true"), logdir)
        yield st
    finally:
        for s in [st.gateway, *st.workers.values()]:
            if s is not None:
                s.stop()


@pytest.fixture(scope="session")
def stack(booting_stack: Stack, request: pytest.FixtureRequest) -> Stack:
    """Two workers on the default model's queue and one gateway, all real processes, tracing to
    ``otlp``; the workers parse tool calls as vLLM's ``pythonic`` parser does and serve the LoRA
    adapters of ``lora_adapters``; the gateway allows run-time adapter loads."""
    st = booting_stack
    assert st.gateway is not None

    def ready() -> bool:
        return http_ok(f"{st.base}/readyz", lambda body: body["workers"] == 2)

    try:
        eventually(ready, 300, "two workers and the gateway", procs=[*st.workers.values(), st.gateway], interval=0.2)
    except Exception:
        for s in [*st.workers.values(), st.gateway]:
            print(f"--- {s.name} ---\n{s.tail()}", file=sys.stderr)
        raise
    _start_ahead(request)
    return st
