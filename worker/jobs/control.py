"""The control channel: cancel messages for the jobs this worker runs (on the engine loop)."""

from __future__ import annotations

import logging
from collections.abc import Callable

from redis.asyncio import Redis

from inferq.shared import keys
from inferq.shared.redis import listen as redis_listen
from inferq.shared.schemas import ControlMessage

log = logging.getLogger(__name__)


async def listen(redis: Redis, cancel: Callable[[str], bool], retry_s: float = 0.5) -> None:
    """Abort the jobs that clients cancel (``cancel(job id)``: True if this worker runs it), until
    cancelled; resubscribe after a lost connection."""

    async def handle(data: str) -> None:
        try:
            msg = ControlMessage.model_validate_json(data)
        except ValueError:
            log.warning("ignored malformed control message")
            return
        if msg.type == "cancel" and cancel(msg.job_id):
            log.info("job %s: cancel requested, aborting", msg.job_id)

    await redis_listen(redis, keys.CONTROL_CHANNEL, handle, retry_s)
