"""The reaper: takes back the running jobs of workers whose heartbeat stopped.

It runs on a thread and event loop of its own, with its own Redis client, so that its work never
delays a heartbeat. One worker at a time reaps (a lock); a pass stops at its time budget and the
next pass goes on where it stopped. The lock lives twice the budget, is extended after each
hand-back and released (if still held) at the end.

A silent worker loses only the jobs actually handed back: the requeue script removes a job from
its set only while it is that worker's running job claimed before the reaper read the set, and
the worker leaves its model's live set only once its job set is empty; and each hand-back checks,
in the same script, that the worker has not beaten since the reaper judged it (a late beat is a
live worker). A reaper never reaps its
own worker, and judges others only after a full TTL of its own successful heartbeats (right after
a Redis outage every worker's last beat looks old).
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass

from redis.asyncio import Redis

from inferq.shared import keys, lua
from inferq.shared.redis import make_redis, text_set, texts
from inferq.shared.settings import Settings
from inferq.shared.store import JobStore
from inferq.worker.liveness.deadlines import sweep_deadlines
from inferq.worker.liveness.handback import SEND_BUDGET_S, hand_back
from inferq.worker.liveness.lanes import return_lane
from inferq.worker.liveness.unacked import Send, UnackedEntries, sweep_queued, sweep_unacked, sweep_unsent
from inferq.worker.loopthread import LoopThread

log = logging.getLogger(__name__)

async def forget_worker(redis: Redis, model: str, worker_id: str, seen_before: float | None = None) -> bool:
    """Remove the worker from its model's live set, unless it still has jobs or beat after ``seen_before``."""
    forget = lua.register(redis, "worker_forget")
    return bool(await forget(keys=[keys.workers(model), keys.worker_jobs(worker_id)],
                             args=[worker_id, "" if seen_before is None else repr(seen_before)]))


@dataclass
class Silent:
    """A worker whose last heartbeat is older than the TTL, as the reaper saw it."""

    model: str
    worker_id: str
    jobs: list[str]
    seen_at: float  # when the reaper read its job set: jobs it claimed later are not judged
    beat_before: float  # its last beat was no later than this


class Budget:
    def __init__(self, seconds: float, clock: Callable[[], float]) -> None:
        self.clock = clock
        self.end = clock() + seconds

    def spent(self) -> bool:
        return self.clock() >= self.end


class LockLost(Exception):
    """Another worker holds the reaper lock now."""


