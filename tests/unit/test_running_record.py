"""A running job's record lives as long as the job runs, and a worker's job set holds only jobs
running under it (a Redis of its own, a worker around a scripted engine).

Each heartbeat renews the TTL of the record and log of every job its worker runs, and drops from
the worker's job set the ids whose record is gone or is not running under it (phantoms, which
``/v1/queue`` and ``/metrics`` would count as running forever). A job the claim script has just
listed is running under the worker in its record: it stays. Settings refuse a job TTL that does not
exceed a job's longest deadline by a margin (tests/unit/test_deadlines.py)."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

import pydantic
import pytest
import redis

from bench.standin import LoopHost, Out, Step
from inferq.api import queue_metrics
from inferq.shared import keys
from inferq.shared.schemas import JobStatus
from inferq.shared.settings import Settings
from inferq.shared.store import JobStore
from tests.unit.workerkit import GatedEngine, make_runtime, queued_job, start_runtime
from tests.wait import eventually_async

SHORT = {"job_ttl_s": 120, "max_timeout_s": 60, "default_timeout_s": 60}


async def running(r: redis.asyncio.Redis) -> int:
    """What ``/v1/queue`` and ``/metrics`` report as running for the scripted model."""
    snap = await queue_metrics.snapshot(r, "scripted", 60, 60)
    return snap.running.get("scripted", 0)


async def test_a_job_whose_record_is_gone_leaves_its_worker_set(r, own_redis) -> None:
    engine = GatedEngine()
    rig = start_runtime(own_redis, engine, **SHORT)
    rt, store = rig.runtime, JobStore(r, 60)
    try:
        job = await queued_job(store, "scripted")
        run = rig.run_job(job)
        await eventually_async(lambda: engine.started == [job.id], 60, "the job is generating")
        assert await r.smembers(keys.worker_jobs(rt.id)) == {job.id} and await running(r) == 1
        await r.delete(keys.job(job.id), keys.job_log(job.id))  # its record expired
        await eventually_async(lambda: r.smembers(keys.worker_jobs(rt.id)), 30, "the phantom entry dropped",
                               until=lambda ids: ids == set())
        assert await running(r) == 0
        assert run.result(30) is None, "the attempt stopped, no end written (there is no record to end)"
        assert job.id in engine.aborted and not await r.exists(keys.job(job.id))
    finally:
        rig.stop()


async def test_a_long_job_keeps_its_record_and_log_alive(r, own_redis) -> None:
    """The record and log of a running job are renewed by the heartbeat, not only by its first
    token: here both are left 30 s of a 60 s TTL (as if the job had run 30 s past its first token),
    and come back to the full TTL while the job runs on."""
    engine = GatedEngine()
    rig = start_runtime(own_redis, engine, **SHORT)
    store = JobStore(r, 60)
    try:
        job = await queued_job(store, "scripted")
        run = rig.run_job(job)
        await eventually_async(lambda: store.read_log(job.id), 60, "the first token is logged")
        for key in (keys.job(job.id), keys.job_log(job.id)):
            await r.expire(key, 30)
        for key in (keys.job(job.id), keys.job_log(job.id)):
            await eventually_async(lambda key=key: r.ttl(key), 20, f"{key} renewed to the job TTL",
                                   until=lambda ttl: ttl > 30)
        assert (await store.get(job.id)).status is JobStatus.running and not run.done()
    finally:
        rig.stop()


@dataclass
class TrickleEngine:
    """Streams a token every ``every`` seconds until its request is aborted."""

    every: float = 0.2
    errored: bool = False  # what the heartbeat reads of a live engine
    aborted: list[str] = field(default_factory=list)

    async def generate(self, prompt: Any, params: Any, request_id: str, **_: Any) -> Any:
        try:
            while True:
                yield Step([Out(0, "x ", [1])])
                await asyncio.sleep(self.every)  # the engine's pace
        except (asyncio.CancelledError, GeneratorExit):
            self.aborted.append(request_id)
            raise


async def test_a_job_streaming_past_its_ttl_keeps_its_record(r, own_redis) -> None:
    """Token events after the first do not renew a job's record and log: a job that streams for
    longer than the job TTL keeps them through the heartbeat alone. Here the TTL is 3 s (below
    what the settings accept, set after they are read) and the job streams for two TTLs; the
    record and log are there at every look, and the job then ends with its whole stream."""
    ttl, engine = 3, TrickleEngine()
    rig = make_runtime(own_redis, LoopHost(engine), **SHORT)
    rig.runtime.settings.job_ttl_s = ttl  # the heartbeat's, the claim's and the events' TTL
    rig.runtime.start()
    rt, store = rig.runtime, JobStore(r, 60)
    try:
        job = await queued_job(store, "scripted")
        rig.run_job(job)
        await eventually_async(lambda: store.read_log(job.id), 60, "the first token is logged")
        started = time.monotonic()

        async def alive() -> float:
            for key in (keys.job(job.id), keys.job_log(job.id)):
                assert await r.exists(key), f"{key} expired while the job ran"
            return time.monotonic() - started

        await eventually_async(alive, 60, "the job ran two TTLs past its first token", until=lambda s: s > 2 * ttl)
        assert (await store.get(job.id)).status is JobStatus.running
        await store.request_cancel(job.id)
        rt.host.loop.call_soon_threadsafe(rt.runner.cancel, job.id)
        rec = await eventually_async(lambda: store.get(job.id), 30, "the job's end",
                                     until=lambda rec: rec.status is JobStatus.cancelled)
        log = await store.read_log(job.id)
        assert [e.seq for e in log] == list(range(1, len(log) + 1)) and log[-1].type == "done"
        assert "".join(e.text for e in log[:-1]) == rec.choices[0].text and len(log) > 2 * ttl
    finally:
        rig.stop()


async def test_a_claim_in_flight_stays_listed_and_phantoms_go(r, own_redis) -> None:
    """The claim script lists the job and records it running under the worker in one step: before
    the runner registers the attempt, a beat finds it running under its worker and keeps it. Ids of
    jobs that are gone, ended, or another worker's leave the set."""
    rig = start_runtime(own_redis, GatedEngine(), **SHORT)
    rt, store = rig.runtime, JobStore(r, 60)
    try:
        in_flight = await queued_job(store, "scripted")
        assert (await store.claim(in_flight.id, rt.id)).previous is JobStatus.queued
        ended, elsewhere = await queued_job(store, "scripted"), await queued_job(store, "scripted")
        await store.request_cancel(ended.id)
        await store.claim(elsewhere.id, "another-worker")
        phantoms = {"job-" + "0" * 32, ended.id, elsewhere.id}
        await r.sadd(keys.worker_jobs(rt.id), *phantoms)
        await eventually_async(lambda: r.smembers(keys.worker_jobs(rt.id)), 30, "the phantoms dropped",
                               until=lambda ids: not ids & phantoms)
        assert await r.smembers(keys.worker_jobs(rt.id)) == {in_flight.id}
        assert await r.smembers(keys.worker_jobs("another-worker")) == {elsewhere.id}
        assert (await store.get(in_flight.id)).status is JobStatus.running
    finally:
        rig.stop()


