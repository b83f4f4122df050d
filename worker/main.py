"""``inferq worker``: start a Celery worker (threads pool) that feeds one vLLM engine."""

from __future__ import annotations

from inferq.shared import keys
from inferq.shared.settings import get_settings


def run_worker(loglevel: str = "INFO") -> None:
    from inferq.worker.tasks import app  # imports the task and the engine life-cycle signals

    s = get_settings()
    app.worker_main([
        "worker",
        "--pool=threads",
        f"--concurrency={s.max_num_seqs}",  # one Celery slot per engine sequence
        f"--queues={keys.queue(s.model_name)}",
        f"--loglevel={loglevel}",
        "--hostname=inferq@%h-%i",
        "--without-gossip",
        "--without-mingle",
        "--without-heartbeat",
    ])
