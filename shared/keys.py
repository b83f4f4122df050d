"""Every Redis key, channel and Celery queue name inferq uses, in one place.

Layout (``{id}`` is the job id, which is also the Celery task id and the vLLM request id):

==============================  ========  ==========================================================
key                             type      holds
==============================  ========  ==========================================================
inferq:job:{id}                 hash      the job record (:class:`shared.schemas.JobRecord` fields)
inferq:job:{id}:log             stream    every stream event of the job, in ``seq`` order (replay)
inferq:job:{id}:chan            pub/sub   the same events, live
inferq:control                  pub/sub   control messages to all workers (cancel)
inferq:workers:{model}          zset      worker id -> last heartbeat (unix s)
inferq:worker:{wid}             string    the worker's :class:`shared.schemas.WorkerInfo` (TTL)
inferq:models                   zset      served model name -> last heartbeat (unix s)
inferq.q.{model}                list      the model's Celery queue (kombu's Redis transport)
==============================  ========  ==========================================================
"""

from __future__ import annotations

PREFIX = "inferq"
CONTROL_CHANNEL = f"{PREFIX}:control"
MODELS = f"{PREFIX}:models"
TASK_NAME = "inferq.generate"


def job(job_id: str) -> str:
    """The job record hash; lives ``Settings.job_ttl_s``."""
    return f"{PREFIX}:job:{job_id}"


def job_log(job_id: str) -> str:
    """The job's event log (a Redis stream); lives as long as the record."""
    return f"{PREFIX}:job:{job_id}:log"


def job_channel(job_id: str) -> str:
    """The pub/sub channel the job's events are published on."""
    return f"{PREFIX}:job:{job_id}:chan"


def workers(model: str) -> str:
    """Sorted set of the model's workers, scored by last heartbeat time."""
    return f"{PREFIX}:workers:{model}"


def worker(worker_id: str) -> str:
    """The worker's self-description and engine stats; expires ``Settings.worker_ttl_s``."""
    return f"{PREFIX}:worker:{worker_id}"


def queue(model: str) -> str:
    """The Celery queue that feeds the model's workers (also the Redis list of queued messages)."""
    return f"{PREFIX}.q.{model}"


def job_id_from_channel(channel: str) -> str:
    """Inverse of :func:`job_channel`."""
    head, tail = f"{PREFIX}:job:", ":chan"
    if not (channel.startswith(head) and channel.endswith(tail)):
        raise ValueError(f"not a job channel: {channel!r}")
    return channel[len(head) : -len(tail)]
