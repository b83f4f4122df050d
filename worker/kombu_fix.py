"""A guard for kombu's Redis transport when the broker connection is lost with jobs in flight.

When Redis goes away, Celery's consumer (5.7) first *collects* the broken connection, which drops
the transport's client and the channel's pools, and then closes it. Two calls then go through that
dead channel and raise ``AttributeError`` (kombu ``_connparams``: ``'NoneType' object has no
attribute 'hostname'`` / ``'client'``). Neither is a connection error, so each escapes Celery's
reconnect logic and stops the worker:

- closing the channel restores its unacked messages;
- after the reconnect, a job that was running finishes and its message is acked on the old
  channel ("Unrecoverable error").

Both were seen in the reliability tests: a Redis restart took busy workers down with it. Here
those calls do only their local bookkeeping when the channel's transport is gone. The messages
stay in kombu's unacked hash, and the reaper's unacked sweep (``worker/liveness/unacked.py``) re-sends any
whose job is still queued and drops the others.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from kombu.transport import redis as kombu_redis
from kombu.transport.virtual import base as kombu_virtual

log = logging.getLogger(__name__)


def transport_gone(qos: Any) -> bool:
    """The channel can no longer reach Redis: no pool of its own, and no client to make one from."""
    channel = qos.channel
    conn = getattr(channel, "connection", None)
    return getattr(channel, "_pool", None) is None and (conn is None or getattr(conn, "client", None) is None)


def _guard(name: str, when_gone: Callable[..., Any]) -> None:
    original = getattr(kombu_redis.QoS, name)
    if getattr(original, "inferq_guard", False):
        return

    def guarded(self: Any, *args: Any, **kwargs: Any) -> Any:
        if transport_gone(self):
            log.warning("kombu %s on a channel whose broker connection is gone: skipped (the reaper's "
                        "unacked sweep re-sends or drops its messages)", name)
            return when_gone(self, *args, **kwargs)
        return original(self, *args, **kwargs)

    guarded.inferq_guard = True  # type: ignore[attr-defined]
    guarded.__wrapped__ = original  # type: ignore[attr-defined]
    setattr(kombu_redis.QoS, name, guarded)


def _skipped(*_args: Any, **_kwargs: Any) -> None:
    """What a guarded method that only restores messages does on a connection that is gone."""


def install() -> None:
    _guard("restore_unacked", _skipped)
    _guard("restore_by_tag", _skipped)
    # forget the delivery locally, as a successful ack would
    _guard("ack", lambda self, delivery_tag: kombu_virtual.QoS.ack(self, delivery_tag))
