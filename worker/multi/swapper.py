"""The supervisor of a multi-model worker (``INFERQ_MODELS``): it runs one process per model it has
woken (worker/multi/procs.py), holds one model awake at a time, and follows the queue's demand.

Every ``INFERQ_SWAP_CHECK_S`` (and at once when a gateway says a job waits for one of its models:
``wanted``) it reads its models' queues and the fleet's awake workers (``demand``) and asks the
rule (``policy``) whether to swap. A swap claims the model it wakes
(``inferq:waking:{model}``, so that other multi-model workers do not wake it too), puts the awake
model to sleep (its jobs end or go back: worker/multi/nap.py), then wakes the other (or starts its
process, the first time). Every heartbeat it publishes itself (``inferq:swapper:{id}``: its models'
states, its recent swaps) and holds each model it does not hold awake in ``inferq:standby:{model}``,
where gateways look before refusing a model no worker serves awake (and tell its jobs' clients how
long the wake should take: a ``loading`` event). A model's process that exits on its own stops the
worker (its supervisor restarts it), as an engine group's frontend does.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import time
from collections import deque

from redis.asyncio import Redis

from inferq.shared import keys
from inferq.shared.redis import make_redis
from inferq.shared.schemas import SwapperInfo, SwapRecord
from inferq.shared.served_models import model_worker_id
from inferq.shared.settings import Settings
from inferq.worker.engine.args import uses_sleep_mode
from inferq.worker.multi import demand, policy, wanted
from inferq.worker.multi.procs import ModelMain, ModelProc, ModelProcessDied

log = logging.getLogger(__name__)
START_TIMEOUT_S = 1800.0  # an engine's start (weights from disk, compilation) may take minutes
SLEEP_TIMEOUT_S = 300.0  # an engine's sleep or stop, after the grace
RECENT = 20  # swaps kept in the worker's description


class Swapper:
    def __init__(self, settings: Settings, loglevel: str, main: ModelMain) -> None:
        self.s = settings
        self.id = settings.worker_id or f"{socket.gethostname()}-{os.getpid()}"
        port = settings.metrics_port
        self.models = [ModelProc(spec, model_worker_id(self.id, spec.name), self.id, port + i if port else 0, main,
                                 loglevel) for i, spec in enumerate(settings.models)]
        self.by_name = {m.name: m for m in self.models}
        self.sleep_mode = uses_sleep_mode(settings)
        self.knobs = policy.Knobs(settings.swap_min_awake_s, settings.swap_max_wait_s,
                                  prepare=settings.swap_prepare and self.sleep_mode)
        self.awake: ModelProc | None = None
        self.awake_since = 0.0  # monotonic
        self.waking: str | None = None  # the model this worker claims to be waking now
        self.demand: dict[str, policy.Demand] = {}
        self.recent: deque[SwapRecord] = deque(maxlen=RECENT)
        self.swaps = 0
        self.started_at = time.time()
        self.redis: Redis | None = None
        self.stop = asyncio.Event()
        self.kick = asyncio.Event()  # a job waits for one of its models: check the demand now

    # --- the loop -----------------------------------------------------------------------------
    async def run(self) -> int:
        """Follow demand until SIGTERM (0) or a model's process exits on its own (its code)."""
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.stop.set)
        self.redis = make_redis(self.s, max_connections=8)
        beats = loop.create_task(self._beat_forever())
        kicks = loop.create_task(wanted.listen(self.redis, self.by_name, self.kick))
        log.info("multi-model worker %s: models %s, %s", self.id, [m.name for m in self.models],
                 "sleep mode" if self.sleep_mode else "a swap stops one engine and starts the other")
        if self.s.swap_prespawn if self.s.swap_prespawn is not None else self.sleep_mode:
            for m in self.models:  # each imports vLLM now: its first start is then its engine's alone
                m.spawn(park=True)
        try:
            return await self._follow()
        finally:
            self.stop.set()
            await asyncio.to_thread(self._stop_models)
            for task in (beats, kicks):
                task.cancel()
                with contextlib.suppress(BaseException):
                    await task
            await self._forget()
            await self.redis.aclose()

    async def _follow(self) -> int:
        assert self.redis is not None
        while not self.stop.is_set():
            if (dead := next((m for m in self.models if m.died()), None)) is not None:
                return self._died(dead)
            try:
                self.demand = await demand.read(self.redis, {m.name: m.worker_id for m in self.models},
                                                self.s.worker_ttl_s, self.id)
                swap = policy.choose(self.demand, self.awake.name if self.awake else None, self._awake_for(),
                                     self.knobs, frozenset(m.name for m in self.models if m.state == "cold"))
                if swap is not None:
                    await self._swap(swap)
            except ModelProcessDied as e:
                return self._died(self.by_name[e.model])
            except Exception:  # Redis away, or a swap that failed: look again at the next check
                log.exception("multi-model worker: checking the demand or swapping failed")
            await self._until_next_check()
        return 0

    async def _until_next_check(self) -> None:
        """``INFERQ_SWAP_CHECK_S``, or less: until a gateway says a job waits for one of this
        worker's models (worker/multi/wanted.py) or the worker stops. A kick that comes while the
        demand is read is not lost: the next read sees the job that caused it."""
        waits = [asyncio.ensure_future(self.stop.wait()), asyncio.ensure_future(self.kick.wait())]
        try:
            await asyncio.wait(waits, timeout=self.s.swap_check_s, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waits:
                w.cancel()
        self.kick.clear()

    def _awake_for(self) -> float:
        return time.monotonic() - self.awake_since if self.awake is not None else 0.0

    def _died(self, m: ModelProc) -> int:
        if self.stop.is_set():  # SIGTERM reached the model's process too (its group): it drained
            return 0
        code = m.exitcode
        log.critical("the process of model %r exited (code %s): stopping this worker", m.name, code)
        return code or 1

    # --- a swap -------------------------------------------------------------------------------
    async def _swap(self, swap: policy.Swap) -> None:
        assert self.redis is not None
        to = self.by_name[swap.to]
        if not await self.redis.set(keys.waking(to.name), self.id, nx=True, px=int(self.s.worker_ttl_s * 1000)):
            return  # another worker is waking it
        self.waking = to.name
        rec = SwapRecord(from_model=self.awake.name if self.awake else None, to_model=to.name, at=time.time(),
                         reason=swap.reason, cold=to.state == "cold")
        log.info("swap %s -> %s (%s)", rec.from_model, to.name, swap.reason)
        t0 = time.monotonic()
        old, self.awake = self.awake, None
        wake_first = self.s.swap_wake_first and to.state != "cold"
        try:
            if old is not None and not wake_first:
                if self.sleep_mode and self.s.swap_overlap and to.state == "asleep":
                    # the weights come back while the other sleeps (copies in both directions at once)
                    woken, _ = await asyncio.gather(to.wake_weights(START_TIMEOUT_S), self._put_to_sleep(old, rec))
                    rec.overlapped = bool(woken)
                else:
                    await self._put_to_sleep(old, rec)
            t1 = time.monotonic()
            await (to.start(START_TIMEOUT_S) if to.state == "cold" else to.wake(START_TIMEOUT_S))
            rec.wake_s = time.monotonic() - t1
            if rec.cold:
                rec.phases = {k: round(v, 3) for k, v in to.phases.items()}
            self.awake, self.awake_since = to, time.monotonic()
            rec.total_s = self.awake_since - t0  # the decision to the model taking jobs
            if to.wakes and not rec.cold:  # what a job waits for the next wake: the other's sleep too
                to.wakes[-1] = max(rec.total_s - rec.drain_s, to.wakes[-1])
            if old is not None and wake_first:  # its jobs end while the other model serves already
                await self._put_to_sleep(old, rec)
        finally:
            self.waking = None
            await self.redis.delete(keys.waking(to.name))
        await self._record(rec)
        try:  # the fleet sees the swap now, not at the next heartbeat: the standby sets, the record
            await self.beat()
        except Exception as e:
            log.warning("multi-model worker heartbeat after a swap failed: %s", e)

    async def _put_to_sleep(self, m: ModelProc, rec: SwapRecord) -> None:
        napped = await m.sleep(self.s.swap_grace_s, SLEEP_TIMEOUT_S)
        rec.drain_s, rec.sleep_s, rec.handed_back = napped["drain_s"], napped["sleep_s"], napped["handed_back"]

    async def _record(self, rec: SwapRecord) -> None:
        assert self.redis is not None
        self.recent.append(rec)
        self.swaps += 1
        log.info("swapped %s -> %s in %.2f s (drain %.2f, sleep %.2f, %s %.2f%s; %d jobs handed back)",
                 rec.from_model, rec.to_model, rec.total_s, rec.drain_s, rec.sleep_s,
                 "start" if rec.cold else "wake", rec.wake_s,
                 "".join(f", {k} {v:.2f}" for k, v in rec.phases.items()), rec.handed_back)
        kind = "cold" if rec.cold else "n"
        async with self.redis.pipeline(transaction=False) as p:
            p.hincrby(keys.SWAP_STATS, keys.swap_stat(kind, rec.to_model), 1)
            p.hincrby(keys.SWAP_STATS, keys.swap_stat(f"{kind}ms", rec.to_model), round(rec.total_s * 1000))
            if not rec.cold:
                for bound in keys.SWAP_BUCKETS:
                    if rec.total_s <= bound:
                        p.hincrby(keys.SWAP_STATS, keys.swap_stat("le", rec.to_model, bound), 1)
            await p.execute()

    # --- what the fleet sees ------------------------------------------------------------------
    def describe(self) -> SwapperInfo:
        return SwapperInfo(
            id=self.id, host=socket.gethostname(), pid=os.getpid(),
            models=[m.slot(self._eta(m)) for m in self.models], awake=self.awake.name if self.awake else None,
            awake_since=time.time() - self._awake_for() if self.awake else None, sleep_mode=self.sleep_mode,
            max_wait_s=self.s.swap_max_wait_s, swaps=self.swaps, recent=list(self.recent),
            started_at=self.started_at, last_seen=time.time())

    def _eta(self, m: ModelProc) -> float | None:
        """How long a job for ``m`` queued now would wait for this worker to have it awake."""
        if m is self.awake:
            return 0.0
        wake = m.wake_estimate()
        if wake is None:
            return None
        here = self.demand.get(self.awake.name) if self.awake is not None else None
        if here is None or (here.queued == 0 and here.running == 0):
            hold = 0.0
        elif here.queued == 0:
            hold = max(0.0, self.s.swap_min_awake_s - self._awake_for())
        else:
            hold = self.s.swap_max_wait_s
        return hold + wake

    async def beat(self) -> None:
        """Publish this worker and hold every model it does not hold awake in its standby set."""
        assert self.redis is not None
        now, ttl_ms = time.time(), int(self.s.worker_ttl_s * 1000)
        info = self.describe()
        async with self.redis.pipeline(transaction=False) as p:
            p.set(keys.swapper(self.id), info.model_dump_json(), px=ttl_ms)
            p.zadd(keys.SWAPPERS, {self.id: now})
            for m in self.models:
                p.zadd(keys.MODELS, {m.name: now})
                if m is self.awake:
                    p.zrem(keys.standby(m.name), self.id)
                else:
                    p.zadd(keys.standby(m.name), {self.id: now})
                p.zremrangebyscore(keys.standby(m.name), "-inf", now - 10 * self.s.worker_ttl_s)
            if self.waking is not None:
                p.set(keys.waking(self.waking), self.id, px=ttl_ms)
            await p.execute()

    async def _beat_forever(self) -> None:
        while True:
            try:
                await self.beat()
            except Exception as e:
                log.warning("multi-model worker heartbeat failed: %s", e)
            await asyncio.sleep(self.s.heartbeat_s)

    async def _forget(self) -> None:
        assert self.redis is not None
        try:
            async with self.redis.pipeline(transaction=False) as p:
                p.delete(keys.swapper(self.id))
                p.zrem(keys.SWAPPERS, self.id)
                for m in self.models:
                    p.zrem(keys.standby(m.name), self.id)
                await p.execute()
        except Exception as e:
            log.warning("could not deregister the multi-model worker: %s", e)

    def _stop_models(self) -> None:
        """SIGTERM every model's process (each drains), then wait for them."""
        for m in self.models:
            m.terminate()
        for m in self.models:
            m.join(self.s.drain_timeout_s + 30)


def run_swapper(settings: Settings, loglevel: str, main: ModelMain) -> int:
    """``inferq worker`` with INFERQ_MODELS: serve until stopped; the exit code."""
    return asyncio.run(Swapper(settings, loglevel, main).run())
