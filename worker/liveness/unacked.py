"""Jobs whose message is stranded, lost or was never sent: the reaper's sweeps, which send it.

kombu's Redis transport keeps every message it delivered and that is not acked yet in the hash
``unacked`` (delivery tag -> JSON ``[message, exchange, routing key]``), indexed by delivery time in
the zset ``unacked_index``. A worker that dies between taking a message and claiming its job
leaves the message there (until the visibility timeout, 6 h by default); a Redis that dies just
as it hands a message to a worker can lose it altogether; and a hand-back whose new message could
not be sent leaves its job marked unsent (``inferq:unsent``). The sweeps re-send such jobs; a
duplicate message is harmless, since only one claim can win.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable

from redis.asyncio import Redis

from inferq.shared import keys
from inferq.shared.redis import text_or_none, texts
from inferq.shared.schemas import JobMessage, JobStatus
from inferq.shared.store import JobStore

log = logging.getLogger(__name__)
Send = Callable[[JobMessage], None]  # puts a job on its queue (blocking)


def job_id_of(raw: str | None) -> str | None:
    """The job id (the Celery task id) of one entry of kombu's unacked hash; None if not a job's."""
    if not raw:
        return None
    try:
        return str(json.loads(raw)[0]["headers"]["id"])
    except (ValueError, KeyError, IndexError, TypeError):
        return None


class UnackedEntries:
    """The unacked hash as job ids, for one reaper pass: each entry is read and parsed once."""

    def __init__(self, redis: Redis) -> None:
        self.redis = redis
        self._ids: dict[str, str | None] = {}  # delivery tag -> job id

    async def _parse(self, tags: list[str]) -> None:
        missing = [t for t in tags if t not in self._ids]
        if missing:
            for tag, raw in zip(missing, await self.redis.hmget(keys.KOMBU_UNACKED, missing), strict=True):
                self._ids[tag] = job_id_of(text_or_none(raw))

    async def delivered_before(self, when: float) -> dict[str, str | None]:
        """Delivery tag -> job id of the messages delivered before ``when`` (unix s)."""
        tags = texts(await self.redis.zrangebyscore(keys.KOMBU_UNACKED_INDEX, 0, when))
        await self._parse(tags)
        return {t: self._ids[t] for t in tags}

    async def held(self) -> set[str]:
        """Ids of the jobs whose message some worker holds right now."""
        tags = texts(await self.redis.hkeys(keys.KOMBU_UNACKED))
        await self._parse(tags)
        return {j for t in tags if (j := self._ids.get(t))}

    async def drop(self, tag: str) -> None:
        async with self.redis.pipeline(transaction=True) as p:
            p.hdel(keys.KOMBU_UNACKED, tag)
            p.zrem(keys.KOMBU_UNACKED_INDEX, tag)
            await p.execute()
        self._ids.pop(tag, None)


async def sweep_unacked(store: JobStore, send: Send, entries: UnackedEntries, delivered_before: float,
                        out_of_time: Callable[[], bool] = lambda: False) -> int:
    """Re-send queued jobs whose message was delivered before ``delivered_before`` to a worker that
    never claimed them (it died in between: a live worker claims within moments), unless the job
    was queued again since (a hand-back sent a newer message). A message whose job runs is left
    for its worker to ack; the others leave the hash. Returns the jobs re-sent."""
    resent = 0
    for tag, job_id in (await entries.delivered_before(delivered_before)).items():
        if out_of_time():
            break
        rec = await store.get(job_id) if job_id else None
        if rec is not None and rec.status is JobStatus.running:
            continue  # its worker is alive (the reaper handles dead ones) and acks at the end
        if rec is not None and rec.status is JobStatus.queued:
            requeued_at = await store.redis.zscore(keys.QUEUED, rec.id)
            if requeued_at is None or requeued_at <= delivered_before:  # no newer message was sent
                await asyncio.to_thread(send, rec.message())
                await store.redis.hincrby(keys.STATS, keys.stat("requeue", rec.model, "message_stranded"), 1)
                resent += 1
                log.warning("job %s: its message was stranded with a lost worker; re-sent", rec.id)
        await entries.drop(tag)
    return resent


async def sweep_queued(store: JobStore, send: Send, entries: UnackedEntries, queued_before: float,
                       now: float, out_of_time: Callable[[], bool] = lambda: False) -> int:
    """Re-send jobs queued since before ``queued_before`` although their model's queue is empty and
    no worker holds their message: the message was lost (Redis died between handing it to a worker
    and that worker recording it). Jobs no longer queued leave the set. Returns the jobs re-sent."""
    redis = store.redis
    stale = texts(await redis.zrangebyscore(keys.QUEUED, 0, queued_before))
    if not stale:
        return 0
    held = await entries.held()
    resent = 0
    for job_id in stale:
        if out_of_time():
            break
        rec = await store.get(job_id)
        if rec is None or rec.status is not JobStatus.queued:
            await redis.zrem(keys.QUEUED, job_id)
            continue
        lanes = [keys.lane(rec.model, w) for w in texts(await redis.zrange(keys.workers(rec.model), 0, -1))]
        async with redis.pipeline(transaction=False) as p:
            for q in [*keys.queue_lists(rec.model), *(x for lane in lanes for x in keys.priority_lists(lane))]:
                p.llen(q)
            depth = sum(await p.execute())  # its model's queue and its workers' lanes
        if depth == 0 and job_id not in held:
            await asyncio.to_thread(send, rec.message())
            await redis.zadd(keys.QUEUED, {job_id: now})
            await redis.hincrby(keys.STATS, keys.stat("requeue", rec.model, "message_lost"), 1)
            resent += 1
            log.warning("job %s: queued with no message anywhere; re-sent", job_id)
    return resent


async def sweep_unsent(store: JobStore, send: Send, marked_before: float, now: float,
                       out_of_time: Callable[[], bool] = lambda: False) -> int:
    """Send the message of each job handed back before ``marked_before`` whose new message is not
    known to be sent (``keys.UNSENT``: the hand-back could not send it, or died first), while the
    job is still queued; every id looked at leaves the set. Returns the jobs sent."""
    redis = store.redis
    resent = 0
    for job_id in texts(await redis.zrangebyscore(keys.UNSENT, 0, marked_before)):
        if out_of_time():
            break
        rec = await store.get(job_id)
        if rec is not None and rec.status is JobStatus.queued:
            await asyncio.to_thread(send, rec.message())
            await redis.zadd(keys.QUEUED, {job_id: now})
            await redis.hincrby(keys.STATS, keys.stat("requeue", rec.model, "message_unsent"), 1)
            resent += 1
            log.warning("job %s: handed back, its message had not been sent; sent now", job_id)
        await redis.zrem(keys.UNSENT, job_id)
    return resent
