"""What the worker's liveness tests share: an engine host whose loop runs in a thread (as the real
one does) around a scripted engine. (Their Redis of their own: tests/unit/conftest.py; waiting:
tests/wait.py.)"""

from __future__ import annotations

import asyncio
import os
import threading
from concurrent import futures
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import vllm  # noqa: F401  (the runner imports it on its first job: not inside a test's deadline)
from vllm.v1.engine.exceptions import EngineDeadError

from bench.standin import LoopHost, Out, Step
from inferq.shared.schemas import JobMessage, JobRecord, JobRequest
from inferq.shared.store import JobStore


@dataclass
class GatedEngine:
    """Each request gets one step, then waits for a step that never comes (the engine is busy
    elsewhere or stuck); ``die_for`` requests see the engine die instead."""

    die_for: set[str] = field(default_factory=set)
    errored: bool = False
    started: list[str] = field(default_factory=list)
    aborted: list[str] = field(default_factory=list)

    async def generate(self, prompt: Any, params: Any, request_id: str, **_: Any) -> Any:
        self.started.append(request_id)
        yield Step([Out(0, "x ", [1])])
        if request_id in self.die_for:
            raise EngineDeadError()
        try:
            await asyncio.Event().wait()
        except (asyncio.CancelledError, GeneratorExit):
            self.aborted.append(request_id)
            raise


async def queued_job(store: JobStore, model: str, **req: Any) -> JobMessage:
    request = JobRequest(**{"prompt": "one two", "max_tokens": 8, **req})
    rec = JobRecord(id=f"job-{os.urandom(8).hex()}", model=model, request=request)
    await store.create(rec)
    return JobMessage(id=rec.id, model=model, request=request, created_at=rec.created_at)


@dataclass
class Rig:
    """A WorkerRuntime around a scripted engine, run as Celery would: jobs on threads of a pool.
    ``events`` records, in order, the messages its own hand-backs sent and how it would have
    exited; ``resent`` the messages its reaper sent."""

    runtime: Any
    engine: Any
    events: list[tuple[str, Any]] = field(default_factory=list)  # ("sent", job id) / ("exit", code)
    resent: list[str] = field(default_factory=list)
    exited: threading.Event = field(default_factory=threading.Event)
    pool: ThreadPoolExecutor = field(default_factory=lambda: ThreadPoolExecutor(8, "celery-like"))
    runs: list[Future[Any]] = field(default_factory=list)

    @property
    def sent(self) -> list[str]:
        return [v for k, v in self.events if k == "sent"]

    def run_job(self, msg: JobMessage) -> Future[Any]:
        self.runs.append(f := self.pool.submit(self.runtime.run_job, msg))
        return f

    def stop(self) -> None:
        """End the jobs still running (as Celery's warm shutdown waits for them), then stop."""
        rt = self.runtime
        for job_id in list(rt.runner.active):
            rt.host.loop.call_soon_threadsafe(rt.runner.cancel, job_id)
        futures.wait(self.runs, timeout=30)
        rt.stop()
        self.pool.shutdown(wait=False, cancel_futures=True)


def start_runtime(url: str, engine: Any, tokenizer: Any = None, **settings: Any) -> Rig:
    rig = make_runtime(url, LoopHost(engine), tokenizer, **settings)
    rig.runtime.start()
    return rig


def make_runtime(url: str, host: LoopHost, tokenizer: Any = None, **settings: Any) -> Rig:
    """The rig around ``host``, its runtime not started."""
    from inferq.shared.celery_app import make_celery
    from inferq.shared.settings import Settings
    from inferq.worker.runtime import WorkerRuntime

    s = Settings(**{"redis_url": url, "worker_id": f"w-{os.urandom(3).hex()}", "served_model_name": "scripted",
                    "heartbeat_s": 0.1, "worker_ttl_s": 0.6, **settings})
    rig = Rig(None, host.engine)

    def exit(code: int) -> None:
        rig.events.append(("exit", code))
        rig.exited.set()

    rig.runtime = rt = WorkerRuntime(s, make_celery(s), host=host, exit=exit)  # type: ignore[arg-type]
    if tokenizer is not None:  # a real one (the scripted engine's host has a stand-in)
        rt.host.tokenizer = tokenizer
    rt.send = lambda msg: rig.events.append(("sent", msg.id))
    rt.reaper.send = lambda msg: rig.resent.append(msg.id)
    return rig
