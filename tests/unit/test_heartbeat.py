"""The heartbeat (a Redis of its own): it keeps beating while the engine loop or the reaper is
stuck, and a worker that finds itself reaped stops the attempts taken from it and re-registers."""

from __future__ import annotations

import threading

import pytest
import redis

from inferq.shared import keys
from inferq.shared.schemas import JobStatus, WorkerInfo
from inferq.shared.store import JobStore
from tests.unit.workerkit import GatedEngine, Rig, queued_job, start_runtime
from tests.wait import eventually, eventually_async


async def info(r: redis.asyncio.Redis, worker_id: str) -> WorkerInfo | None:
    raw = await r.get(keys.worker(worker_id))
    return WorkerInfo.model_validate_json(raw) if raw else None


async def beats_for(r: redis.asyncio.Redis, rig: Rig, seconds: float) -> None:
    """Wait until the worker's record shows ``seconds`` more of heartbeats than now."""
    wid = rig.runtime.id
    first = (await info(r, wid)).last_seen

    async def advanced() -> bool:
        now = await info(r, wid)
        score = await r.zscore(keys.workers("scripted"), wid)
        return now is not None and now.last_seen > first + seconds and score > first + seconds

    await eventually_async(advanced, 10 * seconds, f"the heartbeat advanced by {seconds} s")


async def test_heartbeat_beats_while_the_engine_loop_is_blocked(r, own_redis) -> None:
    rig = start_runtime(own_redis, GatedEngine())
    gate, blocked, ran_after = threading.Event(), threading.Event(), threading.Event()

    def block() -> None:
        blocked.set()
        gate.wait(60)

    try:
        rig.runtime.host.loop.call_soon_threadsafe(block)
        rig.runtime.host.loop.call_soon_threadsafe(ran_after.set)
        eventually(blocked.is_set, 10, "the engine loop is blocked", interval=0.02)
        await beats_for(r, rig, 2 * rig.runtime.settings.worker_ttl_s)
        assert not ran_after.is_set(), "the engine loop was blocked all along"
        assert rig.runtime.heartbeat.trusted()
    finally:
        gate.set()
        rig.stop()
    assert await r.zscore(keys.workers("scripted"), rig.runtime.id) is None, "deregistered on stop"


async def test_a_slow_reaper_never_delays_a_beat(r, own_redis) -> None:
    rig = start_runtime(own_redis, GatedEngine())
    store = JobStore(r, 120)
    gate, sending = threading.Event(), threading.Event()

    def stuck_send(msg) -> None:
        sending.set()
        gate.wait(60)

    rig.runtime.reaper.send = stuck_send
    try:
        job = await queued_job(store, "scripted")
        await store.claim(job.id, "gone")
        await r.zadd(keys.workers("scripted"), {"gone": 1.0})  # silent since 1970
        eventually(sending.is_set, 10, "the reaper is handing back the silent worker's job", interval=0.02)
        await beats_for(r, rig, 2 * rig.runtime.settings.worker_ttl_s)
        assert not gate.is_set() and (await store.get(job.id)).status is JobStatus.queued
    finally:
        gate.set()
        rig.stop()


@pytest.mark.parametrize("reaped_by", ["live set", "job set"])
async def test_a_reaped_worker_stops_the_attempts_taken_from_it(r, own_redis, reaped_by: str) -> None:
    engine = GatedEngine()
    rig = start_runtime(own_redis, engine)
    rt, store = rig.runtime, JobStore(r, 120)
    try:
        taken, kept = await queued_job(store, "scripted"), await queued_job(store, "scripted")
        runs = {m.id: rig.run_job(m) for m in (taken, kept)}
        await eventually_async(lambda: len(engine.started) == 2, 60, "both jobs are generating")
        # another worker's reaper took one job back: only that job, or (an older reaper) the whole set
        assert await store.requeue(taken.id, rt.id, None, "worker_lost", max_attempts=3) == "requeued"
        if reaped_by == "live set":
            await r.zrem(keys.workers("scripted"), rt.id)
        else:
            await r.delete(keys.worker_jobs(rt.id))
        assert runs[taken.id].result(10) is None, "ended, no end written: Celery acks it"
        assert taken.id in engine.aborted
        rec, log = await store.get(taken.id), await store.read_log(taken.id)
        assert rec.status is JobStatus.queued and log[-1].type == "restart"
        await eventually_async(lambda: _is_member(r, rt.id, kept.id), 5, "the job still ours is listed again")
        assert await r.zscore(keys.workers("scripted"), rt.id) is not None
        assert rt.heartbeat.reaped == (1 if reaped_by == "live set" else 0)
        assert (await store.get(kept.id)).status is JobStatus.running and not runs[kept.id].done()
        rt.host.loop.call_soon_threadsafe(rt.runner.cancel, kept.id)
        assert runs[kept.id].result(10) is JobStatus.cancelled
    finally:
        rig.stop()


async def _is_member(r: redis.asyncio.Redis, worker_id: str, job_id: str) -> bool:
    return await r.smembers(keys.worker_jobs(worker_id)) == {job_id}


async def test_a_job_sent_back_to_the_same_worker_runs_its_new_attempt(r, own_redis) -> None:
    """Another worker's reaper took a job back from this (live) worker and re-sent it, and this
    worker took the new message while its old attempt still ran: the old attempt ends without
    an end, and the new one runs unharmed by the old one's refused writes."""
    engine = GatedEngine()
    rig = start_runtime(own_redis, engine)
    rt, store = rig.runtime, JobStore(r, 120)
    try:
        job = await queued_job(store, "scripted")
        first = rig.run_job(job)
        await eventually_async(lambda: engine.started == [job.id], 60, "the first attempt is generating")
        assert await store.requeue(job.id, rt.id, None, "worker_lost", max_attempts=3) == "requeued"
        second = rig.run_job(job)
        assert first.result(10) is None, "the old attempt ended, no end written"
        await eventually_async(lambda: engine.started == [job.id, job.id], 10, "the new attempt is generating")
        await eventually_async(lambda: _logged(store, job.id, 3), 10, "the new attempt's first token is logged")
        rec = await store.get(job.id)
        assert rec.status is JobStatus.running and rec.attempt == 2 and rec.worker == rt.id
        rt.host.loop.call_soon_threadsafe(rt.runner.cancel, job.id)
        assert second.result(10) is JobStatus.cancelled
        assert [e.type for e in await store.read_log(job.id)] == ["token", "restart", "token", "done"]
    finally:
        rig.stop()


async def _logged(store: JobStore, job_id: str, n: int) -> bool:
    return len(await store.read_log(job_id)) >= n
