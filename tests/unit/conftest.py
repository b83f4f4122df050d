from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from types import SimpleNamespace

import pytest
import redis.asyncio

from inferq.shared.redis import make_redis
from inferq.shared.store import JobStore
from tests.unit.workerkit import start_redis


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
