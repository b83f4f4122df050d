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

The interactive reserve (the sequences beyond ``slots``) is shared between tenants as well: once the
worker holds ``slots`` jobs, the gate reads the message the ``BRPOP`` would return (the tail of the
first list that has one, as fair share ordered it) and each tenant's queued jobs, in one pipeline on
kombu's own client, and pops it unless its tenant is past its share of the worker and taking it
would leave no free sequence for the next job of another tenant below its share with nothing queued
(worker/jobs/classes.py); then the ``BRPOP`` waits on a list nobody fills (:data:`IDLE_STEP`) for
:data:`GATED_TIMEOUT_S`. A job passed to this worker's lane is always taken.
"""

from __future__ import annotations

import json
import logging
import math
from collections import Counter
from collections.abc import Callable
from typing import Any, Protocol

from kombu.transport import redis as kombu_redis

from inferq.shared import keys
from inferq.shared.lua import source
from inferq.worker.jobs.classes import Head, Promote, Tenant, Tenants

log = logging.getLogger(__name__)

#: How long a ``BRPOP`` that leaves the batch lane out blocks (seconds): the delay before a batch
#: slot that frees is seen.
GATED_TIMEOUT_S = 0.05
#: The priority step of a list no job is ever put on: what a ``BRPOP`` that may pop nothing waits on.
IDLE_STEP = 99
#: The most messages from the popping end of each list that a promotion looks at for its tenant's.
PROMOTE_WALK = 128


class Gate(Protocol):
    lane: int  # the priority whose list holds batch work

    def lane_open(self, held: int, lane_held: int) -> bool:
        """Whether the lane may be popped while the worker holds ``held`` messages, ``lane_held`` of them
        from the lane."""

    def reserve_open(self, held: int, tenants: Tenants, peek: Callable[[], Head | None]) -> bool | Promote:
        """Whether the next interactive message may be popped while the worker holds ``held``
        messages, ``tenants`` the interactive ones, or whose message to move ahead and pop instead;
        ``peek``: the message a ``BRPOP`` would return now (None: none, a lane's, or a message that
        names no tenant)."""


_gate: Gate | None = None
_qos: Any = None  # the consuming channel's QoS, as the last BRPOP saw it
_promote: Any = None  # queue_promote.lua, registered on kombu's client at its first use


def use(gate: Gate | None) -> None:
    """The gate this process's consumer asks (None: every list, as kombu pops them)."""
    global _gate
    _gate = gate


def delivered() -> int:
    """Messages this process's consumer holds now (delivered, not acked; 0 before its first BRPOP):
    a job taken counts from its delivery, before its thread has started it."""
    qos = _qos
    return 0 if qos is None else max(0, len(qos._delivered) - len(qos._dirty))


def delivered_tenants() -> Counter[str]:
    """Interactive messages this process's consumer holds now (delivered, not acked), by tenant."""
    qos, gate = _qos, _gate
    if qos is None or gate is None:
        return Counter()
    return Counter(held(qos, gate.lane)[2].count)


def priority_of(message: Any) -> int:
    """The priority a delivered message was queued at (the list it came from)."""
    props = getattr(message, "properties", None) or {}
    try:
        return int(props.get("priority") or 0)
    except (TypeError, ValueError):
        return 0


def tenant_of(headers: Any) -> Tenant | None:
    """The tenant a message's headers name (None: a message sent before tenants were named)."""
    if not isinstance(headers, dict) or not isinstance(name := headers.get("tenant"), str):
        return None
    try:
        weight = float(headers.get("weight") or 1.0)
    except (TypeError, ValueError):
        weight = 1.0
    return Tenant(name, weight if weight > 0 and math.isfinite(weight) else 1.0)


def held(qos: Any, lane: int) -> tuple[int, int, Tenants]:
    """Messages the channel holds (delivered, not acked), how many of them came from ``lane``, and
    the others by tenant."""
    dirty = qos._dirty
    mine = [m for tag, m in list(qos._delivered.items()) if tag not in dirty]
    tenants = Tenants()
    for m in mine:
        if priority_of(m) != lane:
            tenants.add(tenant_of(getattr(m, "headers", None)))
    return len(mine), len(mine) - sum(tenants.count.values()), tenants


