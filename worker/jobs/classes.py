"""Service classes on a worker: how much batch work it takes, and what it runs of each class.

A worker has ``slots`` job slots that work of any class fills (INFERQ_MAX_NUM_SEQS) and a
``reserve`` more that only interactive work takes (INFERQ_INTERACTIVE_RESERVE); its engine runs
``slots + reserve`` sequences. Batch work waits on its own list, the batch lane (the list of
INFERQ_BATCH_PRIORITY), which the worker pops only while it holds fewer than ``slots`` jobs and
fewer lane jobs than its batch limit (worker/kombu_gate.py). So:

- an interactive job always finds a free slot while interactive work holds fewer than ``reserve``
  beyond what batch left: it starts at once, in the engine's next step, whatever batch runs;
- batch grows into whatever interactive work leaves of the ``slots``, and gives way as its jobs
  end (a batch job that ends is not replaced while the worker holds ``slots`` jobs);
- with latency targets set, the batch limit follows them: every heartbeat, a p99 of interactive
  time to first token or time between tokens above its target halves it, one under every target
  adds one job, up to ``slots`` (:class:`BatchLimit`).

The engine orders its own waiting requests by priority, batch last, and when its KV cache runs
short vLLM's priority scheduler preempts batch first (it recomputes them later: a request
preempted inside the engine stays the worker's, and its output continues where it stopped).
"""

from __future__ import annotations

import math
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from inferq.shared.fairshare import ANONYMOUS
from inferq.shared.schemas import ClassesInfo, JobMessage
from inferq.shared.settings import Settings
from inferq.worker.jobs.latency import BatchLimit


@dataclass(frozen=True)
class Tenant:
    """Whose job a message is, and that tenant's weight, as its headers say (shared/celery_app.py)."""

    name: str
    weight: float = 1.0


@dataclass
class Tenants:
    """The interactive messages a worker holds, by tenant, and each tenant's weight."""

    count: Counter[str] = field(default_factory=Counter)
    weight: dict[str, float] = field(default_factory=dict)
    peak: dict[str, int] = field(default_factory=dict)  # the most each held at once lately (the gate's memory)

    def add(self, tenant: Tenant | None) -> None:
        """Count one message of ``tenant`` (None: a message that names none, counted as the anonymous
        tenant, as the worker counts its job once it holds it)."""
        name = tenant.name if tenant is not None else ANONYMOUS
        self.count[name] += 1
        self.weight[name] = tenant.weight if tenant is not None else 1.0


@dataclass(frozen=True)
class Seen:
    """What the tenant reserve remembers of a tenant: when it last saw one of its jobs held, its
    weight, and the most it held at once since ``peak_at``."""

    at: float
    weight: float
    peak: int
    peak_at: float


@dataclass(frozen=True)
class Head:
    """The message a ``BRPOP`` would return now: its tenant, and each tenant's jobs queued on the
    model's lists (fair share's counts)."""

    tenant: Tenant
    queued: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class Promote:
    """The gate's answer when the queue's head is a tenant's past its share while another tenant below
    its share has jobs queued behind it: move that tenant's next job to the popping end and take it
    (worker/kombu_gate.py); ``otherwise``, what to do with the head if none of its jobs is found."""

    tenant: str
    otherwise: bool


@dataclass(frozen=True)
class Held:
    """A job the worker holds: its class and tenant, and since when (monotonic)."""

    job_id: str
    service_class: str
    tenant: str
    since: float