class Reaper:
    def __init__(self, settings: Settings, worker_id: str, send: Send, *,
                 trusted: Callable[[], bool] = lambda: True, clock: Callable[[], float] = time.monotonic) -> None:
        self.settings = settings
        self.worker_id = worker_id
        self.send = send
        self.trusted = trusted  # True after a full TTL of this worker's own successful beats
        self.clock = clock
        self.budget_s = settings.reaper_budget
        self.lock_ttl_s = 2 * self.budget_s
        self.redis: Redis | None = None
        self.store: JobStore | None = None
        self._thread: LoopThread | None = None
        self._was_trusted = False  # the last pass trusted this worker's beats (a line when that ends)

    def bind(self, redis: Redis) -> None:
        self.redis, self.store = redis, JobStore(redis, self.settings.job_ttl_s)

    # --- one pass -----------------------------------------------------------------------------
    async def run_once(self) -> int | None:
        """One pass within the budget. Returns the jobs handed back, or None when this worker is
        not the reaper this time (not trusted yet, or another worker holds the lock)."""
        assert self.redis is not None, "bind() a Redis client first"
        if not self.trusted():
            if self._was_trusted:  # once per spell: a frozen or dead worker is not taken back meanwhile
                log.info("not judging other workers' heartbeats until this worker's own beats are timely "
                         "again for a TTL (it was stalled, or Redis was away)")
            self._was_trusted = False
            return None
        self._was_trusted = True
        token = f"{self.worker_id}:{uuid.uuid4().hex[:8]}"
        if not await self.redis.set(keys.REAPER_LOCK, token, nx=True, px=int(self.lock_ttl_s * 1000)):
            return None
        budget, handed = Budget(self.budget_s, self.clock), 0
        try:
            async with asyncio.timeout(self.budget_s + self.lock_ttl_s):  # a hung call ends the pass
                for dead in await self.silent():
                    if budget.spent():
                        break
                    handed += await self.reap(dead, budget, token)
                if not budget.spent():
                    await self.sweep(budget)
        except LockLost:
            log.warning("reaper lock lost mid-pass; stopping")
        except TimeoutError:
            log.warning("reaper pass ran past %g s; stopped", self.budget_s + self.lock_ttl_s)
        finally:
            try:
                async with asyncio.timeout(self.lock_ttl_s):
                    await lua.register(self.redis, "lock_release")(keys=[keys.REAPER_LOCK], args=[token])
            except Exception as e:  # it expires by itself
                log.warning("could not release the reaper lock: %r", e)
        return handed

    async def silent(self) -> list[Silent]:
        """Every other worker whose last heartbeat is older than the TTL, with its running jobs."""
        assert self.redis is not None
        out: list[Silent] = []
        for model in texts(await self.redis.zrange(keys.MODELS, 0, -1)):
            before = time.time() - self.settings.worker_ttl_s
            if not self.trusted():  # this pass waited out an outage (a failover): others only look late
                return out
            for wid in texts(await self.redis.zrangebyscore(keys.workers(model), 0, before)):
                if wid == self.worker_id:  # alive by definition; a stale score is from a beat that waited out an outage
                    continue
                seen_at = time.time()
                jobs = sorted(text_set(await self.redis.smembers(keys.worker_jobs(wid))))
                out.append(Silent(model, wid, jobs, seen_at, before))
        return out

    async def reap(self, dead: Silent, budget: Budget, token: str) -> int:
        """Hand back the silent worker's jobs (while the budget lasts); forget the worker once
        none is left. Returns the jobs handed back."""
        assert self.redis is not None and self.store is not None
        handed = 0
        for job_id in dead.jobs:
            if budget.spent():
                return handed
            outcome = await hand_back(self.store, self.send, job_id, dead.worker_id, None, "worker_lost",
                                      self.settings.max_attempts, claimed_before=dead.seen_at,
                                      silent=(dead.model, dead.beat_before))
            if outcome == "alive":  # it beat after all (late, not dead): leave it all
                log.info("worker %s beat again before its jobs were taken; leaving it", dead.worker_id)
                return handed
            handed += outcome != "skip"
            extend = lua.register(self.redis, "lock_extend")
            if not await extend(keys=[keys.REAPER_LOCK], args=[token, int(self.lock_ttl_s * 1000)]):
                raise LockLost
        if await forget_worker(self.redis, dead.model, dead.worker_id, dead.beat_before):
            await return_lane(self.redis, dead.model, dead.worker_id, "it is dead")
            await self.redis.hincrby(keys.STATS, keys.stat("reaped", dead.model), 1)
            log.warning("worker %s stopped heartbeating; %d of its jobs were handed back", dead.worker_id, handed)
        return handed

    async def sweep(self, budget: Budget) -> None:
        """Fail queued jobs past their deadline (``deadlines.py``); send queued jobs whose Celery
        message was never sent (a hand-back's send failed), was stranded or was lost
        (``worker/liveness/unacked.py``)."""
        assert self.store is not None
        now, entries = time.time(), UnackedEntries(self.store.redis)
        await sweep_deadlines(self.store, now, budget.spent)
        if budget.spent():
            return
        await sweep_unsent(self.store, self.send, now - SEND_BUDGET_S, now, budget.spent)
        old = now - 2 * self.settings.worker_ttl_s
        if not budget.spent():
            await sweep_unacked(self.store, self.send, entries, old, budget.spent)
        if not budget.spent():
            await sweep_queued(self.store, self.send, entries, old, now, budget.spent)

    # --- its thread ---------------------------------------------------------------------------
    def start(self) -> None:
        """Reap every heartbeat interval, from a thread of its own."""
        self._thread = LoopThread("reaper")
        self._thread.start()
        self._thread.submit(self._serve())

    async def _serve(self) -> None:
        self.bind(make_redis(self.settings, max_connections=4))
        while True:
            try:
                await self.run_once()
            except Exception as e:  # Redis away: try again next time
                log.warning("reaper pass failed: %s", e)
            await asyncio.sleep(self.settings.heartbeat_s)  # the pass period, not a wait for anything

    def stop(self, timeout: float = 5.0) -> None:
        if self._thread is not None:
            self._thread.stop(timeout, close=self._close)
            self._thread = None

    async def _close(self) -> None:
        if self.redis is not None:
            await self.redis.aclose()
