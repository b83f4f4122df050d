"""Celery entry point of a worker process: the generate task and the engine's life cycle.

The task is thin: decode the payload, hand it to the process's :class:`WorkerRuntime`, return.
Nothing in a payload can raise out of the task, so no client input can crash a worker thread or
poison the queue: a payload the worker cannot decode ends its job ``failed`` (``undecodable_job``)
and is acked; one that does not even say which job it is, is logged and dropped.
"""

from __future__ import annotations

import logging
import os
import re
import threading
from typing import Any

from celery import Task, signals
from celery.exceptions import Reject
from pydantic import ValidationError

from inferq.shared import keys
from inferq.shared.errors import InvalidRequest
from inferq.shared.redis import redis_retrying
from inferq.shared.schemas import ErrorInfo, JobMessage, JobStatus
from inferq.shared.store import JobStore
from inferq.shared.settings import get_settings
from inferq.worker import kombu_fix
from inferq.shared.celery_app import make_celery
from inferq.worker.death import kill_children
from inferq.worker.runtime import WorkerRuntime

log = logging.getLogger(__name__)
kombu_fix.install()
app = make_celery(get_settings())
_runtime: WorkerRuntime | None = None


@signals.worker_init.connect
def _start_engine(**_: Any) -> None:
    """Start the engine before the worker consumes anything; if it cannot start, exit non-zero
    (Celery would otherwise log the error and go on taking jobs it cannot run)."""
    global _runtime
    try:
        _runtime = WorkerRuntime(get_settings(), app)
        _runtime.start()
    except BaseException:
        log.critical("the engine could not start; exiting", exc_info=True)
        kill_children()  # an engine core left behind would keep holding the GPU's memory
        logging.shutdown()
        os._exit(3)


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
        if _runtime is None or _runtime.store is None:
            raise Reject("engine not started", requeue=True)
        failed = _runtime.host.run(fail_undecodable(_runtime.store, job_id, e))
        return JobStatus.failed.value if failed else None
    if _runtime is None:  # not reachable once worker_init succeeded; never lose the job
        raise Reject("engine not started", requeue=True)
    status = _runtime.run_job(msg)
    return status.value if status else None


_PAYLOAD_ID = re.compile(r'"id"\s*:\s*"(' + keys.JOB_ID_PATTERN + r')"')


def undecodable_job_id(task_id: str | None, payload: object) -> str | None:
    """The job a payload that failed to decode belongs to, without decoding it: the task id (the
    gateway and the reaper send each job with ``task_id = job id``), else the first ``"id"`` of
    the job's form in the raw text. None when neither names a job."""
    if task_id and keys.is_job_id(task_id):
        return task_id
    if isinstance(payload, (str, bytes)):
        text = payload if isinstance(payload, str) else payload.decode("utf-8", "replace")
        if m := _PAYLOAD_ID.search(text[:4096]):
            return m.group(1)
    return None


async def fail_undecodable(store: JobStore, job_id: str, error: Exception) -> bool:
    """Fail the job of a payload the worker cannot decode, if it is still queued (a running or
    finished job is left as it is), with its final ``error`` event, so that polls see why and
    streams end. Without this the job would stay queued forever and the reaper would re-send
    the same message again and again."""
    if isinstance(error, ValidationError):  # its text would quote the payload: loc and msg only
        detail = "; ".join(f"{'.'.join(map(str, x['loc']))}: {x['msg']}" if x["loc"] else x["msg"]
                           for x in error.errors(include_url=False, include_input=False)[:3])
    else:
        detail = f"{type(error).__name__}: {error}"
    reason = InvalidRequest(f"the worker could not decode the job's message ({detail[:300]})",
                            code="undecodable_job")
    try:
        async for attempt in redis_retrying():
            with attempt:
                failed = await store.fail_queued(job_id, ErrorInfo.of(reason))
    except Exception as e:  # Redis away: the job stays queued, the reaper re-sends it, we try again
        log.error("job %s: undecodable message, and could not fail the job: %s", job_id, e)
        return False
    log.error("job %s: undecodable message (%s); %s", job_id, reason.message,
              "the job failed" if failed else "the job was no longer queued: left as it is")
    return failed
