"""Which lists of its queue a worker pops: the batch lane only while its batch work may grow.

kombu's Redis transport takes a worker's jobs with one ``BRPOP`` over every list of its queues,
priority first (``_brpop_start``), whenever Celery's prefetch allows one more message, whatever its
class. With service classes (worker/jobs/classes.py) batch work waits on the list of
``INFERQ_BATCH_PRIORITY``, and before each ``BRPOP`` this module asks the process's gate whether
that list may be popped now, given the messages the channel holds (delivered and not yet acked:
kombu's own count, exact at the moment of the pop, before any job thread has started). Left out,
the ``BRPOP`` waits on the other lists only, for :data:`GATED_TIMEOUT_S` instead of kombu's second,
so that a batch slot that frees is filled within that time (a batch message already on its way
is run: the limit can be passed by the one message a ``BRPOP`` in flight returns).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, Protocol

from kombu.transport import redis as kombu_redis

log = logging.getLogger(__name__)

#: How long a ``BRPOP`` that leaves the batch lane out blocks (seconds): the delay before a batch
#: slot that frees is seen.
GATED_TIMEOUT_S = 0.05


class Gate(Protocol):
    lane: int  # the priority whose list holds batch work

    def lane_open(self, held: int, lane_held: int) -> bool:
        """Whether the lane may be popped while the worker holds ``held`` messages, ``lane_held`` of them
        from the lane."""


_gate: Gate | None = None
_qos: Any = None  # the consuming channel's QoS, as the last BRPOP saw it


def use(gate: Gate | None) -> None:
    """The gate this process's consumer asks (None: every list, as kombu pops them)."""
    global _gate
    _gate = gate


def delivered() -> int:
    """Messages this process's consumer holds now (delivered, not acked; 0 before its first BRPOP):
    a job taken counts from its delivery, before its thread has started it."""
    qos = _qos
    return 0 if qos is None else max(0, len(qos._delivered) - len(qos._dirty))


def priority_of(message: Any) -> int:
    """The priority a delivered message was queued at (the list it came from)."""
    props = getattr(message, "properties", None) or {}
    try:
        return int(props.get("priority") or 0)
    except (TypeError, ValueError):
        return 0


def held(qos: Any, lane: int) -> tuple[int, int]:
    """Messages the channel holds (delivered, not acked) and how many of them came from ``lane``."""
    dirty = qos._dirty
    mine = [m for tag, m in list(qos._delivered.items()) if tag not in dirty]
    return len(mine), sum(1 for m in mine if priority_of(m) == lane)


def _gated(original: Callable[..., Any]) -> Callable[..., Any]:
    def _brpop_start(self: Any, timeout: float | None = None) -> Any:
        global _qos
        gate, _qos = _gate, self.qos
        if gate is None or gate.lane_open(*held(self.qos, gate.lane)):
            return original(self, timeout)
        steps = self.priority_steps
        self.priority_steps = [p for p in steps if p != gate.lane]
        try:
            return original(self, GATED_TIMEOUT_S)
        finally:
            self.priority_steps = steps
    _brpop_start.inferq_gate = True  # type: ignore[attr-defined]
    return _brpop_start


def install() -> None:
    """Patch kombu's Redis channel (once per process)."""
    channel = kombu_redis.Channel
    if getattr(channel._brpop_start, "inferq_gate", False):
        return
    setattr(channel, "_brpop_start", _gated(channel._brpop_start))  # noqa: B010 (a method: mypy refuses =)
