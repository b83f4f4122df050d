"""``inferq worker``: a Celery worker (threads pool) that feeds one vLLM engine, or an engine group
(``INFERQ_FRONTENDS`` > 1: several such workers as clients of one EngineCore, worker/engine/group.py),
or a multi-model worker (``INFERQ_MODELS``: one such worker per model, one awake at a time,
worker/multi/swapper.py)."""

from __future__ import annotations

import logging
import os
import sys

from inferq.shared import keys
from inferq.shared.settings import Settings, get_settings
from inferq.worker.engine.group import Frontend, become_frontend
from inferq.worker.multi import child
from inferq.worker.multi.child import ModelStart, become_model

#: Celery's loggers of a line per task received and per task ended (with the job's own line, three a
#: job at INFO: a few per cent of a worker's CPU at a few hundred jobs a second); shown at DEBUG
CELERY_TASK_LOGGERS = ("celery.worker.strategy", "celery.app.trace")


def run_worker(loglevel: str = "INFO") -> int:
    """Serve until stopped; the exit code."""
    s = get_settings()
    if s.models:  # several models, one awake at a time (worker/multi)
        from inferq.worker.multi.swapper import run_swapper

        return run_swapper(s, loglevel, model_main)
    if s.frontends > 1:
        from inferq.worker.engine.group import run_group

        return run_group(s, loglevel, frontend_main)
    consume(s, s.max_num_seqs, s.reserve, loglevel)
    return 0


def frontend_main(frontend: Frontend, loglevel: str) -> None:
    """Entry point of a frontend process of an engine group (spawned): a worker whose engine is the group's."""
    s = get_settings()
    consume(s, become_frontend(frontend, s), -(-s.reserve // frontend.count), loglevel)


def model_main(start: ModelStart, loglevel: str) -> None:
    """Entry point of a model's process of a multi-model worker (spawned): a worker of that model."""
    s = become_model(start)
    link = child.LINK
    assert link is not None
    # what a start waits for most: vLLM's engine, and the worker's tasks (which build the Celery app
    # from the model's settings, set above), imported before the wait of a process spawned ahead
    import vllm.v1.engine.async_llm  # noqa: F401

    import inferq.worker.tasks  # noqa: F401

    link.mark("imported")
    if start.park and not link.wait_for_start():
        return  # spawned ahead, and its supervisor stopped before it was needed
    consume(s, s.max_num_seqs, s.reserve, loglevel)


def quiet_task_lines(loglevel: str) -> None:
    """Below DEBUG, Celery's line when a task is received and ends are not logged (its warnings and
    errors are): the job's own line says how it ended."""
    if loglevel.upper() != "DEBUG":
        for name in CELERY_TASK_LOGGERS:
            logging.getLogger(name).setLevel(logging.WARNING)


def consume(s: Settings, slots: int, reserve: int, loglevel: str) -> None:
    """Run the Celery worker with ``slots`` job slots (one per engine sequence any work may fill) and
    ``reserve`` more that only interactive work takes (worker/kombu_gate.py)."""
    from inferq.worker.tasks import app  # imports the task and the engine life-cycle signals

    sys.setswitchinterval(s.gil_switch_interval_ms / 1000)
    quiet_task_lines(loglevel)

    app.worker_main([
        "worker",
        "--pool=threads",
        f"--concurrency={slots + reserve}",
        f"--queues={keys.queue(s.model_name)}",
        f"--loglevel={loglevel}",
        f"--hostname=inferq@%h-{os.getpid()}",  # unique among the frontends of a group
        "--without-gossip",
        "--without-mingle",
        "--without-heartbeat",
    ])
