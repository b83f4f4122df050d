"""Making room: a full worker hands a job back when interactive work waits that has a better claim
on one of its slots: a batch job's (service classes), or, with running-slot fair share
(``INFERQ_RUNNING_FAIR_SHARE``), a job of a tenant above its share (docs/design.md, "Service classes").

Fair share orders the queue (shared/fairshare.py), so a slot that frees goes to the tenant served
least; but a running job keeps its slot, and long jobs of one tenant that filled a worker would make
another tenant's first job wait for one of them to end. So, when every slot of a worker is held
(its ``slots`` and its interactive ``reserve``) and a tenant has interactive jobs queued while it
runs fewer than its share here (``(slots + reserve) × weight / Σ weights`` of the tenants queued
or running here), the worker hands back one job for it: its youngest batch job, else the youngest
job of the tenant most above its share (by a whole job). The job goes back to the queue (reason
``preempted``, not counted against its attempts: job_requeue.lua) paused where it can be, to go on
from its tokens so far (worker/jobs/resume.py), else with a ``restart`` event, to run again from its
start; the freed slot takes the queue's next job, the waiting tenant's. Without running-slot fair share
(the default), ``newcomers`` (``INFERQ_TENANT_ROOM_FOR_NEW``, on) does the same for a tenant that
runs no job here at all: a tenant's first requests beside another's backlog that holds every
sequence start at once instead of waiting for a backlog job to end, and the tenant reserve
(worker/jobs/classes.py) keeps its sequences from then on.

It checks when an interactive job of a tenant with few jobs queued (8 or fewer, one that may run
below its share) is queued (the submit script announces it on ``keys.waiting``) and every
``period_s`` (a backlogged tenant's). Across workers, the rooms made for a tenant and not yet
used by a claim of one of its jobs within two periods are counted in Redis (``keys.room``;
room_take.lua, job_claim.lua) and stay within its queued jobs: a tenant's one job does not make
every full worker give one back.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections import Counter
from collections.abc import Awaitable, Callable

from redis.asyncio import Redis

from inferq.shared import keys, lua
from inferq.shared.redis import listen
from inferq.worker.jobs.classes import Held, ServiceClasses

log = logging.getLogger(__name__)

GiveBack = Callable[[str, int], Awaitable[None]]  # (job id, attempt): hand it back, end its run


def victim(held: list[Held], attempts: dict[str, int], counts: Counter[str], share: dict[str, float]) -> Held | None:
    """The job to hand back: the youngest claimed batch job, else the youngest claimed interactive
    job of the tenant most above its share by a whole job (none is, where every share is all the
    slots: running-slot fair share off); None when there is none."""
    claimed = [h for h in held if h.job_id in attempts]
    batch = [h for h in claimed if h.service_class == "batch"]
    if batch:
        return max(batch, key=lambda h: h.since)
    over = {t: n - share.get(t, 0.0) for t, n in counts.items() if n - share.get(t, 0.0) >= 1}
    if not over:
        return None
    tenant = max(over, key=lambda t: over[t])
    mine = [h for h in claimed if h.tenant == tenant and h.service_class == "interactive"]
    return max(mine, key=lambda h: h.since) if mine else None


def shares(tenants: set[str], weights: dict[str, float], total: int) -> dict[str, float]:
    """Each tenant's share of ``total`` slots, by weight (1 where unknown)."""
    weight = sum(weights.get(t, 1.0) for t in tenants)
    return {t: total * weights.get(t, 1.0) / weight for t in tenants}


def needy(waiting: dict[str, int], counts: Counter[str], share: dict[str, float]) -> list[str]:
    """The tenants with interactive jobs queued that run fewer than their share (one more job of
    theirs still within it): most below their share first."""
    below = [t for t in waiting if counts[t] + 1 <= share[t] + 1e-9]
    return sorted(below, key=lambda t: counts[t] - share[t])


