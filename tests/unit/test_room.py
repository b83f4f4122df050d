"""Running-slot fair share (worker/jobs/room.py): a full worker hands back a job when interactive
work waits below its tenant's share, and a preempted job is queued again whatever its attempts
(job_requeue.lua). A Redis of its own; the worker's holdings are written as the runtime keeps them."""

from __future__ import annotations

import uuid
from collections import Counter

import redis.asyncio

from inferq.shared import keys
from inferq.shared.schemas import JobMessage, JobRecord, JobRequest, JobStatus
from inferq.shared.store import JobStore
from inferq.worker.jobs.classes import Head, Promote, ServiceClasses, Tenant, Tenants
from inferq.worker.jobs.latency import BatchLimit
from inferq.worker.jobs.room import Room

LANE = 9


class Worker:
    """A worker's holdings (slots + reserve = 4) and what it hands back."""

    def __init__(self, r: redis.asyncio.Redis, model: str, slots: int = 3, reserve: int = 1,
                 tenants: bool = True, newcomers: bool = False) -> None:
        self.classes = ServiceClasses(slots, reserve, LANE, BatchLimit(slots), keep_s=2.0)
        self.given: list[str] = []
        self._holding: list[object] = []
        self._attempts: dict[str, int] = {}
        self.room = Room(r, model, self.classes, lambda: dict(self._attempts), self._give_back, period_s=1.0,
                         tenants=tenants, newcomers=newcomers)

    def hold(self, tenant: str, service_class: str = "interactive", n: int = 1) -> list[str]:
        ids = []
        for _ in range(n):
            msg = JobMessage(id=f"job-{uuid.uuid4().hex}", model="m", created_at=0.0, tenant=tenant,
                             request=JobRequest(prompt="x", service_class=service_class))
            cm = self.classes.holding(msg)
            cm.__enter__()
            self._holding.append(cm)
            self._attempts[msg.id] = 1
            ids.append(msg.id)
        return ids

    async def _give_back(self, job_id: str, attempt: int) -> None:
        assert attempt == 1
        self.given.append(job_id)


async def waiting(r: redis.asyncio.Redis, model: str, tenant: str, n: int = 1, weight: float = 1.0,
                  priority: int = 5) -> None:
    name = keys.queue_lists(model)[priority]
    await r.hset(keys.fair_queued(name), tenant, n)
    await r.hset(keys.fair_state(name), f"w|{tenant}", weight)


def model() -> str:
    return f"room-{uuid.uuid4().hex[:6]}"


async def test_a_worker_with_a_free_slot_hands_nothing_back(r: redis.asyncio.Redis) -> None:
    m = model()
    w = Worker(r, m)
    w.hold("heavy", n=3)
    await waiting(r, m, "light")
    assert await w.room.check() == 0 and w.given == []


async def test_interactive_work_waiting_takes_the_youngest_batch_jobs_slot(r: redis.asyncio.Redis) -> None:
    m = model()
    w = Worker(r, m)
    w.hold("anonymous", "batch", 2)
    young = w.hold("anonymous", "batch")
    w.hold("anonymous")
    await waiting(r, m, "anonymous")
    assert await w.room.check() == 1 and w.given == young


async def test_queued_batch_work_makes_no_room(r: redis.asyncio.Redis) -> None:
    m = model()
    w = Worker(r, m)
    w.hold("anonymous", "batch", 3)
    w.hold("anonymous")
    await waiting(r, m, "anonymous", priority=LANE)
    assert await w.room.check() == 0


async def test_a_tenant_over_its_share_gives_its_youngest_job_to_one_waiting_below_it(r: redis.asyncio.Redis) -> None:
    m = model()
    w = Worker(r, m)
    w.hold("heavy", n=3)
    young = w.hold("heavy")
    await waiting(r, m, "light")
    assert await w.room.check() == 1 and w.given == young
    other = Worker(r, m)  # another full worker: the light tenant's one job needs one room, made already
    other.hold("heavy", n=4)
    assert await other.room.check() == 0 and other.given == []
    assert await r.get(keys.room(m, "light")) == "1"  # a claim of the light tenant's job uses the room up:
    await r.decr(keys.room(m, "light"))  # (as job_claim.lua does) its next job waiting gets one again
    assert await other.room.check() == 1


async def test_without_running_slot_fair_share_only_batch_makes_room(r: redis.asyncio.Redis) -> None:
    m = model()
    w = Worker(r, m, tenants=False)  # INFERQ_RUNNING_FAIR_SHARE off (the default)
    w.hold("heavy", n=4)
    await waiting(r, m, "light")
    assert await w.room.check() == 0 and w.given == [], "a tenant's interactive job keeps its slot"
    other = Worker(r, m, tenants=False)
    other.hold("heavy", n=3)
    young = other.hold("heavy", "batch")
    assert await other.room.check() == 1 and other.given == young, "batch still gives way to interactive"


async def test_a_tenant_that_runs_nothing_here_gets_room_from_the_one_past_its_share(r: redis.asyncio.Redis) -> None:
    """Running-slot fair share off, rooms for newcomers on (the defaults): the heavy tenant holds all
    4 sequences, the light one's first 2 jobs wait; each takes the room of one of heavy's youngest
    jobs (light's share is 2); once light runs a job here, it gets no more rooms."""
    m = model()
    w = Worker(r, m, slots=2, reserve=2, tenants=False, newcomers=True)
    w.hold("heavy", n=2)
    young = w.hold("heavy", n=2)
    await waiting(r, m, "light", n=3)
    assert await w.room.check() == 2 and sorted(w.given) == sorted(young), "up to light's share (2 of 4)"
    heavy = Head(Tenant("heavy"), {"light": 3})  # a paused job of heavy's back at the queue's head
    reserve = w.classes.reserve_open(2, Tenants(Counter(heavy=2), {"heavy": 1.0}), lambda: heavy)
    assert reserve == Promote("light", False), "the freed sequences are kept for light, the head not taken"
    held = Worker(r, m, tenants=False, newcomers=True)
    held.hold("heavy", n=3)
    held.hold("light")
    await waiting(r, m, "light", n=5)
    assert await held.room.check() == 0 and held.given == [], "light runs a job here: the tenant reserve's turn"


