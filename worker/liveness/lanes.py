"""Hand a worker's lane back to its model's queue (cache-affine pull, worker/jobs/affinity.py): when
the worker's slots are full (its heartbeat), when it drains, and when the reaper finds it dead. The
jobs then go to whichever worker takes them next, as plain pull would have sent them."""

from __future__ import annotations

import logging

from redis.asyncio import Redis

from inferq.shared import keys, lua

log = logging.getLogger(__name__)


async def return_lane(redis: Redis, model: str, worker_id: str, why: str) -> int:
    """Move every message of the worker's lane to its model's queue (one script); the count."""
    lanes = keys.priority_lists(keys.lane(model, worker_id))
    moved = int(await lua.register(redis, "lane_return")(keys=[*lanes, *keys.queue_lists(model)]))
    if moved:
        log.info("%d jobs in worker %s's lane went back to the queue (%s)", moved, worker_id, why)
    return moved
