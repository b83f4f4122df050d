"""The Celery application: broker settings shared by the gateway (sender) and workers.

This module never imports vLLM, so the gateway can import it to send tasks by name.
"""

from __future__ import annotations

from celery import Celery

from inferq.shared import keys
from inferq.shared.schemas import JobMessage
from inferq.shared.settings import Settings


def make_celery(settings: Settings) -> Celery:
    app = Celery("inferq", broker=settings.redis_url, set_as_current=False)
    app.conf.update(
        task_serializer="json",
        accept_content=["json"],
        task_ignore_result=True,
        task_acks_late=True,  # a job is acked only when it ended: a dead worker's job is redelivered
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=1,  # pull no more jobs than there are free engine slots
        task_default_queue=keys.queue(settings.model_name),
        broker_connection_retry_on_startup=True,
        broker_transport_options={
            # Redis redelivers an unacked job after this long, even if it is still running:
            # keep it far above the longest job. Lost workers are detected by heartbeat instead.
            "visibility_timeout": settings.visibility_timeout_s,
            "priority_steps": list(keys.PRIORITIES),
            "sep": keys.PRIORITY_SEP,
            "queue_order_strategy": "priority",
        },
        worker_hijack_root_logger=False,
        worker_send_task_events=False,
    )
    return app


def send_job(app: Celery, msg: JobMessage) -> None:
    """Put the job on its model's queue (blocking: call it from a thread in async code)."""
    app.send_task(keys.TASK_NAME, args=[msg.model_dump_json(exclude_none=True)], task_id=msg.id,
                  queue=keys.queue(msg.model), priority=msg.request.priority,
                  headers={"traceparent": msg.traceparent} if msg.traceparent else None)
