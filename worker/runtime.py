"""WorkerRuntime: everything one worker process runs beside Celery.

On the engine loop: the engine, the job runner, the batched event writer, a heartbeat that
registers the worker (and its engine stats) in Redis, and a listener on the control channel
that aborts cancelled jobs. Created once per process from Celery's ``worker_init`` signal.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import socket
import threading
import time
import uuid

from celery import Celery
from redis.asyncio import Redis

from inferq.shared import keys
from inferq.shared.redis import make_redis
from inferq.shared.schemas import ControlMessage, JobMessage, JobStatus, WorkerInfo
from inferq.shared.settings import Settings
from inferq.shared.store import JobStore
from inferq.worker.engine import EngineHost
from inferq.shared.celery_app import send_job
from inferq.worker.runner import JobRunner
from inferq.worker.writer import EventWriter

log = logging.getLogger(__name__)


def kill_children() -> None:
    """Kill this process's children (the engine core and its workers) before a hard exit."""
    import psutil

    for child in psutil.Process().children(recursive=True):
        try:
            child.kill()
        except psutil.Error:
            pass


class WorkerRuntime:
    def __init__(self, settings: Settings, celery: Celery) -> None:
        self.settings = settings
        self.celery = celery
        self.draining = False
        self.exit_code: int | None = None
        self.id = settings.worker_id or f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self.host = EngineHost(settings)
        self.started_at = time.time()
        self.redis: Redis | None = None
        self.store: JobStore | None = None
        self.runner: JobRunner | None = None
        self._tasks: list[asyncio.Task[None]] = []

    def start(self) -> None:
        self.host.start()
        self.host.run(self._start_services())
        log.info("worker %s serving model %r from queue %s", self.id, self.settings.model_name,
                 keys.queue(self.settings.model_name))

    async def _start_services(self) -> None:
        s = self.settings
        self.redis = make_redis(s.redis_url, max_connections=16)
        store = JobStore(self.redis, s.job_ttl_s)
        writer = EventWriter(store, budget_s=s.event_write_budget_s)
        writer.start()
        self.store = store
        self.runner = JobRunner(self.host, store, writer, self.id, s.default_max_tokens,
                                priority_scheduling=s.scheduling_policy == "priority",
                                on_engine_dead=self._engine_dead, max_attempts=s.max_attempts,
                                hand_back=lambda job, n, reason: self.hand_back(job, self.id, n, reason))
        await self._beat()
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(self._heartbeat()), loop.create_task(self._control())]

    def run_job(self, msg: JobMessage) -> JobStatus | None:
        """Called from a Celery thread: run the job on the engine loop and wait for its end."""
        assert self.runner is not None, "worker runtime not started"
        return self.host.run(self.runner.run(msg))

    def info(self) -> WorkerInfo:
        self.host.stats.engine_requests = self.host.unfinished_requests()
        return WorkerInfo(
            id=self.id, model=self.settings.model_name, host=socket.gethostname(), pid=os.getpid(),
            max_model_len=self.host.max_model_len, max_num_seqs=self.settings.max_num_seqs,
            tokenizer=self.host.model_path, started_at=self.started_at, last_seen=time.time(),
            draining=self.draining, stats=self.host.stats,
        )

    async def _beat(self) -> None:
        assert self.redis is not None
        info, s = self.info(), self.settings
        async with self.redis.pipeline(transaction=False) as p:
            p.set(keys.worker(self.id), info.model_dump_json(), px=int(s.worker_ttl_s * 1000))
            p.zadd(keys.workers(s.model_name), {self.id: info.last_seen})
            p.zadd(keys.MODELS, {s.model_name: info.last_seen})
            await p.execute()

    async def _heartbeat(self) -> None:
        connected_since: float | None = time.monotonic()
        while True:
            await asyncio.sleep(self.settings.heartbeat_s)
            if self.host.engine is not None and self.host.engine.errored and self.exit_code is None:
                log.critical("the engine is dead")
                await self._hand_back_all("engine_failure")
                self.exit_code = 4
                threading.Thread(target=self._die, name="engine-dead-exit", daemon=True).start()
            try:
                started = time.monotonic()
                await self._beat()
                if time.monotonic() - started > self.settings.heartbeat_s:
                    # the beat waited out an outage inside Redis retries: that was a reconnection too
                    connected_since = None
                connected_since = connected_since or time.monotonic()
                # judge others' heartbeats only after a full TTL of our own: right after a Redis
                # outage every worker's last beat looks old
                if time.monotonic() - connected_since > self.settings.worker_ttl_s:
                    await self._reap()
            except Exception as e:  # Redis away: keep serving, try again next beat
                connected_since = None
                log.warning("heartbeat failed: %s", e)

    async def _reap(self) -> None:
        """Requeue the jobs of workers whose heartbeat stopped (one reaper at a time)."""
        assert self.redis is not None
        s = self.settings
        if not await self.redis.set(keys.REAPER_LOCK, self.id, nx=True, px=int(s.heartbeat_s * 1000)):
            return
        for model in await self.redis.zrange(keys.MODELS, 0, -1):
            for wid in await self.redis.zrangebyscore(keys.workers(model), 0, time.time() - s.worker_ttl_s):
                if wid == self.id:  # alive by definition; a stale score is from a beat that waited out an outage
                    continue
                for job_id in await self.redis.smembers(keys.worker_jobs(wid)):
                    await self.hand_back(job_id, wid, None, "worker_lost")
                await self.redis.zrem(keys.workers(model), wid)
                await self.redis.delete(keys.worker_jobs(wid))
                log.warning("worker %s stopped heartbeating; its jobs were requeued", wid)
        await self._sweep_unacked()
        await self._sweep_queued()

    async def _sweep_queued(self) -> None:
        """Re-send a job that has been queued for a while although its model's queue is empty
        and no worker holds its message: the message was lost (Redis died between handing it to
        a worker and that worker recording it). Jobs that are no longer queued leave the set."""
        assert self.redis is not None and self.store is not None
        now = time.time()
        stale = await self.redis.zrangebyscore(keys.QUEUED, 0, now - 2 * self.settings.worker_ttl_s)
        if not stale:
            return
        held = set()
        for raw in await self.redis.hvals(keys.KOMBU_UNACKED):
            try:
                held.add(str(json.loads(raw)[0]["headers"]["id"]))
            except (ValueError, KeyError, IndexError, TypeError):
                continue
        for job_id in stale:
            rec = await self.store.get(job_id)
            if rec is None or rec.status is not JobStatus.queued:
                await self.redis.zrem(keys.QUEUED, job_id)
                continue
            depth = sum([await self.redis.llen(q) for q in keys.queue_lists(rec.model)])
            if depth == 0 and job_id not in held:
                await asyncio.to_thread(send_job, self.celery, rec.message())
                await self.redis.zadd(keys.QUEUED, {job_id: now})
                log.warning("job %s: queued with no message anywhere; re-sent", job_id)

    async def _sweep_unacked(self) -> None:
        """Re-send queued jobs whose message was delivered to a worker that never claimed them
        (it died between taking the message and starting the job): a live worker claims within
        moments, so a delivery older than two worker TTLs whose job is still queued was lost.
        A duplicate message is harmless: only one claim can win."""
        assert self.redis is not None and self.store is not None
        old = time.time() - 2 * self.settings.worker_ttl_s
        for tag in await self.redis.zrangebyscore(keys.KOMBU_UNACKED_INDEX, 0, old):
            raw = await self.redis.hget(keys.KOMBU_UNACKED, tag)
            try:
                job_id = str(json.loads(raw)[0]["headers"]["id"]) if raw else None
            except (ValueError, KeyError, IndexError, TypeError):
                job_id = None
            rec = await self.store.get(job_id) if job_id else None
            if rec is not None and rec.status is JobStatus.running:
                continue  # its worker is alive (the reaper handles dead ones) and acks at the end
            if rec is not None and rec.status is JobStatus.queued:
                await asyncio.to_thread(send_job, self.celery, rec.message())
                log.warning("job %s: its message was stranded with a lost worker; re-sent", rec.id)
            async with self.redis.pipeline(transaction=True) as p:
                p.hdel(keys.KOMBU_UNACKED, tag)
                p.zrem(keys.KOMBU_UNACKED_INDEX, tag)
                await p.execute()

    async def hand_back(self, job_id: str, worker_id: str, attempt: int | None, reason: str) -> str:
        """Requeue a running job (for another attempt) and send it to the queue again."""
        assert self.store is not None
        outcome = await self.store.requeue(job_id, worker_id, attempt, reason, self.settings.max_attempts)
        if outcome == "requeued" and (rec := await self.store.get(job_id)) is not None:
            await asyncio.to_thread(send_job, self.celery, rec.message())
        log.warning("job %s handed back (%s): %s", job_id, reason, outcome)
        return outcome

    async def _engine_dead(self, job_id: str, attempt: int) -> None:
        """The engine died under a job: hand the job back and exit non-zero for a restart."""
        await self.hand_back(job_id, self.id, attempt, "engine_failure")
        if self.exit_code is None:
            self.exit_code = 4
            threading.Thread(target=self._die, name="engine-dead-exit", daemon=True).start()

    def _die(self) -> None:
        time.sleep(0.5)  # let the other jobs on the dead engine hand themselves back
        log.critical("the engine died: exiting with code %s so that a supervisor restarts the worker",
                     self.exit_code)
        kill_children()
        logging.shutdown()
        os._exit(self.exit_code or 4)

    async def _control(self) -> None:
        assert self.redis is not None
        while True:
            try:
                async with self.redis.pubsub(ignore_subscribe_messages=True) as ps:
                    await ps.subscribe(keys.CONTROL_CHANNEL)
                    async for raw in ps.listen():
                        if raw.get("type") != "message":
                            continue
                        try:
                            msg = ControlMessage.model_validate_json(raw["data"])
                        except ValueError:
                            log.warning("ignored malformed control message")
                            continue
                        if msg.type == "cancel" and self.runner is not None and self.runner.cancel(msg.job_id):
                            log.info("job %s: cancel requested, aborting", msg.job_id)
            except asyncio.CancelledError:
                raise
            except Exception as e:
                log.warning("control channel lost (%s); resubscribing", e)
                await asyncio.sleep(0.5)

    async def _deregister(self) -> None:
        for t in self._tasks:
            t.cancel()
        if self.redis is not None:
            await self.redis.zrem(keys.workers(self.settings.model_name), self.id)
            await self.redis.delete(keys.worker(self.id))
            await self.redis.aclose()

    async def _hand_back_all(self, reason: str) -> None:
        assert self.runner is not None
        for job_id, job in list(self.runner.active.items()):
            job.handed_back = True
            await self.hand_back(job_id, self.id, job.attempt or None, reason)
            if job.task is not None:
                job.task.cancel()

    def drain(self) -> None:
        """Stop taking jobs (Celery has stopped consuming); let held jobs finish up to the grace
        period, then hand the rest back to the queue for another worker."""
        self.draining = True
        deadline = time.monotonic() + self.settings.drain_timeout_s
        try:
            self.host.run(self._beat())
        except Exception:
            pass
        while self.runner is not None and self.runner.active and time.monotonic() < deadline:
            time.sleep(0.1)
        if self.runner is not None and self.runner.active:
            log.warning("drain timeout: handing %d jobs back to the queue", len(self.runner.active))
            self.host.run(self._hand_back_all("worker_shutdown"))

    def stop(self) -> None:
        try:
            self.host.run(self._deregister())
        except Exception as e:
            log.warning("could not deregister: %s", e)
        self.host.stop()
