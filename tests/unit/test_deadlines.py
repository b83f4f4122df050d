"""Queued jobs and their deadlines: a queued job's record outlives its deadline (by a full TTL), a
job still queued at its deadline ends ``failed`` ``deadline_exceeded`` with a final event (the
reaper's sweep, whether or not a worker takes it), and the settings keep the TTL a margin above
the longest timeout. Against a real Redis; time is passed in, never waited for."""

from __future__ import annotations

import time

import pydantic
import pytest
import redis.asyncio

from inferq.shared import keys
from inferq.shared.schemas import JobRecord, JobRequest, JobStatus
from inferq.shared.settings import Settings
from inferq.shared.store import JobStore, queue_depths
from inferq.worker.liveness.deadlines import sweep_deadlines

TTL = 60  # the TTL equal to the timeout: the settings of the run where 134 of 300 queued jobs vanished


async def _submitted(store: JobStore, timeout: float, model: str = "m") -> JobRecord:
    rec = JobRecord(id=f"job-{time.time_ns():032x}"[:36], model=model, request=JobRequest(prompt="x", timeout=timeout))
    rec.deadline = rec.created_at + timeout
    await store.submit(rec, keys.queue_lists(model)[5], '{"a message": 1}', 100)
    return rec


async def test_a_queued_jobs_record_outlives_its_deadline_by_a_ttl(r: redis.asyncio.Redis) -> None:
    store = JobStore(r, TTL)
    rec = await _submitted(store, timeout=TTL)
    assert await r.ttl(keys.job(rec.id)) > TTL + TTL - 5  # the deadline's 60 s and a TTL after it
    no_deadline = JobRecord(id=f"job-{time.time_ns() + 1:032x}"[:36], model="m", request=JobRequest(prompt="x"))
    await store.submit(no_deadline, keys.queue_lists("m")[5], "{}", 100)
    assert TTL - 5 < await r.ttl(keys.job(no_deadline.id)) <= TTL


async def test_a_requeued_jobs_record_outlives_its_deadline(r: redis.asyncio.Redis) -> None:
    store = JobStore(r, TTL)
    rec = await _submitted(store, timeout=10 * TTL)
    await store.claim(rec.id, "w")
    assert await store.requeue(rec.id, "w", 1, "worker_lost", max_attempts=3) == "requeued"
    assert await r.ttl(keys.job(rec.id)) > 10 * TTL + TTL - 5


async def test_a_job_queued_at_its_deadline_fails_with_a_final_event(r: redis.asyncio.Redis) -> None:
    """The reaper's sweep ends it; its message, still in the queue, no longer counts in the depth
    (a worker pops it and skips it); a job not yet at its deadline is left queued."""
    store = JobStore(r, TTL)
    late, early = await _submitted(store, timeout=5), await _submitted(store, timeout=3600)
    assert sum(await queue_depths(r, "m")) == 2
    assert await sweep_deadlines(store, late.deadline + 0.1) == 1
    rec = await store.get(late.id)
    assert rec is not None and rec.status is JobStatus.failed and rec.error is not None
    assert (rec.error.type, rec.error.code) == ("timeout_error", "deadline_exceeded")
    [final] = await store.read_log(late.id)
    assert final.type == "error" and final.error.code == "deadline_exceeded"
    assert (await store.get(early.id)).status is JobStatus.queued
    assert sum(await queue_depths(r, "m")) == 1 and await r.llen(keys.queue_lists("m")[5]) == 2
    assert await r.zrange(keys.QUEUED, 0, -1) == [early.id]
    assert await r.ttl(keys.job(late.id)) > TTL - 5  # read for a TTL after its end
    assert await sweep_deadlines(store, late.deadline + 0.1) == 0  # once


def test_the_ttl_must_exceed_the_longest_timeout_by_a_margin() -> None:
    """TTL = timeout (60 = 60) is refused; the margin is a minute, or a dead reaper's lock and a
    pass (INFERQ_WORKER_TTL_S + INFERQ_HEARTBEAT_S) when longer."""
    with pytest.raises(pydantic.ValidationError, match="must exceed INFERQ_MAX_TIMEOUT_S"):
        Settings(job_ttl_s=60, max_timeout_s=60, default_timeout_s=60)
    assert Settings(job_ttl_s=120, max_timeout_s=60, default_timeout_s=60).deadline_margin_s == 60
    with pytest.raises(pydantic.ValidationError, match="by at least 100 s"):
        Settings(job_ttl_s=159, max_timeout_s=60, default_timeout_s=60, worker_ttl_s=90, heartbeat_s=10)
    s = Settings()
    assert s.job_ttl_s >= s.max_timeout_s + s.deadline_margin_s
