"""Celery entry point of a worker process: the generate task and the engine's life cycle.

The task is thin: decode the payload, hand it to the process's :class:`WorkerRuntime`, return.
Nothing in a payload can raise out of the task, so no client input can crash a worker thread or
poison the queue: a payload the worker cannot decode ends its job ``failed`` (``undecodable_job``)
and is acked; one that does not even say which job it is, is logged and dropped.
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Any

from celery import Task, signals
from celery.exceptions import Reject

from inferq.shared import keys
from inferq.shared.celery_app import make_celery
from inferq.shared.schemas import JobMessage, JobStatus
from inferq.shared.settings import get_settings
from inferq.worker import kombu_fix, kombu_gate, kombu_pipeline
from inferq.worker.engine import group
from inferq.worker.engine.host import EngineHost
from inferq.worker.jobs.undecodable import undecodable_job_id
from inferq.worker.liveness.death import kill_children
from inferq.worker.multi import child
from inferq.worker.runtime import WorkerRuntime

log = logging.getLogger(__name__)
kombu_pipeline.install()  # first: kombu_fix's guards wrap what it installs
kombu_fix.install()
kombu_gate.install()  # which lists the consumer pops: the runtime gives it its gate (service classes)
app = make_celery(get_settings())
_runtime: WorkerRuntime | None = None


@signals.worker_init.connect
def _start_engine(**_: Any) -> None:
    """Start the engine before the worker consumes anything; if it cannot start, exit non-zero
    (Celery would otherwise log the error and go on taking jobs it cannot run)."""
    global _runtime
    try:
        settings = get_settings()
        if child.LINK is not None:
            child.LINK.mark("engine")
        _runtime = WorkerRuntime(settings, app, EngineHost(settings, group.FRONTEND))
        _runtime.start()
        if child.LINK is not None:
            child.LINK.mark("engine_ready")
        kombu_gate.use(_runtime.classes)  # before Celery consumes: batch work only where it fits
        if _runtime.classes is not None:
            _runtime.classes.delivered = kombu_gate.delivered
            _runtime.classes.delivered_tenants = kombu_gate.delivered_tenants
    except BaseException:
        log.critical("the engine could not start; exiting", exc_info=True)
        kill_children()  # an engine core left behind would keep holding the GPU's memory
        logging.shutdown()
        os._exit(3)


@signals.celeryd_after_setup.connect
def _consume_lane(instance: Any, **_: Any) -> None:
    """With cache-affine pull, consume this worker's lane besides its model's queue (the jobs other
    workers pass to it: worker/jobs/affinity.py)."""
    if _runtime is not None and _runtime.affinity is not None:
        instance.app.amqp.queues.select_add(keys.lane(_runtime.settings.model_name, _runtime.id))


@signals.worker_ready.connect
def _consuming(sender: Any, **_: Any) -> None:
    """The consumer takes jobs now: a model's process of a multi-model worker tells its supervisor."""
    if _runtime is not None and child.LINK is not None:
        child.LINK.ready(_runtime, app, sender.hostname)


@signals.worker_shutting_down.connect
def _drain(**_: Any) -> None:
    """SIGTERM: Celery stops taking jobs and waits for its threads; finish or hand back ours."""
    if _runtime is not None:
        threading.Thread(target=_runtime.drain, name="drain", daemon=True).start()


@signals.worker_shutdown.connect
def _stop_engine(**_: Any) -> None:
    if _runtime is not None:
        _runtime.stop()


@app.task(name=keys.TASK_NAME, acks_late=True, bind=True)
def generate(self: Task, payload: str) -> str | None:
    try:
        msg = JobMessage.model_validate_json(payload)
    except (ValueError, TypeError) as e:  # pydantic's ValidationError is a ValueError
        job_id = undecodable_job_id(self.request.id, payload)
        if job_id is None:
            log.error("dropped a malformed job message that names no job: %s", e)
            return None
        if _runtime is None:
            raise Reject("engine not started", requeue=True) from e
        failed = _runtime.fail_undecodable(job_id, e)
        return JobStatus.failed.value if failed else None
    if _runtime is None:  # not reachable once worker_init succeeded; never lose the job
        raise Reject("engine not started", requeue=True)
    header = self.request.get("traceparent")  # the W3C trace context the message carries (tracing on)
    if isinstance(header, str) and header:
        msg.traceparent = header
    status = _runtime.run_job(msg)
    return status.value if status else None