class ServiceClasses:
    """The worker's gate (worker/kombu_gate.py) and what it runs, by class and tenant."""

    def __init__(self, slots: int, reserve: int, lane: int, limit: BatchLimit, tenant_reserve: bool = True,
                 keep_s: float = 0.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.slots, self.reserve, self.lane, self.limit = slots, reserve, lane, limit
        self.tenant_reserve, self.keep_s, self.clock = tenant_reserve, keep_s, clock
        self._seen: dict[str, Seen] = {}  # tenant -> when the gate last saw it held, and how many at most
        self._running: Counter[tuple[str, str]] = Counter()  # (class, tenant) -> jobs held
        self._held: dict[str, Held] = {}  # job id -> what it is, since when (the latest taking of it)
        #: messages the consumer holds, counted from their delivery (worker/kombu_gate.py: set by the
        #: entry); a job's thread counts it in :meth:`holding` a moment later
        self.delivered: Callable[[], int] = lambda: 0
        self.delivered_tenants: Callable[[], Counter[str]] = Counter  # the interactive ones, by tenant
        self._lock = threading.Lock()

    def lane_open(self, held: int, lane_held: int) -> bool:
        """Batch work may grow: the worker holds fewer than ``slots`` jobs and fewer lane jobs than its limit."""
        return held < self.slots and lane_held < self.limit.value

    def reserve_open(self, held: int, tenants: Tenants, peek: Callable[[], Head | None]) -> bool | Promote:
        """The next interactive job may be taken: always while the worker holds fewer than ``slots``
        jobs; beyond (with the tenant reserve), if one more job of its tenant stays within that
        tenant's share of ``slots + reserve`` (by weight, among the tenants it holds and this one).
        Past it, the job of another tenant below its share that waits in the queue is taken instead
        (:class:`Promote`: fair share's order may put it behind the head, since that order counts
        tokens served, not sequences held; should none of its jobs be found there, the head is taken
        only if that tenant's sequences stay kept as well: a tenant's queued count falls at the
        claim, a moment after the pop, so its job just taken, by this worker or another, still
        counts as waiting until then); with none waiting, the head is taken if the sequences
        left free would still keep one (see ``keep_s``) for each other tenant here that runs below its
        share with nothing queued (its next job, which nothing else would wait for).
        ``peek``: the message a ``BRPOP`` would return now. With ``keep_s``, a tenant held here
        within the last ``keep_s`` counts as held (with no job), and a tenant is kept as many free
        sequences as it held at once within that time (up to its share): the jobs its clients send as
        their last ones end still find their sequences."""
        present = self._present(tenants) if self.tenant_reserve else tenants
        if held < self.slots or not self.tenant_reserve or len(present.weight) < 2:
            return True  # (beside one tenant's jobs, any job is within its tenant's share: no read)
        if (head := peek()) is None:
            return True
        me = head.tenant.name
        weight = {**present.weight, me: head.tenant.weight}
        whole = sum(weight.values())
        share = {t: (self.slots + self.reserve) * w / whole for t, w in weight.items()}
        if present.count[me] + 1 <= share[me] + 1e-9:
            return True
        free = self.slots + self.reserve - held
        kept = {t: max(0, min(max(present.count[t] + 1, present.peak.get(t, 0)), math.floor(share[t] + 1e-9))
                       - present.count[t]) for t in present.weight if t != me}
        waiting = [t for t in kept if head.queued.get(t, 0) > 0 and present.count[t] + 1 <= share[t] + 1e-9]
        if waiting:  # the one furthest below its share first; its sequences kept should none of its jobs be found
            return Promote(min(waiting, key=lambda t: (present.count[t] / weight[t], t)), free > sum(kept.values()))
        return free > sum(n for t, n in kept.items() if head.queued.get(t, 0) <= 0)

    def expect(self, tenant: str, weight: float, n: int) -> None:
        """``n`` jobs of ``tenant`` are on their way here (the room made for a newcomer: worker/jobs/room.py):
        the reserve keeps their sequences for ``keep_s``, as for a tenant that held ``n`` jobs just now."""
        if self.keep_s:
            with self._lock:
                self._note(tenant, weight, n, self.clock())

    def _present(self, tenants: Tenants) -> Tenants:
        """``tenants``, those held here (or expected: :meth:`expect`) within the last ``keep_s`` (with no
        job), and the most jobs each held at once within it (remembered here, on the consumer's thread)."""
        if not self.keep_s:
            return tenants
        with self._lock:
            return self._remember(tenants)

    def _note(self, tenant: str, weight: float, n: int, now: float) -> None:
        """``tenant`` holds (or is about to hold) ``n`` jobs now; a higher peak of the last ``keep_s`` stays."""
        seen = self._seen.get(tenant)
        if seen is not None and now - seen.peak_at <= self.keep_s and seen.peak > n:  # a recent, higher peak
            self._seen[tenant] = Seen(now, weight, seen.peak, seen.peak_at)
        else:
            self._seen[tenant] = Seen(now, weight, n, now)

    def _remember(self, tenants: Tenants) -> Tenants:
        now = self.clock()
        for t, w in tenants.weight.items():
            self._note(t, w, tenants.count[t], now)
        for t in [t for t, seen in self._seen.items() if now - seen.at > self.keep_s]:
            del self._seen[t]
        return Tenants(Counter(tenants.count), {**{t: s.weight for t, s in self._seen.items()}, **tenants.weight},
                       {t: s.peak if now - s.peak_at <= self.keep_s else 1 for t, s in self._seen.items()})

    @contextmanager
    def holding(self, msg: JobMessage) -> Iterator[None]:
        """Count the job as held (by class and tenant) while the block runs: from the moment it is
        taken until it ended or was passed on."""
        held = Held(msg.id, msg.request.service_class, msg.tenant or ANONYMOUS, time.monotonic())
        kind = (held.service_class, held.tenant)
        with self._lock:
            self._running[kind] += 1
            self._held[msg.id] = held
        try:
            yield
        finally:
            with self._lock:
                self._running[kind] -= 1
                if self._running[kind] <= 0:
                    del self._running[kind]
                if self._held.get(msg.id) is held:
                    del self._held[msg.id]

    def held(self) -> list[Held]:
        """The jobs held now."""
        with self._lock:
            return list(self._held.values())

    def running(self) -> dict[str, dict[str, int]]:
        """Jobs held now: class -> tenant -> count."""
        out: dict[str, dict[str, int]] = {}
        with self._lock:
            for (cls, tenant), n in self._running.items():
                out.setdefault(cls, {})[tenant] = n
        return out

    def beat(self) -> ClassesInfo:
        """Once a heartbeat: move the batch limit a step (latency targets) and say what is held."""
        self.limit.adjust()
        ttft, itl = self.limit.last
        return ClassesInfo(slots=self.slots, reserve=self.reserve, batch_limit=self.limit.value,
                           running=self.running(),
                           ttft_p99_ms=round(ttft * 1000, 1) if self.limit.ttft_s else None,
                           itl_p99_ms=round(itl * 1000, 1) if self.limit.itl_s else None)

    @classmethod
    def of(cls, settings: Settings, slots: int, frontends: int) -> ServiceClasses | None:
        """A worker's (one frontend's: its share of slots and reserve), or None with classes off."""
        if not settings.service_classes:
            return None
        reserve = -(-settings.reserve // frontends)  # ceil, as the slots are split
        limit = BatchLimit(slots, settings.interactive_ttft_p99_ms, settings.interactive_itl_p99_ms)
        return cls(slots, reserve, settings.batch_priority, limit, settings.tenant_reserve,
                   settings.tenant_reserve_keep_s)