async def test_a_claim_renews_the_record(store: JobStore) -> None:
    """A job claimed near the end of its record's TTL gets the full TTL before it runs."""
    job = await queued_job(store, "m")
    await store.redis.expire(keys.job(job.id), 2)
    await store.claim(job.id, "w")
    assert await store.redis.ttl(keys.job(job.id)) > 2


@pytest.mark.parametrize(("settings", "named"), [
    ({"job_ttl_s": 60}, "INFERQ_MAX_TIMEOUT_S"),
    ({"job_ttl_s": 660, "max_timeout_s": 600}, "INFERQ_DEFAULT_TIMEOUT_S"),
])
def test_a_job_ttl_below_a_deadline_is_refused(settings: dict[str, int], named: str) -> None:
    with pytest.raises(pydantic.ValidationError) as e:
        Settings(**settings)
    assert "INFERQ_JOB_TTL_S" in str(e.value) and named in str(e.value)


def test_a_job_ttl_below_the_max_timeout_is_refused_from_the_environment(monkeypatch) -> None:
    monkeypatch.setenv("INFERQ_JOB_TTL_S", "120")
    with pytest.raises(pydantic.ValidationError, match="INFERQ_MAX_TIMEOUT_S"):
        Settings()
    monkeypatch.setenv("INFERQ_MAX_TIMEOUT_S", "60")
    monkeypatch.setenv("INFERQ_DEFAULT_TIMEOUT_S", "60")
    assert Settings().job_ttl_s == 120


def test_the_defaults_hold() -> None:
    s = Settings()
    assert s.job_ttl_s >= s.max_timeout_s + s.deadline_margin_s and s.job_ttl_s >= s.default_timeout_s
