"""The Celery application: broker settings shared by the gateway (sender) and workers.

This module never imports vLLM, so the gateway can import it to send tasks by name.

Two ways of putting a job on its queue, one message: :func:`send_job` publishes through Celery
(a blocking call, for the reaper's and hand-backs' threads); :func:`job_message` builds the same
message as kombu's Redis transport stores it, so that the gateway writes it in the same Redis
script as the job's record (one round trip, no thread, and never a record without its message).
"""

from __future__ import annotations

import base64
import json
import uuid

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


def job_message(app: Celery, msg: JobMessage, queue: str | None = None) -> tuple[str, str]:
    """The job's Celery message as kombu's Redis transport stores it, and the Redis list it goes on
    (the one of its queue and priority): what :func:`send_job` would push, byte for byte in meaning.
    Celery builds the task's headers and body (protocol 2); the envelope is kombu's virtual
    transport's (``prepare_message``, then ``basic_publish`` to the default exchange). ``queue``: the
    model's queue, or another (a worker's lane)."""
    queue, priority = queue or keys.queue(msg.model), msg.request.priority
    payload = msg.model_dump_json(exclude_none=True)
    headers, properties, body, _ = app.amqp.as_task_v2(
        msg.id, keys.TASK_NAME, args=[payload], kwargs={}, argsrepr=f"[{msg.id!r}]", kwargsrepr="{}",
        ignore_result=None)
    if msg.traceparent:
        headers["traceparent"] = msg.traceparent
    envelope = {
        "body": base64.b64encode(json.dumps(body).encode()).decode(),
        "content-encoding": "utf-8",
        "content-type": "application/json",
        "headers": headers,
        "properties": {**properties, "delivery_mode": 2, "priority": priority, "body_encoding": "base64",
                       "delivery_info": {"exchange": "", "routing_key": queue},
                       "delivery_tag": str(uuid.uuid4())},
    }
    return keys.priority_lists(queue)[priority], json.dumps(envelope)


def send_job(app: Celery, msg: JobMessage) -> None:
    """Put the job on its model's queue (blocking: call it from a thread in async code)."""
    app.send_task(keys.TASK_NAME, args=[msg.model_dump_json(exclude_none=True)], task_id=msg.id,
                  argsrepr=f"[{msg.id!r}]", kwargsrepr="{}",  # the prompt stays out of Celery's logs
                  queue=keys.queue(msg.model), priority=msg.request.priority,
                  headers={"traceparent": msg.traceparent} if msg.traceparent else None)