async def test_a_newcomers_job_popped_and_not_yet_started_counts_as_running(r: redis.asyncio.Redis) -> None:
    """Fair share's queued count falls at the claim: a job delivered to the worker, its thread not yet
    started, still counts as queued; the worker must not hand back a job for it."""
    m = model()
    w = Worker(r, m, tenants=False, newcomers=True)
    w.hold("heavy", n=4)
    await waiting(r, m, "light", n=1)
    w.classes.delivered_tenants = lambda: Counter({"heavy": 4, "light": 1})
    assert await w.room.check() == 0 and w.given == []
    w.classes.delivered_tenants = lambda: Counter({"heavy": 4})
    assert await w.room.check() == 1


async def test_a_claim_uses_up_a_room_made_for_its_tenant(r: redis.asyncio.Redis) -> None:
    store = JobStore(r, 600)
    rec = JobRecord(id=f"job-{uuid.uuid4().hex}", model="m", request=JobRequest(prompt="x"), tenant="light")
    await store.create(rec)
    room = keys.room("m", "light")
    await r.set(room, 2)
    assert (await store.claim(rec.id, "w", queue_list=keys.queue_lists("m")[5], room=room)).attempt == 1
    assert await r.get(room) == "1"


async def test_a_tenant_at_its_share_waits_for_a_slot(r: redis.asyncio.Redis) -> None:
    """Weights 3 : 1 of 4 slots: the light tenant runs 1, its share; nothing is handed back for it."""
    m = model()
    w = Worker(r, m)
    w.hold("heavy", n=3)
    w.hold("light")
    await waiting(r, m, "heavy", weight=3.0)
    await waiting(r, m, "light", weight=1.0)
    assert await w.room.check() == 0
    equal = Worker(r, m)  # equal weights: 2 each, and the light tenant runs 1
    equal.hold("heavy", n=3)
    equal.hold("light")
    await waiting(r, m, "heavy", weight=1.0)
    await waiting(r, m, "light", weight=1.0)
    assert await equal.room.check() == 1


async def test_a_preempted_job_is_queued_again_whatever_its_attempts(r: redis.asyncio.Redis) -> None:
    store = JobStore(r, 600)
    rec = JobRecord(id=f"job-{uuid.uuid4().hex}", model="m", request=JobRequest(prompt="x"))
    await store.create(rec)
    for attempt in (1, 2, 3):
        claim = await store.claim(rec.id, "w")
        assert claim is not None and claim.attempt == attempt
        assert await store.requeue(rec.id, "w", attempt, "preempted", max_attempts=2) == "requeued"
    got = await store.get(rec.id)
    assert got is not None and got.status is JobStatus.queued
    assert await r.hget(keys.job(rec.id), "preemptions") == "3"
    await store.claim(rec.id, "w")
    assert await store.requeue(rec.id, "w", 4, "worker_lost", max_attempts=2) == "requeued"  # 1 of 2 counted
    await store.claim(rec.id, "w")
    assert await store.requeue(rec.id, "w", 5, "worker_lost", max_attempts=2) == "failed"


async def test_a_job_delivered_and_not_yet_started_holds_its_slot(r: redis.asyncio.Redis) -> None:
    """The consumer took a job whose thread has not started it: the worker is full all the same."""
    m = model()
    w = Worker(r, m)
    w.hold("heavy", n=3)
    await waiting(r, m, "light")
    assert await w.room.check() == 0  # 3 of 4 held: a free slot
    w.classes.delivered = lambda: 4  # the fourth delivered
    assert await w.room.check() == 1 and len(w.given) == 1


async def test_each_job_queued_below_the_share_gets_a_room_in_one_check(r: redis.asyncio.Redis) -> None:
    """Equal weights, 4 slots: the light tenant with 3 queued and none running gets 2 (its share)."""
    m = model()
    w = Worker(r, m)
    w.hold("heavy", n=4)
    await waiting(r, m, "light", n=3)
    assert await w.room.check() == 2 and len(w.given) == 2


async def test_a_job_claimed_while_the_check_runs_gets_no_second_room(r: redis.asyncio.Redis) -> None:
    """The check read one interactive job queued; before it took a room, that job was claimed (its
    room, made by an earlier check, used up and its queued count gone). A room taken on the count read
    before would hand back a second job for a job that no longer waits: the take counts the queue
    itself, in the same step."""
    m = model()
    w = Worker(r, m)
    w.hold("anonymous", "batch", 2)
    w.hold("anonymous", n=2)
    await waiting(r, m, "anonymous", n=0)  # claimed: nothing queued, no room in flight

    async def read_before_the_claim() -> dict[str, int]:
        return {"anonymous": 1}

    w.room._waiting = read_before_the_claim  # type: ignore[method-assign]
    assert await w.room.check() == 0 and w.given == []
    await waiting(r, m, "anonymous", n=1)  # still queued: it gets its room
    assert await w.room.check() == 1 and len(w.given) == 1
