"""WorkerRuntime: everything one worker process runs beside Celery.

On the engine loop: the engine, the job runner, the batched event writer, a heartbeat that
registers the worker (and its engine stats) in Redis, and a listener on the control channel
that aborts cancelled jobs. Created once per process from Celery's ``worker_init`` signal.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
import uuid

from redis.asyncio import Redis

from shared import keys
from shared.redis import make_redis
from shared.schemas import ControlMessage, JobMessage, JobStatus, WorkerInfo
from shared.settings import Settings
from shared.store import JobStore
from worker.engine import EngineHost
from worker.runner import JobRunner
from worker.writer import EventWriter

log = logging.getLogger(__name__)


class WorkerRuntime:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.id = settings.worker_id or f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self.host = EngineHost(settings)
        self.started_at = time.time()
        self.redis: Redis | None = None
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
        writer = EventWriter(store)
        writer.start()
        self.runner = JobRunner(self.host, store, writer, self.id, s.default_max_tokens)
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
            stats=self.host.stats,
        )

    async def _beat(self) -> None:
        assert self.redis is not None
        info, s = self.info(), self.settings
        async with self.redis.pipeline(transaction=False) as p:
            p.set(keys.worker(self.id), info.model_dump_json(), px=int(s.worker_ttl_s * 1000))
            p.zadd(keys.workers(s.model_name), {self.id: info.last_seen})
            p.zadd(keys.MODELS, {s.model_name: info.last_seen})
            p.zremrangebyscore(keys.workers(s.model_name), 0, info.last_seen - s.worker_ttl_s)
            await p.execute()

    async def _heartbeat(self) -> None:
        while True:
            await asyncio.sleep(self.settings.heartbeat_s)
            try:
                await self._beat()
            except Exception as e:  # Redis away: keep serving, try again next beat
                log.warning("heartbeat failed: %s", e)

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

    def stop(self) -> None:
        try:
            self.host.run(self._deregister())
        except Exception as e:
            log.warning("could not deregister: %s", e)
        self.host.stop()
