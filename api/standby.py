"""The gateway's view of models held asleep: the multi-model workers (``INFERQ_MODELS``) that can wake
a model no worker holds awake, what they last said of it, and how long its wake should take.

A job queued for such a model waits in the queue until one of them wakes the model; its client is
told so by a ``loading`` event, the job's first (docs/design.md, "Workers that follow demand")."""

from __future__ import annotations

import time
from dataclasses import dataclass

from redis.asyncio import Redis

from inferq.shared import keys
from inferq.shared.redis import texts
from inferq.shared.schemas import LoadingEvent, SwapperInfo, WorkerInfo

#: How long a gateway uses what it read of a model's sleepers without reading again.
STANDBY_CACHE_S = 1.0


@dataclass(frozen=True)
class Standby:
    """The live multi-model workers that hold ``model`` asleep (or not yet started) and can wake it."""

    model: str
    holders: int
    info: WorkerInfo | None  # a sleeping worker's description as of its last wake (None: never started)
    expected_s: float | None  # the soonest any of them should have it awake
    bound_s: float | None  # the longest that should take (their INFERQ_SWAP_MAX_WAIT_S plus a wake)

    def event(self) -> LoadingEvent:
        return LoadingEvent(seq=0, model=self.model, expected_s=_round(self.expected_s), bound_s=_round(self.bound_s))


def _round(v: float | None) -> float | None:
    return None if v is None else round(v, 2)


async def swappers(redis: Redis, ids: list[str]) -> list[SwapperInfo]:
    raw = await redis.mget([keys.swapper(i) for i in ids]) if ids else []
    return [SwapperInfo.model_validate_json(r) for r in raw if r]


async def read_standby(redis: Redis, model: str, ttl_s: float) -> Standby | None:
    """The model's sleepers (None: none live)."""
    ids = texts(await redis.zrangebyscore(keys.standby(model), time.time() - ttl_s, "+inf"))
    slots = [(sw, s) for sw in await swappers(redis, ids) if (s := sw.slot(model)) is not None and s.state != "awake"]
    if not slots:
        return None
    etas = [s.eta_s for _, s in slots if s.eta_s is not None]
    bounds = [sw.max_wait_s + s.wake_s for sw, s in slots if s.wake_s is not None]
    info = next((s.info for _, s in slots if s.info is not None), None)
    return Standby(model, len(slots), info, min(etas, default=None), min(bounds, default=None))


class StandbyCache:
    """:func:`read_standby`, remembered per model for :data:`STANDBY_CACHE_S`."""

    def __init__(self, redis: Redis, ttl_s: float) -> None:
        self.redis, self.ttl_s = redis, ttl_s
        self._seen: dict[str, tuple[float, Standby | None]] = {}

    async def get(self, model: str) -> Standby | None:
        seen = self._seen.get(model)
        if seen is not None and time.monotonic() - seen[0] < STANDBY_CACHE_S:
            return seen[1]
        got = await read_standby(self.redis, model, self.ttl_s)
        if len(self._seen) > 1024:
            self._seen.clear()
        self._seen[model] = (time.monotonic(), got)
        return got