def head(channel: Any, steps: list[int]) -> Head | None:
    """The message a ``BRPOP`` on ``steps`` of the channel's queues would return now (the tail of
    the first list that has one: kombu pushes on the left) and the jobs each tenant has queued on
    those lists, in one pipeline on kombu's own client; None for none, one on a worker's lane, one
    that names no tenant, or any failure (the ``BRPOP`` then decides)."""
    try:
        queues = sorted(channel.active_queues, key=keys.is_lane, reverse=True)  # a lane's jobs first
        names = [(q, channel._q_for_pri(q, p)) for p in steps for q in queues]
        with channel.conn_or_acquire() as client, client.pipeline(transaction=False) as pipe:
            for _, name in names:
                pipe.lindex(name, -1)
            shared = [name for q, name in names if not keys.is_lane(q)]
            for name in shared:
                pipe.hgetall(keys.fair_queued(name))
            got = pipe.execute()
        tails, counts = got[:len(names)], got[len(names):]
        for (queue, _), raw in zip(names, tails, strict=True):
            if raw is not None:
                tenant = None if keys.is_lane(queue) else tenant_of(json.loads(raw).get("headers"))
                return None if tenant is None else Head(tenant, queued_by_tenant(counts))
    except Exception as e:  # noqa: BLE001 (a peek: the BRPOP that follows meets any real trouble)
        log.debug("could not read the queue's next message: %s", e)
    return None


def queued_by_tenant(counts: list[dict[Any, Any]]) -> dict[str, int]:
    """Fair share's queued counts of several lists, added up by tenant."""
    out: dict[str, int] = {}
    for row in counts:
        for tenant, n in row.items():
            name = tenant.decode() if isinstance(tenant, bytes) else str(tenant)
            out[name] = out.get(name, 0) + int(n)
    return out


def promote(channel: Any, steps: list[int], tenant: str) -> int | None:
    """Move ``tenant``'s next message on ``steps`` of the channel's model queue (not a lane) to the
    popping end of its list, looking at most :data:`PROMOTE_WALK` messages from that end of each
    list; the priority step it is on, or None if none was found (or on any failure). The message
    stays in its list: the next ``BRPOP`` on that step takes it, or, should another worker pop it
    first, that worker runs it."""
    global _promote
    try:
        queues = [q for q in channel.active_queues if not keys.is_lane(q)]
        names = [(p, channel._q_for_pri(q, p)) for p in steps for q in queues]
        with channel.conn_or_acquire() as client:
            if _promote is None:
                _promote = client.register_script(source("queue_promote"))
            at = int(_promote(keys=[name for _, name in names], args=[f'"tenant": "{tenant}"', tenant, PROMOTE_WALK],
                              client=client))
        return names[at - 1][0] if at > 0 else None
    except Exception as e:  # noqa: BLE001 (the BRPOP that follows meets any real trouble)
        log.debug("could not move %s's next message ahead: %s", tenant, e)
        return None


def _gated(original: Callable[..., Any]) -> Callable[..., Any]:
    def _brpop_start(self: Any, timeout: float | None = None) -> Any:
        global _qos
        gate, _qos = _gate, self.qos
        if gate is None:
            return original(self, timeout)
        n, lane_n, tenants = held(self.qos, gate.lane)
        steps = self.priority_steps
        kept = steps if gate.lane_open(n, lane_n) else [p for p in steps if p != gate.lane]
        shared = [p for p in kept if p != gate.lane]
        taken = gate.reserve_open(n, tenants, lambda: head(self, shared))
        step = promote(self, shared, taken.tenant) if isinstance(taken, Promote) else None
        if step is not None:  # another tenant's job, now at the popping end of its list: that list alone
            kept = [step]
        elif not (taken.otherwise if isinstance(taken, Promote) else taken):
            kept = [IDLE_STEP]  # nothing may be popped now: wait on a list nobody fills
        if kept is steps:
            return original(self, timeout)
        self.priority_steps = kept
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
