"""A hand-back whose message cannot be sent at once (a Redis of its own; the broker's send scripted).

The requeue script marks the job unsent (``inferq:unsent``) as it queues it again; the hand-back
tries to send the new message for a bounded time and unmarks the job once it is sent. A job whose
message still could not be sent stays marked, and the reaper's next pass sends it: it does not
wait two worker TTLs for the queued sweep, nor for its model's queue to be empty."""

from __future__ import annotations

import time
import uuid

from kombu.exceptions import OperationalError

from inferq.shared import keys
from inferq.shared.schemas import JobMessage, JobRecord, JobRequest, JobStatus
from inferq.shared.settings import Settings
from inferq.shared.store import JobStore
from inferq.worker.liveness.handback import hand_back
from inferq.worker.liveness.reaper import Budget, Reaper


class Broker:
    """A send that fails (as kombu does with its broker away) its first ``failures`` times."""

    def __init__(self, failures: int) -> None:
        self.failures, self.tries, self.sent = failures, 0, []

    def __call__(self, msg: JobMessage) -> None:
        self.tries += 1
        if self.tries <= self.failures:
            raise OperationalError("Error 111 connecting to the broker. Connection refused.")
        self.sent.append(msg.id)


async def running_job(store: JobStore, model: str) -> str:
    rec = JobRecord(id=f"job-{uuid.uuid4().hex}", model=model, request=JobRequest(prompt="p"))
    await store.create(rec)
    await store.claim(rec.id, "w")
    return rec.id


async def test_a_send_that_fails_at_first_is_tried_again(store: JobStore) -> None:
    job, broker = await running_job(store, "m"), Broker(failures=2)
    assert await hand_back(store, broker, job, "w", 1, "worker_shutdown", 3, send_budget_s=30) == "requeued"
    assert broker.sent == [job] and broker.tries == 3
    assert (await store.get(job)).status is JobStatus.queued
    assert await store.redis.zscore(keys.UNSENT, job) is None, "sent: no longer marked unsent"


async def test_a_message_never_sent_is_sent_by_the_next_reaper_pass(store: JobStore, own_redis: str) -> None:
    model = f"m-{uuid.uuid4().hex[:6]}"
    job, down = await running_job(store, model), Broker(failures=10**6)
    assert await hand_back(store, down, job, "w", 1, "event_write_failed", 3, send_budget_s=0.3) == "requeued"
    assert down.sent == [] and down.tries >= 1
    assert (await store.get(job)).status is JobStatus.queued and await store.redis.zscore(keys.UNSENT, job)
    # the model's queue is busy and the job was queued just now: the queued-job sweep would not send it
    await store.redis.rpush(keys.queue_lists(model)[5], "another job's message")
    gone = await running_job(store, model)  # a job marked unsent that was claimed since: nothing to send
    await store.requeue(gone, "w", 1, "worker_lost", 3)
    await store.claim(gone, "w2")
    await store.redis.zadd(keys.UNSENT, {job: time.time() - 60, gone: time.time() - 60})  # past the send budget
    sent: list[str] = []
    settings = Settings(redis_url=own_redis, served_model_name=model, worker_ttl_s=3, heartbeat_s=0.5)
    reaper = Reaper(settings, "me", lambda msg: sent.append(msg.id))
    reaper.bind(store.redis)
    await reaper.sweep(Budget(60, time.monotonic))
    assert sent == [job]
    assert await store.redis.zcard(keys.UNSENT) == 0
    assert (await store.get(job)).status is JobStatus.queued and (await store.get(gone)).status is JobStatus.running
    assert await store.redis.hget(keys.STATS, keys.stat("requeue", model, "message_unsent")) == "1"


async def test_a_job_requeued_in_redis_alone_is_marked_unsent(store: JobStore) -> None:
    """A requeue with no send of its own (an ending with no hand-back to call) leaves the message to
    the reaper's sweep: the job is marked from the requeue on."""
    job = await running_job(store, "m")
    assert await store.requeue(job, "w", 1, "event_write_failed", 3) == "requeued"
    assert await store.redis.zscore(keys.UNSENT, job) is not None
    await store.sent(job)
    assert await store.redis.zscore(keys.UNSENT, job) is None
