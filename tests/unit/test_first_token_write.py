"""The first-token write cannot hold a job's end: it is bounded by the writer's budget (real Redis
for the job, a Redis that never answers for that write; scripted engine).

A first output that makes no event (a tool-call parser holding text back) has its time written to
the record on its own, beside the token path; the job's end waits for that write (so that it
comes before the end). Against a Redis that accepts connections and never answers, the write
gives up after the budget, says so in the log, and the job ends without ``first_token_at``."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator

import pytest

from bench.standin import Out, Step
from inferq.shared.redis import make_redis
from inferq.shared.schemas import JobStatus
from inferq.shared.store import JobStore
from inferq.worker.jobs.runner import JobRunner
from inferq.worker.jobs.writer import EventWriter
from tests.unit.test_runner import ScriptedEngine, ScriptedHost, queued, script

BUDGET_S = 0.3


@pytest.fixture
async def hung_url() -> AsyncIterator[str]:
    """A server that takes connections and reads what is sent, and never answers (a hung Redis)."""

    async def swallow(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while await reader.read(65536):
            pass
        writer.close()

    server = await asyncio.start_server(swallow, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    yield f"redis://127.0.0.1:{port}/0"
    server.close()


async def test_a_hung_first_token_write_does_not_hold_the_job(unit_redis, hung_url: str, caplog) -> None:
    r, hung = make_redis(unit_redis.url), make_redis(hung_url)
    store = JobStore(r, ttl_s=60)
    store.update = JobStore(hung, ttl_s=60).update  # type: ignore[method-assign]  # the first-token write's Redis
    writer = EventWriter(store, budget_s=BUDGET_S)
    writer.start()
    try:
        silent_first = Step([Out(0, "", [])])  # a first output that makes no event
        runner = JobRunner(ScriptedHost(ScriptedEngine([silent_first, *script(2)])), store, writer, "w",
                           default_max_tokens=8)
        msg = await queued(store, prompt="one two", max_tokens=2)
        with caplog.at_level(logging.WARNING, logger="inferq.worker.jobs.writer"):
            task = asyncio.create_task(runner.run(msg))
            try:
                await asyncio.wait_for(asyncio.shield(task), 30)
            finally:
                task.cancel()
        assert task.result() is JobStatus.succeeded
        rec = await store.get(msg.id)
        assert rec.status is JobStatus.succeeded and rec.first_token_at is None and rec.choices[0].text == "t0 t1 "
        assert f"could not record first_token_at (no answer from Redis in {BUDGET_S:g} s)" in caplog.text
    finally:
        await writer.stop()
        await r.aclose()
        await hung.aclose()
