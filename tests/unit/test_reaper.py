"""The reaper (a Redis of its own): it requeues a silent worker's jobs and never its own, takes
only the jobs it hands back, and keeps to its time budget."""

from __future__ import annotations

import logging
import time
import uuid

import redis

from inferq.shared import keys
from inferq.shared.schemas import JobMessage, JobRecord, JobRequest, JobStatus
from inferq.shared.settings import Settings
from inferq.shared.store import JobStore
from inferq.worker.liveness.heartbeat import Heartbeat
from inferq.worker.liveness.reaper import Budget, Reaper


def make_reaper(url: str, model: str, sent: list[str], **settings: object) -> Reaper:
    s = Settings(redis_url=url, worker_id="me", served_model_name=model, worker_ttl_s=3, heartbeat_s=0.5,
                 **settings)
    return Reaper(s, "me", lambda msg: sent.append(msg.id))


async def running_job(store: JobStore, model: str, worker_id: str) -> str:
    rec = JobRecord(id=f"job-{uuid.uuid4().hex}", model=model, request=JobRequest(prompt="p"))
    await store.create(rec)
    await store.claim(rec.id, worker_id)
    return rec.id


async def fall_silent(r: redis.asyncio.Redis, model: str, *worker_ids: str) -> None:
    stale = time.time() - 60
    await r.zadd(keys.MODELS, {model: time.time()})
    await r.zadd(keys.workers(model), dict.fromkeys(worker_ids, stale))


async def test_reaper_requeues_a_silent_worker_but_never_itself(r, own_redis) -> None:
    model, sent = f"m-{uuid.uuid4().hex[:6]}", []
    reaper = make_reaper(own_redis, model, sent)
    reaper.bind(r)
    store = JobStore(r, 120)
    jobs = {wid: await running_job(store, model, wid) for wid in ("me", "gone")}
    # both look silent: "me" just waited out a Redis outage in a retry
    await fall_silent(r, model, "me", "gone")
    assert await reaper.run_once() == 1
    mine, theirs = await store.get(jobs["me"]), await store.get(jobs["gone"])
    assert mine.status is JobStatus.running and mine.worker == "me"
    assert theirs.status is JobStatus.queued and theirs.worker is None and sent == [jobs["gone"]]
    assert (await store.read_log(jobs["gone"]))[-1].reason == "worker_lost"
    assert await r.zscore(keys.workers(model), "me") is not None
    assert await r.zscore(keys.workers(model), "gone") is None and not await r.exists(keys.worker_jobs("gone"))
    assert await r.get(keys.REAPER_LOCK) is None, "the lock is released after the pass"


async def test_reaper_waits_for_trust_and_for_the_lock(r, own_redis) -> None:
    model, sent = f"m-{uuid.uuid4().hex[:6]}", []
    reaper = make_reaper(own_redis, model, sent)
    reaper.bind(r)
    job = await running_job(JobStore(r, 120), model, "gone")
    await fall_silent(r, model, "gone")
    reaper.trusted = lambda: False  # not a full TTL of its own beats yet
    assert await reaper.run_once() is None
    reaper.trusted = lambda: True
    await r.set(keys.REAPER_LOCK, "someone-else", px=10_000)
    assert await reaper.run_once() is None and await r.get(keys.REAPER_LOCK) == "someone-else"
    assert not sent and (await JobStore(r, 120).get(job)).status is JobStatus.running


async def test_a_pass_that_waited_out_an_outage_judges_no_one(r, own_redis) -> None:
    """Trusted when the pass began, but the pass then waited in Redis retries through an outage (a
    Redis failover): this worker's own beats waited as long as the others', so none is judged."""
    model, sent = f"m-{uuid.uuid4().hex[:6]}", []
    reaper = make_reaper(own_redis, model, sent)
    reaper.bind(r)
    job = await running_job(JobStore(r, 120), model, "late")
    await fall_silent(r, model, "late")
    answers = iter([True, False])  # at the start of the pass; when it judges
    reaper.trusted = lambda: next(answers)
    assert await reaper.run_once() == 0
    assert not sent and (await JobStore(r, 120).get(job)).status is JobStatus.running


def test_trust_needs_a_recent_beat_not_only_a_long_run_of_them() -> None:
    """A beat stuck in Redis retries through an outage has not ended the run of good beats yet;
    the worker stops trusting its view of others once its last good beat is half a TTL old."""
    s = Settings(worker_id="me", worker_ttl_s=3, heartbeat_s=0.5)
    hb, now = Heartbeat(s, "me", worker=None), time.monotonic()  # type: ignore[arg-type]
    hb.trusted_since, hb.last_ok = now - 10, now - 0.2
    assert hb.trusted()
    hb.last_ok = now - 2  # no beat taken for 2 s: an outage under way
    assert not hb.trusted()
    hb.trusted_since = None
    assert not hb.trusted()


