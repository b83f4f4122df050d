"""What a multi-model worker reads of the queue to choose its model: per model, its queued jobs and
the oldest one's wait, the other workers holding it awake (or waking it), and the jobs its own
process of that model runs. Two round trips: one pipeline for all models, then the oldest job's
time of each model that has any queued (shared/lua/queue_oldest.lua, as /metrics reads it)."""

from __future__ import annotations

import json
import time

from redis.asyncio import Redis

from inferq.shared import keys, lua
from inferq.shared.redis import texts
from inferq.worker.multi.policy import Demand


async def read(redis: Redis, own: dict[str, str], worker_ttl_s: float, swapper_id: str) -> dict[str, Demand]:
    """``own``: model -> the worker id of this worker's process of it, in the worker's order."""
    now = time.time()
    per = 2 * len(keys.PRIORITIES) + 3
    async with redis.pipeline(transaction=False) as p:
        for model, wid in own.items():
            for name in keys.queue_lists(model):
                p.llen(name)
                p.zcard(keys.queue_cancelled(name))
            p.zrangebyscore(keys.workers(model), now - worker_ttl_s, "+inf")
            p.get(keys.waking(model))
            p.scard(keys.worker_jobs(wid))
        got = await p.execute()
    out: dict[str, Demand] = {}
    for i, (model, wid) in enumerate(own.items()):
        row = got[i * per:(i + 1) * per]
        lengths = row[:-3]
        queued = sum(max(0, int(n) - int(c)) for n, c in zip(lengths[::2], lengths[1::2], strict=True))
        others = [w for w in texts(row[-3]) if w != wid]
        waker = row[-2]
        out[model] = Demand(queued=queued, awake_elsewhere=len(others) + (1 if waker and waker != swapper_id else 0),
                            running=int(row[-1]))
    oldest_of = lua.register(redis, "queue_oldest")
    for model, d in out.items():
        if d.queued:
            oldest = await oldest_of(keys=[*keys.queue_lists(model), keys.QUEUED],
                                     args=[json.dumps(model), keys.job("")])
            if oldest is not None:
                out[model] = Demand(d.queued, max(0.0, now - float(oldest)), d.awake_elsewhere, d.running)
    return out
