"""kombu's unacked bookkeeping, sent without waiting for Redis in Celery's consumer thread.

With late acks, kombu's Redis transport records every message it delivers in the ``unacked`` hash
and its index (``QoS.append``: MULTI, ZADD, HSET, EXEC) and removes it on ack (ZREM, HDEL), each a
blocking round trip on the consumer thread — the one thread that takes every job of a worker off
its queue. Two of its three round trips per job were bookkeeping, and the acks of a wave of jobs
that end together queued in front of the next wave's messages.

Here both are written on one connection of the channel's pool that this module holds, as soon as
they happen, and their replies are read when they have arrived (at the next write, or before any
read of that state: restoring unacked messages). Redis applies them in the order they were sent,
so an ack never lands before its append. What a lost write can leave behind is what a worker dying
at that moment leaves today, and the reaper's sweeps (``worker/liveness/unacked.py``) already take care of
both: a stale unacked entry of an ended job is dropped; a queued job whose message is nowhere is
re-sent. A connection error on a write is raised where kombu's own write would have raised it (so
Celery's reconnect logic sees it); one found while reading replies is logged and the connection
dropped.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from kombu.transport import redis as kombu_redis
from kombu.transport.virtual import base as kombu_virtual
from kombu.utils.json import dumps
from redis.exceptions import ResponseError

from inferq.shared.redis import TRANSIENT

log = logging.getLogger(__name__)

#: Replies left unread before a write waits for them (a bound on what the socket holds back).
MAX_PENDING = 4096


class Writer:
    """One pooled connection, commands sent without waiting, replies read as they come."""

    def __init__(self, pool: Any) -> None:
        self.pool = pool
        self.conn = pool.get_connection()
        self.pending = 0  # replies not read yet
        self.lock = threading.Lock()

    def send(self, *commands: tuple[Any, ...]) -> None:
        with self.lock:
            self._read(block=self.pending + len(commands) > MAX_PENDING)
            try:
                # no health check: its PING would read a reply that belongs to an earlier command
                self.conn.send_packed_command(self.conn.pack_commands(commands), check_health=False)
            except BaseException:
                self._reset()
                raise
            self.pending += len(commands)

    def read(self, block: bool) -> None:
        """Read the replies that have arrived (``block``: all of them)."""
        with self.lock:
            self._read(block)

    def _read(self, block: bool) -> None:
        try:
            while self.pending and (block or self.conn.can_read(timeout=0)):
                self.pending -= 1
                try:
                    self.conn.read_response()
                except ResponseError as e:  # one refused command; the sweeps cover what it left
                    log.warning("kombu bookkeeping: Redis refused a write: %s", e)
        except TRANSIENT as e:
            log.warning("kombu bookkeeping: connection lost with %d replies unread (%s); the reaper's "
                        "sweeps re-send or drop what they left", self.pending, e)
            self._reset()

    def _reset(self) -> None:
        self.pending = 0
        self.conn.disconnect()


def writer(qos: Any) -> Writer | None:
    """The QoS's writer, made on first use; None where kombu's own synchronous code must run: the
    channel has no pool (its broker connection is gone) or prefixes its keys."""
    channel = qos.channel
    pool = getattr(channel, "_pool", None)
    if pool is None or getattr(channel, "global_keyprefix", None):
        return None
    w: Writer | None = getattr(qos, "_inferq_writer", None)
    if w is None or w.pool is not pool:  # first use, or the channel reconnected with a new pool
        w = qos._inferq_writer = Writer(pool)
    return w


def flush(qos: Any) -> None:
    """Wait until every bookkeeping write of ``qos`` sent so far has been applied."""
    w = getattr(qos, "_inferq_writer", None)
    if w is not None:
        w.read(block=True)


def _append(original: Callable[..., Any]) -> Callable[..., Any]:
    def append(self: Any, message: Any, delivery_tag: str) -> None:
        w = writer(self)
        if w is None:
            original(self, message, delivery_tag)
            return
        info = message.delivery_info
        w.send(("ZADD", self.unacked_index_key, time.time(), delivery_tag),
               ("HSET", self.unacked_key, delivery_tag,
                dumps([message._raw, info["exchange"], info["routing_key"]])))
        kombu_virtual.QoS.append(self, message, delivery_tag)
    return append


def _ack(original: Callable[..., Any]) -> Callable[..., Any]:
    def ack(self: Any, delivery_tag: str) -> None:
        w = writer(self)
        if w is None:
            original(self, delivery_tag)
            return
        w.send(("ZREM", self.unacked_index_key, delivery_tag), ("HDEL", self.unacked_key, delivery_tag))
        kombu_virtual.QoS.ack(self, delivery_tag)
    return ack


def _flushed_first(original: Callable[..., Any]) -> Callable[..., Any]:
    """Methods that read the unacked hash (restoring messages) see every write sent before them."""
    def method(self: Any, *args: Any, **kwargs: Any) -> Any:
        flush(self)
        return original(self, *args, **kwargs)
    return method


def install() -> None:
    """Patch kombu's Redis QoS (once per process; before ``kombu_fix.install``, whose guards then
    wrap these methods)."""
    qos = kombu_redis.QoS
    if getattr(qos, "_inferq_pipelined", False):
        return
    setattr(qos, "append", _append(qos.append))  # noqa: B010 (mypy refuses assigning to a method)
    setattr(qos, "ack", _ack(qos.ack))  # noqa: B010
    for name in ("restore_unacked", "restore_by_tag", "reject", "restore_visible"):
        setattr(qos, name, _flushed_first(getattr(qos, name)))
    setattr(qos, "_inferq_pipelined", True)  # noqa: B010 (not an attribute kombu declares)
