"""The heartbeat: registers the worker and its engine stats in Redis every ``heartbeat_s``.

It runs on a thread and event loop of its own, with its own Redis client: never on the engine's
loop, which the token path can keep busy for longer than a worker TTL. From that thread it only
reads the worker's state (plain attribute reads) and hands work to the engine loop without
waiting for it (:class:`WorkerView`).

Each beat also keeps the worker's jobs in order, in one script call
(shared/lua/worker_keep_jobs.lua): the record and log of every job it runs get a full job TTL
again (a job may run longer than the TTL after its last refresh by an event), and ids in its job
set that are not running under it (a record that expired, a job that ended or was taken) leave
the set, where ``/v1/queue`` and ``/metrics`` would count them as running forever.

Each beat also checks that the worker is still registered. A worker that finds itself reaped (its
id gone from the model's live set, or jobs it runs missing from its job set) re-registers, keeps
the jobs that are still its own, and stops the attempts that were taken from it: their writes are
fenced anyway, and they end without writing an end.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from typing import Protocol

from redis.asyncio import Redis
from redis.commands.core import AsyncScript

from inferq.shared import keys, lua
from inferq.shared.redis import make_redis, text_set
from inferq.shared.schemas import WorkerInfo
from inferq.shared.settings import Settings
from inferq.worker.engine import tokenizer_files
from inferq.worker.liveness.lanes import return_lane
from inferq.worker.liveness.reaper import forget_worker
from inferq.worker.loopthread import LoopThread

log = logging.getLogger(__name__)

class WorkerView(Protocol):
    """What the heartbeat needs from its worker; called from the heartbeat's thread."""

    def describe(self) -> WorkerInfo:
        """The worker's self-description, ``last_seen`` = now."""

    def claimed(self) -> dict[str, int]:
        """Job id -> attempt of the jobs the worker runs (claimed, not being handed back)."""

    def lost(self, job_id: str, attempt: int) -> None:
        """That attempt no longer owns its job: stop it, write no end (must not block)."""

    def engine_dead(self) -> bool: ...

    def on_engine_dead(self) -> None:
        """Start the engine-death path (must not block)."""

    def saturated(self) -> bool:
        """Every job slot taken: jobs in this worker's lane would wait (cache-affine pull)."""


