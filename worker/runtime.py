"""WorkerRuntime: everything one worker process runs beside Celery, wired together.

Threads and what runs on them:

- the engine loop (``engine/host.py``): the engine, the job runner, the batched event writer,
  the control listener (``jobs/control.py``) and this worker's own hand-backs
  (``liveness/handback.py``);
- the heartbeat (``liveness/heartbeat.py``) and the reaper (``liveness/reaper.py``): a loop and a
  Redis client each, so that neither waits for a busy engine loop nor for the other;
- on engine death, ``liveness/death.py`` hands every job back and exits with code 4;
- on SIGTERM, :meth:`WorkerRuntime.drain` runs on a thread of Celery's shutdown.

Created once per process from Celery's ``worker_init`` signal.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import socket
import time
import uuid
from collections.abc import Callable
from functools import partial

from celery import Celery
from celery.exceptions import Reject
from redis.asyncio import Redis

from inferq.shared import keys, logs, tracing
from inferq.shared.celery_app import send_job
from inferq.shared.redis import make_redis
from inferq.shared.schemas import JobMessage, JobStatus, Resume, WorkerInfo
from inferq.shared.settings import Settings
from inferq.shared.store import JobStore
from inferq.worker import metrics
from inferq.worker.engine import fleet_adapters, tokenizer_files
from inferq.worker.engine.group import engine_instance, frontend_slots
from inferq.worker.engine.host import EngineHost
from inferq.worker.jobs import control
from inferq.worker.jobs.admission import Admission
from inferq.worker.jobs.affinity import Affinity
from inferq.worker.jobs.classes import ServiceClasses
from inferq.worker.jobs.intake import Intake
from inferq.worker.jobs.kv_feed import KVEventFeed
from inferq.worker.jobs.room import Room
from inferq.worker.jobs.runner import JobRunner
from inferq.worker.jobs.undecodable import fail_undecodable
from inferq.worker.jobs.writer import EventWriter
from inferq.worker.liveness.death import EngineDeath, hard_exit
from inferq.worker.liveness.handback import LocalHandBack
from inferq.worker.liveness.heartbeat import Heartbeat
from inferq.worker.liveness.lanes import return_lane
from inferq.worker.liveness.reaper import Reaper

log = logging.getLogger(__name__)


class WorkerRuntime:
    def __init__(self, settings: Settings, celery: Celery, host: EngineHost | None = None,
                 exit: Callable[[int], None] = hard_exit) -> None:
        self.settings = settings
        self.host = host or EngineHost(settings)
        self.id = settings.worker_id or f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        if settings.worker_id and self.host.frontend is not None:  # the group's frontends share settings
            self.id = f"{settings.worker_id}-{self.host.frontend.index}"
        logs.set_process_fields(worker_id=self.id)
        self.send = partial(send_job, celery)
        self._metrics_close: Callable[[], None] | None = None
        self.started_at = time.time()
        self.draining = False
        self.stopping = False
        self.admission = Admission()  # closed while a multi-model worker's model sleeps or goes to sleep
        self.swapper: str | None = None  # the multi-model worker this process serves one model of
        self.redis: Redis | None = None
        self.tokenizer_key: str | None = None  # the tokenizer as published for gateways
        self.runner: JobRunner | None = None
        self.handback: LocalHandBack | None = None
        self._listeners: list[asyncio.Task[None]] = []  # the control channel's and the adapters'
        self.death = EngineDeath(self.host.loop, partial(self._hand_back_all, "engine_failure"),
                                 timeout_s=settings.worker_ttl_s, exit=exit)
        fe = self.host.frontend
        self.slots = frontend_slots(settings.max_num_seqs, fe.count) if fe is not None else settings.max_num_seqs
        self.intake = Intake(self.host)  # how a job Celery hands this worker is taken: placed, then run
        self.classes = ServiceClasses.of(settings, self.slots, fe.count if fe is not None else 1)
        self.room: Room | None = None  # running-slot fair share (with classes)
        self.engine_id = fe.engine_id if fe is not None and fe.engine_id else engine_instance(self.id)
        max_loras = settings.max_loras if self.host.adapters.enabled else 0
        self.affinity = Affinity(settings, celery, self.id, self.slots, self.intake.load, self.engine_id,
                                 max_loras) if settings.affinity != "off" else None
        self.intake.affinity = self.affinity
        self.kv_feed: KVEventFeed | None = None  # the engine's KV-cache events into the index (one per engine)
        if self.affinity is not None and self.host.kv_events and (fe is None or fe.index == 0):
            self.kv_feed = KVEventFeed(self.host.kv_events, self.affinity.index, self.engine_id,
                                       settings.affinity_block_tokens, self.host.adapters.name_of)
        self.heartbeat = Heartbeat(settings, self.id, self)
        self.reaper = Reaper(settings, self.id, self.send, trusted=self.heartbeat.trusted)

    # --- life cycle ---------------------------------------------------------------------------
    def start(self) -> None:
        """Metrics and ``/ready`` first (503 until the first heartbeat: a starting engine takes
        minutes, and a probe or a scrape meanwhile should be answered, not refused), then the
        engine, the job path on its loop, registration (first beat), then the reaper."""
        tracing.setup(self.settings, "inferq-worker")
        fe = self.host.frontend.index if self.host.frontend else 0
        port = self.settings.metrics_port and self.settings.metrics_port + fe
        self._metrics_close = metrics.serve(port, metrics.WorkerCollector(self, self.settings.model_name, fe),
                                            self.ready)
        try:
            if self.kv_feed is not None:
                self.kv_feed.start()  # listening before the engine publishes its first block
            self.host.start()
            self.host.run(self._start_job_path())
        except BaseException:
            self._metrics_close()
            self._metrics_close = None
            raise
        # what start-up built (torch, vLLM, the model's tokenizer) lives as long as the process:
        # out of the collector's way, a full collection under load takes milliseconds, not a
        # second that stalls every thread (heartbeat included)
        gc.collect()
        gc.freeze()
        self.heartbeat.start(timeout=60)  # registered: gateways count it, Celery consumes right after
        self.reaper.start()
        log.info("worker %s serving model %r from queue %s", self.id, self.settings.model_name,
                 keys.queue(self.settings.model_name))

    async def _start_job_path(self) -> None:
        s = self.settings
        self.redis = make_redis(s, max_connections=16)
        store = JobStore(self.redis, s.job_ttl_s)
        writer = EventWriter(store, budget_s=s.event_write_budget_s, model=s.model_name)
        writer.start()
        self.runner = JobRunner(self.host, store, writer, self.id, s.default_max_tokens,
                                priority_scheduling=s.scheduling_policy == "priority",
                                on_engine_dead=self._engine_died_under, max_attempts=s.max_attempts,
                                hand_back=self._hand_back_one, tool_call_parser=s.tool_call_parser,
                                latency=self.classes.limit if self.classes is not None else None,
                                batch_event_interval_s=s.batch_event_interval_ms / 1000)
        self.intake.runner = self.runner
        self.handback = LocalHandBack(self.runner.attempts, store, self.send, self.id, s.max_attempts)
        await fleet_adapters.register(self.redis, s.model_name, s.lora_adapters)
        loop = asyncio.get_running_loop()
        self._listeners = [
            loop.create_task(control.listen(self.redis, self.runner.cancel)),
            loop.create_task(fleet_adapters.listen(self.redis, self.host.adapters, s.model_name, self.id)),
            loop.create_task(self.host.adapters.keep_synced())]
        if self.classes is not None:  # full: hand back batch (or, by tenant share, interactive) for work waiting
            self.room = Room(self.redis, s.model_name, self.classes, self.runner.attempts.attempts,
                             self.handback.preempt, s.heartbeat_s, tenants=s.running_fair_share,
                             newcomers=s.tenant_room_for_new)
            self._listeners.append(loop.create_task(self.room.run()))
        if (files := tokenizer_files.files_of(self.host.tokenizer)) is not None:
            try:
                self.tokenizer_key = await tokenizer_files.publish(self.redis, files)
            except Exception as e:  # gateways then leave tokenizing to the workers
                log.warning("could not publish the model's tokenizer for gateways: %s", e)

    def fail_undecodable(self, job_id: str, error: Exception) -> bool:
        """Called from a Celery thread: end the queued job whose message could not be decoded."""
        assert self.runner is not None, "worker runtime not started"
        return self.host.run(fail_undecodable(self.runner.store, job_id, error))

    def run_job(self, msg: JobMessage) -> JobStatus | None:
        """Called from a Celery thread: run the job on the engine loop and wait for its end; or,
        with cache-affine pull, pass it to the worker that holds its prefix (None)."""
        assert self.runner is not None, "worker runtime not started"
        if self.death.triggered:  # about to exit: leave the job (e.g. one just handed back) to another worker
            raise Reject("the engine is dead", requeue=True)
        if not self.admission.enter():  # popped as the model went to sleep: back to the queue, unclaimed
            raise Reject("the model is asleep", requeue=True)
        try:
            if self.classes is None:
                return self.intake.take(msg)
            with self.classes.holding(msg):
                return self.intake.take(msg)
        finally:
            self.admission.leave()

    def drain(self) -> None:
        """SIGTERM (Celery has stopped consuming): announce draining in the next beat, let held
        jobs finish up to the grace period, then hand the rest back to the queue."""
        self.draining = True
        self.heartbeat.poke()
        if self.affinity is not None and self.redis is not None:  # no job waits in the lane of a worker leaving
            self.host.run(return_lane(self.redis, self.settings.model_name, self.id, "it is draining"))
        if self.runner is None or self.runner.idle.wait(self.settings.drain_timeout_s):
            return
        log.warning("drain timeout: handing %d jobs back to the queue", len(self.runner.attempts))
        self.host.run(self._hand_back_all("worker_shutdown"))

    def stop(self) -> None:
        """Stop judging others, deregister, close the job path, stop the engine."""
        self.stopping = True
        if self._metrics_close is not None:
            self._metrics_close()
        if self.kv_feed is not None:
            self.kv_feed.stop()
        self.reaper.stop()
        self.heartbeat.stop()
        try:
            self.host.run(self._close_job_path())
        except Exception as e:
            log.warning("could not close the job path: %s", e)
        self.host.stop()
        gc.unfreeze()  # let the interpreter's exit free what start-up built

    async def _close_job_path(self) -> None:
        for task in self._listeners:
            task.cancel()
        await asyncio.gather(*self._listeners, return_exceptions=True)
        if self.runner is not None:
            await self.runner.writer.stop()
        if self.redis is not None:
            await self.redis.aclose()

    # --- engine death -------------------------------------------------------------------------
    async def _engine_died_under(self, job_id: str, attempt: int) -> None:
        """A job saw the engine die: hand it back, and start the exit path (which waits for it)."""
        assert self.handback is not None
        if not self.stopping:
            self.death.trigger()
        await self.handback.job(job_id, attempt, "engine_failure")

    async def _hand_back_one(self, job_id: str, attempt: int, reason: str, resume: Resume | None = None) -> str:
        """The runner gives a job back (its events could not be logged; paused, its progress kept):
        requeue and re-send it."""
        assert self.handback is not None
        return await self.handback.job(job_id, attempt, reason, resume)

    async def _hand_back_all(self, reason: str) -> None:
        if self.handback is not None:
            await self.handback.all(reason)

    # --- what the heartbeat reads (from its own thread) ---------------------------------------
    def renew_engine(self) -> None:
        """A woken or restarted engine holds no cache of the one before (sleep drops it): a new instance
        id, so that the fleet's index stops drawing jobs to this worker for what the old one held."""
        self.engine_id = engine_instance(self.id)
        if self.affinity is not None:
            self.affinity.engine = self.affinity.view.engine = self.engine_id
        if self.kv_feed is not None:
            self.kv_feed.engine = self.engine_id

    def describe(self) -> WorkerInfo:
        stats = self.host.stats.model_copy()
        stats.engine_requests = self.host.unfinished_requests()
        return WorkerInfo(
            id=self.id, model=self.settings.model_name, host=socket.gethostname(), pid=os.getpid(),
            max_model_len=self.host.max_model_len, max_num_seqs=self.settings.max_num_seqs,
            tokenizer=self.host.model_path, tool_call_parser=self.settings.tool_call_parser,
            vocab_size=self.host.vocab_size or None, prompt_probe=self.host.prompt_probe,
            tokenizer_files=self.tokenizer_key,
            started_at=self.started_at, last_seen=time.time(),
            draining=self.draining, stats=stats,
            frontend=fe.index if (fe := self.host.frontend) else 0, frontends=fe.count if fe else 1,
            adapters=self.host.adapters.loaded(),
            engine=self.engine_id, lane=self.affinity is not None, tasks=self.host.tasks,
            max_loras=self.settings.max_loras if self.host.adapters.enabled else 0,
            classes=self.classes.beat() if self.classes is not None else None, swapper=self.swapper,
        )

    def ready(self) -> bool:
        """Serving: Redis took a heartbeat within the TTL, not draining, the engine alive."""
        beat = self.heartbeat.last_ok
        return (beat is not None and time.monotonic() - beat < self.settings.worker_ttl_s
                and not self.draining and not self.death.triggered)

    def held_jobs(self) -> int:
        return len(self.runner.attempts) if self.runner is not None else 0

    def saturated(self) -> bool:
        return self.held_jobs() >= self.slots

    def last_beat(self) -> float | None:
        return self.heartbeat.last_ok

    def claimed(self) -> dict[str, int]:
        return self.runner.attempts.attempts() if self.runner is not None else {}

    def lost(self, job_id: str, attempt: int) -> None:
        if self.handback is not None:
            self.host.loop.call_soon_threadsafe(self.handback.fence, job_id, attempt)

    def engine_dead(self) -> bool:
        engine, fe = self.host.engine, self.host.frontend
        if self.stopping or engine is None:
            return False
        return bool(engine.errored) or (fe is not None and fe.engine_gone())

    def on_engine_dead(self) -> None:
        if not self.stopping:
            self.death.trigger()
