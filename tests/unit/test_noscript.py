"""A Redis that lost its scripts (restarted, SCRIPT FLUSH) answers NOSCRIPT to EVALSHA: every script
call is loaded again and retried, never failed (a Redis of its own, flushed between two calls).

Scripts are redis-py ``AsyncScript`` objects (``shared.lua.register``): a direct call loads the
script again on NOSCRIPT; a pipeline that holds a script asks SCRIPT EXISTS and loads it before it
runs; and the event writer's pipeline of plain EVALSHA (``JobStore.append``) loads it and sends the
batch again itself."""

from __future__ import annotations

import uuid

from inferq.shared import keys, lua
from inferq.shared.schemas import DoneEvent, ErrorInfo, JobRecord, JobRequest, JobStatus, TokenEvent
from inferq.shared.store import JobStore


async def flushed(store: JobStore) -> None:
    await store.redis.script_flush()
    assert await store.redis.script_exists(store._claim.sha) == [False]


async def noscript_answers(store: JobStore) -> int:
    """How many NOSCRIPT errors Redis answered since its stats were reset."""
    stats = await store.redis.info("errorstats")
    return int(stats.get("errorstat_NOSCRIPT", {}).get("count", 0))


async def job(store: JobStore) -> str:
    rec = JobRecord(id=f"job-{uuid.uuid4().hex}", model="m", request=JobRequest(prompt="p"))
    await store.submit(rec, keys.queue_lists("m")[5], "message", max_depth=100)
    await flushed(store)
    return rec.id


async def test_every_job_script_works_after_a_script_flush(store: JobStore) -> None:
    await store.redis.config_resetstat()
    a, b, c, d = [await job(store) for _ in range(4)]  # submit, each time after a flush
    assert (await store.get_visible(a, None)).status is JobStatus.queued
    await flushed(store)
    assert (await store.claim(a, "w", "t")).attempt == 1
    await flushed(store)
    assert await store.append([(a, 1, TokenEvent(seq=1, text="x ", n_tokens=1), 1.0)]) == [True]
    await flushed(store)
    assert await store.append([(a, 1, TokenEvent(seq=2, text="y ", n_tokens=1))]) == [True]
    await flushed(store)
    assert await store.update(a, finish_reason="length") is True
    await flushed(store)
    assert await store.finish(a, "w", 1, DoneEvent(seq=3, status=JobStatus.succeeded),
                              status=JobStatus.succeeded) is JobStatus.succeeded
    await store.claim(b, "w")
    await flushed(store)
    assert await store.requeue(b, "w", 1, "worker_lost", 3) == "requeued"
    await flushed(store)
    assert await store.request_cancel(c) is JobStatus.queued
    await flushed(store)
    assert await store.fail_queued(d, ErrorInfo(type="invalid_request_error", code="undecodable_job",
                                                 message="m")) is True
    assert [e.type for e in await store.read_log(a)] == ["token", "token", "done"]
    assert await noscript_answers(store) >= 13, "each call after a flush met NOSCRIPT first"


async def test_worker_scripts_and_a_pipeline_of_scripts_work_after_a_script_flush(store: JobStore) -> None:
    r = store.redis
    await r.config_resetstat()
    release = lua.register(r, "lock_release")  # as the reaper, the heartbeat and the batch runner hold them
    await r.set("lock", "me")
    await flushed(store)
    assert await lua.register(r, "lock_extend")(keys=["lock"], args=["me", 60_000])
    await flushed(store)
    async with r.pipeline(transaction=False) as p:  # the batch runner's way: a script in a pipeline
        await release(keys=["lock"], args=["me"], client=p)
        assert await p.execute() == [1]
    await r.set("lock", "me")
    await flushed(store)
    assert await release(keys=["lock"], args=["me"]) == 1
    assert await noscript_answers(store) == 2, "the direct calls met NOSCRIPT; the pipeline asked first"
