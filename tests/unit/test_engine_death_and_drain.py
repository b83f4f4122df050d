"""Leaving with jobs in hand (a Redis of its own): on engine death every active job is handed back
before the exit (code 4); a drain waits for the jobs to end, up to its grace period, then hands
the rest back. The exit function is injected: nothing here really exits."""

from __future__ import annotations

import asyncio
import threading
import time
from concurrent.futures import Future

import pytest
from celery.exceptions import Reject

from inferq.shared import keys
from inferq.shared.schemas import JobMessage, JobStatus, WorkerInfo
from inferq.shared.store import JobStore
from tests.unit.workerkit import GatedEngine, Rig, queued_job, start_runtime
from tests.wait import eventually, eventually_async


async def generating(rig: Rig, store: JobStore, n: int) -> tuple[list[JobMessage], dict[str, Future]]:
    jobs = [await queued_job(store, "scripted") for _ in range(n)]
    runs = {m.id: rig.run_job(m) for m in jobs}

    async def all_started() -> bool:
        return all(m.id in rig.engine.started for m in jobs)

    await eventually_async(all_started, 60, f"{n} jobs are generating")
    return jobs, runs


async def handed_back(store: JobStore, job_id: str, reason: str) -> bool:
    rec, log = await store.get(job_id), await store.read_log(job_id)
    return rec.status is JobStatus.queued and log[-1].type == "restart" and log[-1].reason == reason


async def paused(store: JobStore, job_id: str) -> bool:
    """Handed back with its progress kept (worker/jobs/resume.py): queued, a ``resume`` in its record,
    no restart in its log (its next attempt continues the stream)."""
    rec, log = await store.get(job_id), await store.read_log(job_id)
    return rec.status is JobStatus.queued and await store.redis.hexists(keys.job(job_id), "resume") \
        and not [e for e in log if e.type == "restart"]


async def test_a_job_that_sees_the_engine_die_hands_everything_back_before_exit(store, own_redis) -> None:
    engine = GatedEngine()
    rig = start_runtime(own_redis, engine)
    try:
        stuck, runs = await generating(rig, store, 2)
        dying = await queued_job(store, "scripted")
        engine.die_for.add(dying.id)
        runs[dying.id] = rig.run_job(dying)
        eventually(rig.exited.is_set, 30, "the worker exits", interval=0.02)
        *sent, last = rig.events
        assert last == ("exit", 4) and sorted(v for _, v in sent) == sorted([dying.id, *(m.id for m in stuck)])
        for job_id, run in runs.items():
            assert await handed_back(store, job_id, "engine_failure")
            assert run.result(10) is None, "no end written"
    finally:
        rig.stop()


async def test_the_heartbeat_seeing_the_engine_dead_hands_everything_back_before_exit(store, own_redis) -> None:
    engine = GatedEngine()
    rig = start_runtime(own_redis, engine)
    try:
        jobs, runs = await generating(rig, store, 3)
        engine.errored = True  # the engine core died: no job hears of it (they wait for a step)
        eventually(rig.exited.is_set, 30, "the worker exits", interval=0.02)
        assert rig.events[-1] == ("exit", 4) and sorted(rig.sent) == sorted(m.id for m in jobs)
        with pytest.raises(Reject):  # a message that arrives now goes back to the queue, unclaimed
            rig.runtime.run_job(jobs[0])
        for m in jobs:
            assert await handed_back(store, m.id, "engine_failure")
            assert runs[m.id].result(10) is None and m.id in engine.aborted
    finally:
        rig.stop()


async def test_drain_announces_itself_then_hands_back_what_is_left(store, own_redis) -> None:
    rig = start_runtime(own_redis, GatedEngine(), drain_timeout_s=0.5)
    r = store.redis
    try:
        [job], runs = await generating(rig, store, 1)
        started = time.monotonic()
        await asyncio.to_thread(rig.runtime.drain)
        assert time.monotonic() - started >= 0.5
        info = WorkerInfo.model_validate_json(await r.get(keys.worker(rig.runtime.id)))
        assert info.draining
        # the engine still runs: the job is paused, to continue on another worker where it stopped
        assert rig.sent == [job.id] and await paused(store, job.id)
        assert runs[job.id].result(10) is None and not rig.exited.is_set()
    finally:
        rig.stop()


async def test_drain_returns_as_soon_as_the_last_job_ends(store, own_redis) -> None:
    rig = start_runtime(own_redis, GatedEngine(), drain_timeout_s=60)
    try:
        [job], runs = await generating(rig, store, 1)
        drained = threading.Event()
        drain = threading.Thread(target=lambda: (rig.runtime.drain(), drained.set()))
        drain.start()
        assert not drained.is_set()
        rig.runtime.host.loop.call_soon_threadsafe(rig.runtime.runner.cancel, job.id)  # the job ends
        eventually(drained.is_set, 10, "the drain returns, long before its 60 s grace period", interval=0.02)
        assert runs[job.id].result(10) is JobStatus.cancelled and rig.sent == []
        drain.join()
    finally:
        rig.stop()


async def test_a_job_that_ends_during_its_hand_back_is_not_cancelled_while_ending(store) -> None:
    from inferq.worker.jobs.attempts import Attempt, AttemptTable
    from inferq.worker.liveness.handback import LocalHandBack

    table = AttemptTable()
    runs = {}
    for name in ("ends", "runs"):
        msg = await queued_job(store, "scripted")
        await store.claim(msg.id, "w")
        runs[name] = (msg.id, Attempt(task=asyncio.ensure_future(asyncio.Event().wait()), attempt=1))
        assert table.take_over(*runs[name])
    ends_id, ends = runs["ends"]

    def send(msg: JobMessage) -> None:  # meanwhile, one run ends on its own and starts writing its end
        table.done(ends_id, ends)

    await LocalHandBack(table, store, send, "w", max_attempts=3).all("worker_shutdown")
    for job_id, job in runs.values():
        assert job.released and await handed_back(store, job_id, "worker_shutdown")
    ending, running = runs["ends"][1].task, runs["runs"][1].task
    await asyncio.gather(running, return_exceptions=True)
    assert running.cancelled() and not ending.done(), "only the run still in progress was cancelled"
    ending.cancel()
