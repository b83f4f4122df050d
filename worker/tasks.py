"""Celery entry point of a worker process: the generate task and the engine's life cycle.

The task is thin: decode the payload, hand it to the process's :class:`WorkerRuntime`, return.
Nothing in a payload can raise out of the task (a bad one is logged and dropped), so no client
input can crash a worker thread or poison the queue.
"""

from __future__ import annotations

import logging
from typing import Any

from celery import signals
from pydantic import ValidationError

from shared import keys
from shared.schemas import JobMessage
from shared.settings import get_settings
from worker.celery_app import make_celery
from worker.runtime import WorkerRuntime

log = logging.getLogger(__name__)
app = make_celery(get_settings())
_runtime: WorkerRuntime | None = None


@signals.worker_init.connect
def _start_engine(**_: Any) -> None:
    global _runtime
    _runtime = WorkerRuntime(get_settings())
    _runtime.start()


@signals.worker_shutdown.connect
def _stop_engine(**_: Any) -> None:
    if _runtime is not None:
        _runtime.stop()


@app.task(name=keys.TASK_NAME, acks_late=True)
def generate(payload: str) -> str | None:
    try:
        msg = JobMessage.model_validate_json(payload)
    except ValidationError as e:
        log.error("dropped a malformed job message: %s", e)
        return None
    if _runtime is None:
        raise RuntimeError("engine not started")
    status = _runtime.run_job(msg)
    return status.value if status else None
