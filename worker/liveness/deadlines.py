"""Queued jobs past their deadline end ``failed`` with ``deadline_exceeded`` and a final event, on
the reaper's pass, whether or not a worker takes them: a job left queued behind a long backlog (or
with no worker at all) was only failed when a worker popped it, and its client waited until then."""

from __future__ import annotations

import logging
from collections.abc import Callable

from inferq.shared import keys
from inferq.shared.errors import DeadlineExceeded
from inferq.shared.redis import texts
from inferq.shared.schemas import ErrorInfo
from inferq.shared.store import JobStore

log = logging.getLogger(__name__)

#: Queued jobs whose deadlines one pipeline reads
CHUNK = 500


def _due(deadline: str | None, now: float) -> bool:
    try:
        return deadline is not None and float(deadline) <= now
    except ValueError:  # "null": no deadline
        return False


async def sweep_deadlines(store: JobStore, now: float, out_of_time: Callable[[], bool] = lambda: False) -> int:
    """Fail every queued job whose deadline is at or before ``now`` (its message, still in its
    queue, is skipped by the worker that pops it). Returns the jobs failed."""
    redis, failed = store.redis, 0
    queued = texts(await redis.zrange(keys.QUEUED, 0, -1))
    for start in range(0, len(queued), CHUNK):
        if out_of_time():
            break
        chunk = queued[start:start + CHUNK]
        async with redis.pipeline(transaction=False) as p:
            for job_id in chunk:
                p.hget(keys.job(job_id), "deadline")
            deadlines = await p.execute()
        for job_id, deadline in zip(chunk, deadlines, strict=True):
            if _due(deadline, now) and await store.fail_queued(job_id, ErrorInfo.of(DeadlineExceeded(
                    "the job was still queued at its deadline; it never started")), message_waits=True):
                failed += 1
    if failed:
        log.info("%d queued jobs reached their deadline and failed", failed)
    return failed
