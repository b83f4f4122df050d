"""A worker's part in the fleet's LoRA adapters: it registers the adapters its settings name (so
that gateways resolve them as ``model``), and it loads or unloads the adapters that run-time
commands name for its model, answering each load with what its engine said."""

from __future__ import annotations

import logging

from redis.asyncio import Redis

from inferq.shared import keys
from inferq.shared.adapters import AdapterRegistry
from inferq.shared.redis import listen as redis_listen
from inferq.shared.schemas import AdapterCommand, AdapterInfo, AdapterRef, AdapterReply
from inferq.worker.engine.adapters import AdapterLoadFailed, EngineAdapters

log = logging.getLogger(__name__)

#: How long a load's answers are kept for the gateway that asked (it waits at most its timeout).
REPLY_TTL_S = 300


async def register(redis: Redis, model: str, adapters: dict[str, str]) -> None:
    """Write the adapters of this worker's settings into the fleet's registry (name -> info; one
    registered with the same base model and folder keeps its id). A name another model's workers
    (or a run-time load) registered is taken over, with a warning."""
    if not adapters:
        return
    registry = AdapterRegistry(redis)
    for name, path in adapters.items():
        change = await registry.put(AdapterInfo(name=name, parent=model, path=path), "settings")
        if change.replaced is not None and (change.replaced.parent, change.replaced.path) != (model, path):
            log.warning("adapter %r was registered for model %r from %s; it now names this worker's model %r "
                        "from %s", name, change.replaced.parent, change.replaced.path, model, path)
    log.info("adapters served on %s: %s", model, ", ".join(sorted(adapters)))


async def handle(redis: Redis, adapters: EngineAdapters, model: str, worker_id: str, cmd: AdapterCommand) -> None:
    """Carry out one command for this worker's model (on the engine loop)."""
    info = cmd.adapter
    if info.parent != model:
        return
    if cmd.op == "unload":
        if await adapters.unload(info.name, info.id or None):
            log.info("adapter %s unloaded", info.name)
        return
    reply = AdapterReply(worker=worker_id)
    try:
        await adapters.request(AdapterRef(name=info.name, path=info.path, id=info.id))
    except AdapterLoadFailed as e:
        reply.error = e.message
    if cmd.reply_to:
        async with redis.pipeline(transaction=True) as pipe:
            pipe.rpush(cmd.reply_to, reply.model_dump_json())
            pipe.expire(cmd.reply_to, REPLY_TTL_S)
            await pipe.execute()


async def listen(redis: Redis, adapters: EngineAdapters, model: str, worker_id: str, retry_s: float = 0.5) -> None:
    """Carry out adapter commands until cancelled; resubscribe after a lost connection."""

    async def on_message(data: str) -> None:
        try:
            cmd = AdapterCommand.model_validate_json(data)
        except ValueError:
            log.warning("ignored a malformed adapter command")
            return
        await handle(redis, adapters, model, worker_id, cmd)

    await redis_listen(redis, keys.ADAPTER_CHANNEL, on_message, retry_s)
