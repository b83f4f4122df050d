"""What wakes a multi-model worker's supervisor before its next demand check: a gateway that queues a
job for a model no worker holds awake says so on ``inferq:wanted`` (the model's name, with the job's
``loading`` event: shared/lua/job_loading.lua). The supervisor reads its demand at once instead of
at its next ``INFERQ_SWAP_CHECK_S`` (a quarter of a second by default, a tenth of a 7B wake). The
periodic check stays: a message lost (Redis away, a gateway that did not see the model asleep yet)
costs that wait, nothing else."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Collection

from redis.asyncio import Redis

from inferq.shared import keys

log = logging.getLogger(__name__)
RETRY_S = 1.0  # after a lost subscription, before subscribing again


async def listen(redis: Redis, models: Collection[str], kick: asyncio.Event) -> None:
    """Set ``kick`` whenever a job is said to wait for one of ``models``; runs until cancelled."""
    while True:
        try:
            async with redis.pubsub(ignore_subscribe_messages=True) as ps:
                await ps.subscribe(keys.WANTED_CHANNEL)
                async for msg in ps.listen():
                    data = msg.get("data")
                    name = data.decode() if isinstance(data, bytes) else data
                    if name in models:
                        kick.set()
        except asyncio.CancelledError:
            raise
        except Exception as e:  # Redis away: the periodic check goes on meanwhile
            log.debug("the wanted channel: %s; subscribing again", e)
            await asyncio.sleep(RETRY_S)
