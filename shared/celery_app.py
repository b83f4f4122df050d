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
from typing import Any
from urllib.parse import quote

from celery import Celery
from redis.backoff import NoBackoff
from redis.retry import Retry

from inferq.shared import keys
from inferq.shared.redis import RedisTarget
from inferq.shared.schemas import JobMessage
from inferq.shared.settings import Settings


def broker(settings: Settings) -> tuple[str, dict[str, Any], dict[str, Any] | None]:
    """Celery's broker URL, the transport options it needs beyond inferq's, and ``broker_use_ssl``.
    Without Sentinels: INFERQ_REDIS_URL as it is. With them, kombu's Sentinel transport
    (``sentinel://h1:26379/DB;sentinel://h2:26379/DB``, the data password in each, since kombu
    moves on to the next URL when one fails), told the master's name and how to speak to the
    Sentinels (their password, timeouts, TLS); a rediss:// URL's TLS options go to the master's
    connections through ``broker_use_ssl``."""
    t = RedisTarget.of(settings)
    if not t.sentinels:
        return settings.redis_url, {}, None
    o = t.connection_kwargs()
    auth = ""
    if o.get("password"):
        auth = f"{quote(o.get('username') or '', safe='')}:{quote(o['password'], safe='')}@"
    url = ";".join(f"sentinel://{auth}{f'[{h}]' if ':' in h else h}:{p}/{o.get('db', 0)}" for h, p in t.sentinels)
    # no retry of one Sentinel (redis-py's default: 10, backing off): kombu asks the next one
    options = {"master_name": t.master, "sentinel_kwargs": {**t.sentinel_kwargs(), "retry": Retry(NoBackoff(), 0)}}
    use_ssl = {k: v for k, v in o.items() if k.startswith("ssl_")} if t.tls else None
    return url, options, use_ssl


def make_celery(settings: Settings) -> Celery:
    url, sentinel_options, use_ssl = broker(settings)
    app = Celery("inferq", broker=url, set_as_current=False)
    if use_ssl is not None:
        app.conf.broker_use_ssl = use_ssl
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
            **sentinel_options,
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
    headers.update(extra_headers(msg))
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


def extra_headers(msg: JobMessage) -> dict[str, Any]:
    """What a job's message says in its headers beside Celery's: its trace context, and its tenant
    and weight (what a worker's gate reads without opening the body: worker/kombu_gate.py)."""
    out: dict[str, Any] = {"traceparent": msg.traceparent} if msg.traceparent else {}
    if msg.tenant is not None:
        out.update(tenant=msg.tenant, weight=msg.tenant_weight or 1.0)
    return out


def send_job(app: Celery, msg: JobMessage) -> None:
    """Put the job on its model's queue (blocking: call it from a thread in async code)."""
    app.send_task(keys.TASK_NAME, args=[msg.model_dump_json(exclude_none=True)], task_id=msg.id,
                  argsrepr=f"[{msg.id!r}]", kwargsrepr="{}",  # the prompt stays out of Celery's logs
                  queue=keys.queue(msg.model), priority=msg.request.priority, headers=extra_headers(msg) or None)
