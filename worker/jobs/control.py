"""The control channel: cancel messages for the jobs this worker runs (on the engine loop)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from redis.asyncio import Redis

from inferq.shared import keys
from inferq.shared.schemas import ControlMessage

log = logging.getLogger(__name__)


async def listen(redis: Redis, cancel: Callable[[str], bool], retry_s: float = 0.5) -> None:
    """Abort the jobs that clients cancel (``cancel(job id)``: True if this worker runs it), until
    cancelled; resubscribe after a lost connection."""
    while True:
        try:
            async with redis.pubsub(ignore_subscribe_messages=True) as ps:
                await ps.subscribe(keys.CONTROL_CHANNEL)
                async for raw in ps.listen():
                    if raw.get("type") != "message":
                        continue
                    try:
                        msg = ControlMessage.model_validate_json(raw["data"])
                    except ValueError:
                        log.warning("ignored malformed control message")
                        continue
                    if msg.type == "cancel" and cancel(msg.job_id):
                        log.info("job %s: cancel requested, aborting", msg.job_id)
        except asyncio.CancelledError:
            raise
        except Exception as e:
            log.warning("control channel lost (%s); resubscribing", e)
            await asyncio.sleep(retry_s)  # back off before reconnecting