class Heartbeat:
    def __init__(self, settings: Settings, worker_id: str, worker: WorkerView) -> None:
        self.settings = settings
        self.worker_id = worker_id
        self.worker = worker
        self.redis: Redis | None = None
        self.trusted_since: float | None = None  # monotonic start of the current run of good beats
        self.reaped = 0  # times this worker found itself taken for dead
        self.last_ok: float | None = None  # monotonic time of the last beat Redis took
        self._registered = False
        self.asleep = False  # a multi-model worker's model asleep: not in the model's live set, nothing held
        self._wake: asyncio.Event | None = None
        self._thread: LoopThread | None = None
        self._keep: AsyncScript | None = None

    def start(self, timeout: float | None = None) -> None:
        """Register (the first beat: raises if it fails), then beat from a thread of its own."""
        self._thread = LoopThread("heartbeat")
        self._thread.start()
        self._thread.run(self._open(), timeout)
        self._thread.submit(self._serve())

    async def _open(self) -> None:
        self.redis = make_redis(self.settings, max_connections=4)
        self._keep = lua.register(self.redis, "worker_keep_jobs")
        self._wake = asyncio.Event()
        await self.beat()
        self.trusted_since = time.monotonic()

    def trusted(self) -> bool:
        """A full worker TTL of timely, successful beats, the last one lately: only then may this
        worker judge others' heartbeats (right after an outage, or while this process is stalled,
        others look late; during an outage, or a Redis failover, a beat still waiting in Redis
        retries has not yet ended the run of good beats, but it is not a good beat either)."""
        since, ok, now = self.trusted_since, self.last_ok, time.monotonic()
        ttl = self.settings.worker_ttl_s
        return since is not None and now - since >= ttl and ok is not None and now - ok <= ttl / 2

    def poke(self) -> None:
        """Beat now (e.g. to announce draining); from any thread."""
        if self._thread is not None and self._wake is not None:
            self._thread.loop.call_soon_threadsafe(self._wake.set)

    def set_asleep(self, asleep: bool) -> None:
        """A multi-model worker's model goes to sleep (True: the worker, holding no job, leaves the
        model's live set and beats without registering) or wakes (False: registered again at once).
        From another thread; returns once done (on this loop, between two beats)."""
        assert self._thread is not None, "heartbeat not started"
        self._thread.run(self._set_asleep(asleep), self.settings.worker_ttl_s)

    async def _set_asleep(self, asleep: bool) -> None:
        assert self.redis is not None
        self.asleep = asleep
        if not asleep:
            await self.beat()
            return
        wid = self.worker_id
        listed = text_set(await self.redis.smembers(keys.worker_jobs(wid)))
        await self._keep_jobs(listed, self.worker.claimed())  # what ended or went back leaves the set
        if not await forget_worker(self.redis, self.settings.model_name, wid):
            log.warning("asleep with jobs still listed as this worker's: the reaper takes them after a TTL")
        await self.redis.delete(keys.worker(wid))
        self._registered = False  # the next registration is a wake, not a return from the dead

    async def beat(self) -> None:
        """Write the worker's description and live-set scores; reconcile if it was reaped."""
        assert self.redis is not None
        s, wid = self.settings, self.worker_id
        if self.asleep:  # not registered: only Redis' answer counts (this worker still judges others)
            await self.redis.ping()
            return
        info = self.worker.describe()
        async with self.redis.pipeline(transaction=False) as p:
            p.zscore(keys.workers(s.model_name), wid)
            p.smembers(keys.worker_jobs(wid))
            p.set(keys.worker(wid), info.model_dump_json(), px=int(s.worker_ttl_s * 1000))
            p.zadd(keys.workers(s.model_name), {wid: info.last_seen})
            p.zadd(keys.MODELS, {s.model_name: info.last_seen})
            if info.tokenizer_files:  # published files live while a worker names them
                p.expire(info.tokenizer_files, tokenizer_files.TTL_S)
            score, listed, *_ = await p.execute()
        reaped, self._registered = self._registered and score is None, True
        claimed = self.worker.claimed()
        listed = set(listed) - await self._keep_jobs(set(listed), claimed)
        if reaped:
            self.reaped += 1
            self.trusted_since = None  # others saw no beat for a TTL: count this as a reconnection
            log.warning("this worker was taken for dead and reaped; re-registered (%d jobs to check)", len(claimed))
        if reaped or not listed.issuperset(claimed):
            await self._reconcile(claimed)
        if s.affinity != "off" and self.worker.saturated():
            await return_lane(self.redis, s.model_name, wid, "its slots are full")

    async def _keep_jobs(self, listed: set[str], claimed: dict[str, int]) -> set[str]:
        """Renew the TTL of the record and log of each job the worker runs, and take out of its job
        set the ids not running under it (phantoms): one script call. Returns the ids taken out."""
        assert self.redis is not None and self._keep is not None
        ids = sorted(listed | claimed.keys())
        if not ids:
            return set()
        removed = set(await self._keep(
            keys=[keys.worker_jobs(self.worker_id), *(k for j in ids for k in (keys.job(j), keys.job_log(j)))],
            args=[json.dumps(self.worker_id), self.settings.job_ttl_s,
                  *(x for j in ids for x in (j, "1" if j in claimed else ""))]))
        if removed:
            log.warning("%d jobs in this worker's job set were not running under it (record expired, ended "
                        "or taken); removed: %s", len(removed), ", ".join(sorted(removed)[:8]))
        return removed

    async def _reconcile(self, claimed: dict[str, int]) -> None:
        """Keep (and re-list) the jobs still ours; stop the attempts that were taken from us."""
        assert self.redis is not None
        me = json.dumps(self.worker_id)
        for job_id, attempt in claimed.items():
            adopted = await lua.register(self.redis, "worker_adopt")(
                keys=[keys.job(job_id), keys.worker_jobs(self.worker_id)], args=[me, str(attempt), job_id])
            if not adopted:
                self.worker.lost(job_id, attempt)

    async def _serve(self) -> None:
        assert self._wake is not None
        s = self.settings
        due = last_ok = time.monotonic()
        while True:
            due = max(due + s.heartbeat_s, time.monotonic())  # a late beat does not push the next one
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), due - time.monotonic())  # the period, or a poke
            self._wake.clear()
            started = time.monotonic()
            try:
                if self.worker.engine_dead():
                    self.worker.on_engine_dead()
                async with asyncio.timeout(s.worker_ttl_s):
                    await self.beat()
            except Exception as e:  # Redis away: keep serving, try again next beat
                self.trusted_since = None
                log.warning("heartbeat failed: %s", e)
                continue
            now = time.monotonic()
            if now - started > s.heartbeat_s or now - last_ok > s.worker_ttl_s / 2:
                # the beat waited out an outage inside Redis retries, or this process was stalled:
                # what it sees of others' beats is not to be trusted for a while
                self.trusted_since = None
            last_ok = self.last_ok = now
            if self.trusted_since is None:
                self.trusted_since = now

    def stop(self, timeout: float = 5.0) -> None:
        """Stop beating and deregister (the live-set entry stays while the job set is not empty,
        so that a reaper still takes those jobs back)."""
        if self._thread is not None:
            self._thread.stop(timeout, close=self._deregister)
            self._thread = None

    async def _deregister(self) -> None:
        if self.redis is None:
            return
        try:
            async with asyncio.timeout(self.settings.worker_ttl_s):
                await self.redis.delete(keys.worker(self.worker_id))
                await forget_worker(self.redis, self.settings.model_name, self.worker_id)
        except Exception as e:
            log.warning("could not deregister: %s", e)
        finally:
            await self.redis.aclose()
