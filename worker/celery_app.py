"""The Celery application: broker settings shared by the gateway (sender) and workers.

This module never imports vLLM, so the gateway can import it to send tasks by name.
"""

from __future__ import annotations

from celery import Celery

from shared import keys
from shared.settings import Settings


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
            # keep it far above the longest job (see docs).
            "visibility_timeout": settings.visibility_timeout_s,
        },
        worker_hijack_root_logger=False,
        worker_send_task_events=False,
    )
    return app
