"""kombu's unacked messages (a Redis of its own): one parser, each entry parsed once per pass; a
stranded queued job is re-sent, a running one is left to its worker."""

from __future__ import annotations

import json
import time
import uuid

import pytest
import redis
from kombu import Connection

from inferq.shared import keys
from inferq.shared.celery_app import make_celery, send_job
from inferq.shared.schemas import JobRecord, JobRequest, JobStatus
from inferq.shared.settings import Settings
from inferq.shared.store import JobStore
from inferq.worker.liveness import unacked
from inferq.worker.liveness.unacked import UnackedEntries, job_id_of, sweep_queued, sweep_unacked


async def job(store: JobStore, model: str, status: JobStatus = JobStatus.queued) -> str:
    rec = JobRecord(id=f"job-{uuid.uuid4().hex}", model=model, request=JobRequest(prompt="p"))
    await store.create(rec)
    if status is JobStatus.running:
        await store.claim(rec.id, "w")
    return rec.id


async def delivered(store: JobStore, job_id: str, at: float) -> str:
    """An entry as kombu's Redis transport writes it: [message, exchange, routing key]."""
    tag = uuid.uuid4().hex
    await store.redis.hset(keys.KOMBU_UNACKED, tag, json.dumps([{"headers": {"id": job_id}}, "", "q"]))
    await store.redis.zadd(keys.KOMBU_UNACKED_INDEX, {tag: at})
    return tag


def test_the_parser_reads_a_real_celery_delivery(own_redis: str) -> None:
    settings = Settings(redis_url=own_redis, served_model_name=f"m-{uuid.uuid4().hex[:6]}")
    app = make_celery(settings)
    job_id = f"job-{uuid.uuid4().hex}"
    rec = JobRecord(id=job_id, model=settings.model_name, request=JobRequest(prompt="p", priority=0))
    send_job(app, rec.message())
    with Connection(own_redis, transport_options=app.conf.broker_transport_options) as conn:
        conn.SimpleQueue(keys.queue(settings.model_name)).get(timeout=5)  # delivered, never acked
        client = redis.Redis.from_url(own_redis, decode_responses=True)
        raws = list(client.hvals(keys.KOMBU_UNACKED))
        client.close()
    assert [job_id_of(raw) for raw in raws] == [job_id]
    assert job_id_of(None) is None and job_id_of("not json") is None and job_id_of('[{"headers": {}}]') is None


async def test_a_stranded_queued_job_is_resent_and_a_running_one_left(store) -> None:
    sent, old = [], time.time() - 60
    stranded, running = await job(store, "m"), await job(store, "m", JobStatus.running)
    gone = f"job-{uuid.uuid4().hex}"  # its record expired
    requeued = await job(store, "m")  # handed back since its delivery, with a new message
    tags = {j: await delivered(store, j, old) for j in (stranded, running, gone, requeued)}
    await store.redis.zadd(keys.QUEUED, {stranded: old - 1, requeued: time.time()})  # when each was queued
    fresh = await delivered(store, await job(store, "m"), time.time())  # its worker is about to claim it
    entries = UnackedEntries(store.redis)
    assert await sweep_unacked(store, sent.append, entries, time.time() - 10) == 1
    assert [m.id for m in sent] == [stranded]
    left = set(await store.redis.hkeys(keys.KOMBU_UNACKED))
    assert left == {tags[running], fresh}, "the running job's message stays for its worker to ack"
    assert set(await store.redis.zrange(keys.KOMBU_UNACKED_INDEX, 0, -1)) == left


async def test_a_queued_job_with_no_message_anywhere_is_resent(store) -> None:
    sent, now = [], time.time()
    lost, held = await job(store, "m"), await job(store, "m")
    started = await job(store, "m", JobStatus.running)
    await store.redis.zadd(keys.QUEUED, dict.fromkeys((lost, held, started), now - 60))
    await delivered(store, held, now)  # a worker holds its message
    await store.redis.rpush(keys.queue_lists("m")[5], "a message")  # the model's queue is not empty...
    assert await sweep_queued(store, sent.append, UnackedEntries(store.redis), now - 10, now) == 0
    await store.redis.delete(keys.queue_lists("m")[5])  # ...and now it is
    assert await sweep_queued(store, sent.append, UnackedEntries(store.redis), now - 10, now) == 1
    assert [m.id for m in sent] == [lost]
    assert await store.redis.zscore(keys.QUEUED, lost) == pytest.approx(now)  # judged again later
    assert await store.redis.zscore(keys.QUEUED, started) is None  # no longer queued: forgotten


async def test_one_pass_parses_each_entry_once(store, monkeypatch) -> None:
    parsed: list[str | None] = []

    def counting(raw: str | None) -> str | None:
        parsed.append(raw)
        return job_id_of(raw)

    monkeypatch.setattr(unacked, "job_id_of", counting)
    now = time.time()
    running, holding = await job(store, "m", JobStatus.running), await job(store, "m")
    await delivered(store, running, now - 60)  # old: the first sweep reads it
    await delivered(store, holding, now)  # recent: only the second sweep needs it
    await store.redis.zadd(keys.QUEUED, {holding: now - 60})
    entries = UnackedEntries(store.redis)
    assert await sweep_unacked(store, lambda m: None, entries, now - 10) == 0
    assert await sweep_queued(store, lambda m: None, entries, now - 10, now) == 0  # held: not re-sent
    assert len(parsed) == 2, "both sweeps read both entries; each was parsed once"