class Room:
    def __init__(self, redis: Redis, model: str, classes: ServiceClasses, attempts: Callable[[], dict[str, int]],
                 give_back: GiveBack, period_s: float, tenants: bool = True, newcomers: bool = False) -> None:
        self.redis, self.model, self.classes = redis, model, classes
        self.tenants, self.newcomers = tenants, newcomers
        self.attempts, self.give_back, self.period_s = attempts, give_back, period_s
        self.handed_back = 0  # jobs this worker gave back to make room, since it started
        self._lists = [name for p, name in enumerate(keys.queue_lists(model)) if p != classes.lane]
        self._take = lua.register(redis, "room_take")

    async def run(self) -> None:
        """Check on each announcement of a waiting tenant and every ``period_s``, until cancelled."""
        wake = asyncio.Event()

        async def woken(_data: str) -> None:
            wake.set()

        listener = asyncio.get_running_loop().create_task(listen(self.redis, keys.waiting(self.model), woken))
        try:
            while True:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(wake.wait(), self.period_s)
                wake.clear()
                try:
                    await self.check()
                except Exception as e:  # Redis away: the next check
                    log.warning("could not check for tenants waiting on this worker's slots: %s", e)
        finally:
            listener.cancel()
            await asyncio.gather(listener, return_exceptions=True)

    async def check(self) -> int:
        """Hand back what the tenants waiting below their share need (when every slot is held);
        the number of jobs handed back."""
        held, total = self.classes.held(), self.classes.slots + self.classes.reserve
        if max(len(held), self.classes.delivered()) < total:  # a free slot: the queue gives it to the least served
            return 0  # (a job delivered counts at once: its thread has not started it yet)
        waiting = await self._waiting()
        if not waiting:
            return 0
        counts = Counter(h.tenant for h in held if h.service_class == "interactive")
        active = set(waiting) | set(counts)
        # without running-slot fair share every tenant's interactive work may take any batch slot, and
        # (``newcomers``) a tenant that runs nothing here the jobs of a tenant past its share
        # (a job popped counts before its thread holds it, and stays counted as queued until its claim)
        arrived = self.classes.delivered_tenants() if self.newcomers else Counter()
        new = {t for t in waiting if counts[t] + arrived[t] == 0} if self.newcomers else set()
        everyone = dict.fromkeys(active, float(total))
        weights = await self._weights(active) if self.tenants or new else {}  # (read only where shares count)
        fair = shares(active, weights, total) if self.tenants or new else everyone
        handed = 0
        for tenant in needy(waiting, counts, fair if self.tenants else everyone):
            share = fair if self.tenants or tenant in new else everyone
            for _ in range(waiting[tenant]):  # a room for each of its jobs queued, up to its share
                job = victim(held, self.attempts(), counts, share)
                if counts[tenant] + 1 > share[tenant] + 1e-9 or job is None \
                        or not await self._room_for(tenant):
                    break
                # the gate keeps the sequence for the tenant's job, not for the queue's head (a paused job)
                self.classes.expect(tenant, weights.get(tenant, 1.0), counts[tenant] + 1)
                await self._give(job, tenant, total)
                held = [h for h in held if h.job_id != job.job_id]
                if job.service_class == "interactive":
                    counts[job.tenant] -= 1
                counts[tenant] += 1  # the slot is its next job's
                handed += 1
        self.handed_back += handed
        return handed

    async def _give(self, job: Held, tenant: str, total: int) -> None:
        log.info("job %s (%s, tenant %s) handed back: tenant %s waits below its share of this worker's %d slots",
                 job.job_id, job.service_class, job.tenant, tenant, total, extra={"job_id": job.job_id})
        await self.give_back(job.job_id, self.attempts().get(job.job_id, 0))

    async def _waiting(self) -> dict[str, int]:
        """Tenant -> its interactive jobs queued on the model's queue (fair share's counts)."""
        async with self.redis.pipeline(transaction=False) as p:
            for name in self._lists:
                p.hgetall(keys.fair_queued(name))
            rows = await p.execute()
        out: Counter[str] = Counter()
        for row in rows:
            for tenant, n in row.items():
                out[tenant] += int(n)
        return {t: n for t, n in out.items() if n > 0}

    async def _weights(self, tenants: set[str]) -> dict[str, float]:
        """Each tenant's weight, as its last submit wrote it (``w|{tenant}`` in a list's state)."""
        names = sorted(tenants)
        async with self.redis.pipeline(transaction=False) as p:
            for name in self._lists:
                p.hmget(keys.fair_state(name), [f"w|{t}" for t in names])
            rows = await p.execute()
        out: dict[str, float] = {}
        for row in rows:
            for tenant, w in zip(names, row, strict=True):
                if w is not None and tenant not in out and math.isfinite(float(w)) and float(w) > 0:
                    out[tenant] = float(w)
        return out

    async def _room_for(self, tenant: str) -> bool:
        """Take one room for ``tenant`` fleet-wide; False when as many rooms as it has interactive
        jobs queued now are in flight already (made by another worker or an earlier check, and not
        yet used by a claim of its jobs)."""
        return bool(await self._take(keys=[keys.room(self.model, tenant), *map(keys.fair_queued, self._lists)],
                                     args=[tenant, int(2000 * self.period_s)]))
