"""The gateway's enqueue: the job's record and its Celery message in one Redis script.

``job_message`` builds what ``send_job`` (Celery's publish) would push; kombu, as a worker
consumes, must read both the same way. ``JobStore.submit`` writes the record and the message
together, or nothing when the model's queue is full.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from inferq.shared import keys
from inferq.shared.celery_app import job_message, make_celery, send_job
from inferq.shared.schemas import JobMessage, JobRecord, JobRequest
from inferq.shared.settings import Settings
from inferq.shared.store import JobStore
from tests.helpers import queue_depth

#: What differs from one publish to the next (the sender's host and pid, a fresh delivery tag)
VARYING_HEADERS = {"origin"}
VARYING_PROPERTIES = {"delivery_tag", "reply_to",
                      "argsrepr", "kwargsrepr"}  # send_task copies these into the properties too


def consume(settings: Settings, model: str) -> dict[str, Any]:
    """The next message of the model's queue, as a worker's kombu reads it."""
    app = make_celery(settings)
    with app.connection_for_read() as conn, conn.SimpleQueue(keys.queue(model)) as q:
        m = q.get(block=False)
        m.ack()
        return {"body": m.decode(), "headers": m.headers, "properties": m.properties,
                "list": m.delivery_info.get("routing_key")}


def job(priority: int, trace: str | None = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01") -> JobMessage:
    return JobMessage(id="job-" + "ab" * 16, model="m", created_at=time.time(), traceparent=trace,
                      tenant="acme", tenant_weight=2.0,
                      request=JobRequest(prompt="hello " * 50, max_tokens=7, priority=priority))


@pytest.mark.parametrize("priority", [0, 5, 9])
async def test_the_message_is_the_one_celery_publishes(own_redis: str, r, priority: int) -> None:
    settings = Settings(redis_url=own_redis)
    msg = job(priority)
    send_job(make_celery(settings), msg)
    theirs = consume(settings, "m")
    queue_list, raw = job_message(make_celery(settings), msg)
    assert queue_list == keys.queue_lists("m")[priority]
    await r.lpush(queue_list, raw)
    ours = consume(settings, "m")
    assert ours["body"] == theirs["body"]  # [args, kwargs, embed]: the payload as the task gets it
    assert ours["body"][0] == [msg.model_dump_json(exclude_none=True)]
    drop = lambda d, k: {x: v for x, v in d.items() if x not in k}  # noqa: E731
    assert drop(ours["headers"], VARYING_HEADERS) == drop(theirs["headers"], VARYING_HEADERS)
    assert ours["headers"]["traceparent"] == msg.traceparent
    assert (ours["headers"]["tenant"], ours["headers"]["weight"]) == ("acme", 2.0)  # what a worker's gate reads
    assert drop(ours["properties"], VARYING_PROPERTIES) == drop(theirs["properties"], VARYING_PROPERTIES)
    assert ours["properties"]["priority"] == priority
    assert msg.request.prompt not in ours["headers"]["argsrepr"]  # prompts stay out of Celery's logs


async def test_submit_writes_the_record_and_its_message_or_nothing(own_redis: str, r) -> None:
    store = JobStore(r, 120)
    celery = make_celery(Settings(redis_url=own_redis))
    recs = [JobRecord(id=f"job-{i:032x}", model="m", request=JobRequest(prompt="p", priority=i % 10))
            for i in range(3)]
    for rec in recs[:2]:
        assert await store.submit(rec, *job_message(celery, rec.message()), max_depth=2) is None
    assert await queue_depth(store.redis, "m") == 2
    assert (await store.get(recs[0].id)) == recs[0]
    assert set(await r.zrange(keys.QUEUED, 0, -1)) == {recs[0].id, recs[1].id}
    assert await r.ttl(keys.job(recs[0].id)) > 0
    assert await store.submit(recs[2], *job_message(celery, recs[2].message()), max_depth=2) == 2  # full
    assert await store.get(recs[2].id) is None and await queue_depth(store.redis, "m") == 2
    assert int(await r.hget(keys.STATS, keys.stat("submitted", "m"))) == 2
