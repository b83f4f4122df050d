"""Queue depth counts only jobs that are really queued (a Redis of its own, no worker).

A job cancelled while queued ends at once, but its Celery message stays in the queue's list until a
worker pops it and skips it. The depth the admission check uses (and ``GET /v1/queue``,
``/metrics``) is each list's length less the cancelled jobs whose message is still in it."""

from __future__ import annotations

import json
import uuid

import pytest
import redis

from inferq.api import queue_metrics
from inferq.api.admission import Admission
from inferq.api.auth import Principal
from inferq.api.routes.console import queue_view
from inferq.api.service import JobService
from inferq.shared import keys
from inferq.shared.celery_app import job_message, make_celery
from inferq.shared.errors import RateLimited
from inferq.shared.schemas import JobRecord, JobRequest, JobStatus
from inferq.shared.settings import Settings
from inferq.shared.store import JobStore
from tests.helpers import queue_depth

CALLER = Principal(None, None, "127.0.0.1")


def admission(url: str, r: redis.asyncio.Redis, model: str, depth: int) -> Admission:
    s = Settings(redis_url=url, served_model_name=model, max_queue_depth=depth)
    return Admission(s, r, JobService(s, r, JobStore(r, s.job_ttl_s), make_celery(s)))


async def submit(adm: Admission, priority: int = 5) -> str:
    [rec] = (await adm.submit(CALLER, [JobRequest(prompt="x", max_tokens=4, priority=priority)])).records
    return rec.id


async def queued(r: redis.asyncio.Redis, model: str) -> tuple[int, dict[int, int]]:
    """``queued`` and ``by_priority`` as ``GET /v1/queue`` shows them."""
    [view] = queue_view(await queue_metrics.snapshot(r, model, 60, 60)).models
    return view.queued, {p: n for p, n in view.by_priority.items() if n}


async def consume_all(r: redis.asyncio.Redis, store: JobStore, model: str) -> list[JobStatus]:
    """What workers do with every message in the queue: pop it and claim its job (a job that is
    not queued is skipped). Returns the status each claim found."""
    found = []
    for name in keys.queue_lists(model):
        while (raw := await r.rpop(name)) is not None:
            claim = await store.claim(json.loads(raw)["headers"]["id"], "w")
            found.append(claim.previous)
    return found


async def test_cancelled_queued_jobs_leave_room_at_once(own_redis: str, r: redis.asyncio.Redis) -> None:
    model = f"depth-{uuid.uuid4().hex[:6]}"
    adm = admission(own_redis, r, model, 3)
    ids = [await submit(adm, priority) for priority in (5, 5, 0)]
    with pytest.raises(RateLimited) as full:
        await submit(adm)
    assert full.value.code == "queue_full"
    for job_id in ids:
        assert await adm.service.cancel(job_id) is JobStatus.queued
    lists = keys.queue_lists(model)
    assert (await r.llen(lists[0]), await r.llen(lists[5])) == (1, 2)  # their messages are still there
    assert await queued(r, model) == (0, {})
    await submit(adm)  # admitted at once: nothing is really queued
    assert await queued(r, model) == (1, {5: 1}) and await queue_depth(adm.service.store.redis, model) == 1
    # workers pop the cancelled jobs' messages and skip them: the depth stays right
    statuses = await consume_all(r, adm.service.store, model)
    assert sorted(s.value for s in statuses) == ["cancelled", "cancelled", "cancelled", "queued"]
    assert await queued(r, model) == (0, {})
    for _ in range(3):
        await submit(adm)
    with pytest.raises(RateLimited):
        await submit(adm)


async def test_a_list_that_empties_forgets_its_cancelled_jobs(own_redis: str, r: redis.asyncio.Redis) -> None:
    """A cancelled job's message that leaves its list without a claim (the list purged, a message
    lost with a worker) is not subtracted from the depth after the list has emptied."""
    model = f"depth-{uuid.uuid4().hex[:6]}"
    adm = admission(own_redis, r, model, 3)
    for job_id in [await submit(adm) for _ in range(3)]:
        await adm.service.cancel(job_id)
    await r.delete(*keys.queue_lists(model))
    for _ in range(3):
        await submit(adm)
    with pytest.raises(RateLimited):
        await submit(adm)
    assert await queued(r, model) == (3, {5: 3})


async def test_the_store_counts_a_cancelled_job_once_whatever_consumes_its_message(store: JobStore) -> None:
    """A job cancelled while queued, whose message was re-sent (two messages, one job): the first
    message consumed takes the job off the cancelled ones; the other counts until a worker pops it."""
    celery = make_celery(Settings(redis_url="redis://unused"))
    model = f"depth-{uuid.uuid4().hex[:6]}"
    rec = JobRecord(id=f"job-{uuid.uuid4().hex}", model=model, request=JobRequest(prompt="p"))
    assert await store.submit(rec, *job_message(celery, rec.message()), max_depth=2) is None
    await store.redis.lpush(*job_message(celery, rec.message()))  # a re-sent message
    assert await queue_depth(store.redis, model) == 2
    assert await store.request_cancel(rec.id) is JobStatus.queued
    assert await queue_depth(store.redis, model) == 1
    [first, _] = await store.redis.lrange(keys.queue_lists(model)[5], 0, -1)
    await store.redis.lrem(keys.queue_lists(model)[5], 1, first)
    assert (await store.claim(rec.id, "w")).previous is JobStatus.cancelled
    assert await queue_depth(store.redis, model) == 1
    assert await consume_all(store.redis, store, model) == [JobStatus.cancelled]
    assert await queue_depth(store.redis, model) == 0