async def test_jobs_claimed_after_the_snapshot_stay_with_their_worker(r, own_redis) -> None:
    model, sent = f"m-{uuid.uuid4().hex[:6]}", []
    reaper = make_reaper(own_redis, model, sent)
    reaper.bind(r)
    store = JobStore(r, 120)
    old, again = await running_job(store, model, "slow"), await running_job(store, model, "slow")
    await fall_silent(r, model, "slow")
    [dead] = await reaper.silent()
    assert sorted(dead.jobs) == sorted([old, again])
    # after the reaper read its job set, the worker (slow, not dead) handed one job back and
    # claimed it again, and claimed a new one
    assert await store.requeue(again, "slow", 1, "worker_shutdown", max_attempts=3) == "requeued"
    assert (await store.claim(again, "slow")).attempt == 2
    new = await running_job(store, model, "slow")
    await r.set(keys.REAPER_LOCK, "token")
    assert await reaper.reap(dead, Budget(60, time.monotonic), "token") == 1
    assert (await store.get(old)).status is JobStatus.queued and sent == [old]
    rerun = await store.get(again)
    assert rerun.status is JobStatus.running and rerun.worker == "slow" and rerun.attempt == 2
    assert (await store.get(new)).status is JobStatus.running
    assert await r.smembers(keys.worker_jobs("slow")) == {again, new}
    assert await r.zscore(keys.workers(model), "slow") is not None, "a worker with jobs is not forgotten"


async def test_reaper_keeps_to_its_budget_and_holds_the_lock_longer(r, own_redis) -> None:
    model, sent, clock, lock_ttls = f"m-{uuid.uuid4().hex[:6]}", [], [0.0], []
    sync = redis.Redis.from_url(own_redis)

    def slow_send(msg: JobMessage) -> None:  # each hand-back costs a second on the reaper's clock
        sent.append(msg.id)
        lock_ttls.append(sync.pttl(keys.REAPER_LOCK))
        clock[0] += 1.0

    settings = Settings(redis_url=own_redis, served_model_name=model, worker_ttl_s=3, reaper_budget_s=2.5)
    reaper = Reaper(settings, "me", slow_send, clock=lambda: clock[0])
    reaper.bind(r)
    store = JobStore(r, 120)
    jobs = [await running_job(store, model, "gone") for _ in range(8)]
    await fall_silent(r, model, "gone")
    passes = []
    while await r.zscore(keys.workers(model), "gone") is not None:
        assert len(passes) < 5, passes
        passes.append(await reaper.run_once())
        assert await r.get(keys.REAPER_LOCK) is None
    assert passes == [3, 3, 2], "a pass stops once its budget is spent; the next one goes on"
    assert sorted(sent) == sorted(jobs) and all(2500 < ttl <= 5000 for ttl in lock_ttls), lock_ttls
    sync.close()


async def test_a_worker_that_beats_before_the_hand_back_keeps_its_jobs(r, own_redis) -> None:
    model, sent = f"m-{uuid.uuid4().hex[:6]}", []
    reaper = make_reaper(own_redis, model, sent)
    reaper.bind(r)
    store = JobStore(r, 120)
    jobs = [await running_job(store, model, "late") for _ in range(3)]
    await fall_silent(r, model, "late")
    [dead] = await reaper.silent()
    await r.zadd(keys.workers(model), {"late": time.time()})  # its beat arrives late, but it arrives
    await r.set(keys.REAPER_LOCK, "token")
    assert await reaper.reap(dead, Budget(60, time.monotonic), "token") == 0
    assert not sent and [(await store.get(j)).status for j in jobs] == [JobStatus.running] * 3
    assert await r.smembers(keys.worker_jobs("late")) == set(jobs)
    assert await r.zscore(keys.workers(model), "late") is not None


async def test_a_reaper_that_stops_trusting_its_own_beats_says_so_once(r, own_redis, caplog) -> None:
    """A worker frozen meanwhile is not taken back: the log says why, once a spell (not at start-up)."""
    reaper = make_reaper(own_redis, f"m-{uuid.uuid4().hex[:6]}", [])
    reaper.bind(r)
    said = lambda: sum("not judging other workers" in m for m in caplog.messages)  # noqa: E731
    with caplog.at_level(logging.INFO, logger="inferq.worker.liveness.reaper"):
        reaper.trusted = lambda: False
        assert await reaper.run_once() is None and said() == 0  # start-up: no TTL of beats yet
        reaper.trusted = lambda: True
        assert await reaper.run_once() == 0
        reaper.trusted = lambda: False
        assert await reaper.run_once() is None and await reaper.run_once() is None
        assert said() == 1
        reaper.trusted = lambda: True
        await reaper.run_once()
        reaper.trusted = lambda: False
        await reaper.run_once()
        assert said() == 2
