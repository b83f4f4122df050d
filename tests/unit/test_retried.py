"""shared.redis.retried: a Redis call's first try goes straight, a transient failure is retried
with backoff for the budget, anything else is not retried."""

from __future__ import annotations

import time

import pytest
from redis.asyncio.sentinel import MasterNotFoundError
from redis.exceptions import ConnectionError, ReadOnlyError, ResponseError
from redis.sentinel import MasterNotFoundError as SyncMasterNotFoundError

from inferq.shared.redis import retried


def flaky(failures: int, error: Exception) -> tuple[list[float], object]:
    calls: list[float] = []

    async def call() -> str:
        calls.append(time.monotonic())
        if len(calls) <= failures:
            raise error
        return "ok"

    return calls, call


async def test_the_first_try_that_works_is_the_only_call() -> None:
    calls, call = flaky(0, ConnectionError("x"))
    assert await retried(call) == "ok" and len(calls) == 1


async def test_a_transient_failure_is_retried_until_it_works() -> None:
    calls, call = flaky(3, ConnectionError("Redis is restarting"))
    assert await retried(call, seconds=10) == "ok"
    assert len(calls) == 4


@pytest.mark.parametrize("error", [ReadOnlyError("READONLY You can't write against a read only replica."),
                                   MasterNotFoundError("No master found for 'inferq'"),
                                   SyncMasterNotFoundError("No master found for 'inferq'")])
async def test_a_failover_is_retried(error: Exception) -> None:
    """A demoted master's READONLY, and no master named by the Sentinels yet: a failover under way."""
    calls, call = flaky(2, error)
    assert await retried(call, seconds=10) == "ok" and len(calls) == 3


async def test_a_refusal_is_not_retried() -> None:
    calls, call = flaky(5, ResponseError("WRONGTYPE"))
    with pytest.raises(ResponseError):
        await retried(call)
    assert len(calls) == 1


async def test_it_gives_up_after_the_budget_with_the_last_error() -> None:
    calls, call = flaky(10_000, ConnectionError("gone"))
    started = time.monotonic()
    with pytest.raises(ConnectionError, match="gone"):
        await retried(call, seconds=0.5)
    assert 0.4 < time.monotonic() - started < 5 and len(calls) >= 3
