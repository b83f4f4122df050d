"""The tenant reserve (worker/jobs/classes.py, worker/kombu_gate.py): once a worker holds its
``slots`` jobs, its interactive reserve takes the queue's next job only for a tenant below its share
of the worker, or while the tenants at or above their share hold fewer than ``slots``. The rule as a
table; then the gate on real Redis, reading the head of the queue's lists as kombu's Redis channel
would pop them."""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest

from inferq.shared import keys
from inferq.shared.celery_app import job_message, make_celery
from inferq.shared.schemas import JobMessage, JobRequest
from inferq.shared.settings import Settings
from inferq.worker import kombu_gate
from inferq.worker.jobs.classes import Head, Promote, ServiceClasses, Tenant, Tenants
from inferq.worker.jobs.latency import BatchLimit

LANE = 9


def tenants(**held: int | tuple[int, float]) -> Tenants:
    """Interactive jobs held, by tenant: a count, or (count, weight)."""
    out = Tenants()
    for name, n in held.items():
        count, weight = n if isinstance(n, tuple) else (n, 1.0)
        for _ in range(count):
            out.add(Tenant(name, weight))
    return out


def gate(slots: int = 8, reserve: int = 6, on: bool = True) -> ServiceClasses:
    return ServiceClasses(slots, reserve, LANE, BatchLimit(slots), tenant_reserve=on)


@pytest.mark.parametrize(("held", "head", "queued", "taken"), [
    # a tenant alone fills the reserve too: its share is every sequence (14)
    ({"heavy": 13}, Tenant("heavy"), {}, True),
    # beside a tenant below its share (7) with nothing queued, one sequence stays free for that one's next job ...
    ({"heavy": 8, "light": 4}, Tenant("heavy"), {}, True),  # 2 free
    ({"heavy": 9, "light": 4}, Tenant("heavy"), {}, False),  # 1 free: kept
    # ... and when its jobs wait in the queue behind this one, its next one is taken instead
    ({"heavy": 9, "light": 4}, Tenant("heavy"), {"light": 2}, Promote("light", False)),
    ({"heavy": 10, "light": 2}, Tenant("heavy"), {"light": 1, "heavy": 5}, Promote("light", True)),
    # (should none of light's jobs be found, the head is taken only if light's sequences stay kept:
    # its queued count falls at the claim, so its job just popped, held here, still counts as queued)
    ({"heavy": 9, "light": 3}, Tenant("heavy"), {"light": 1}, Promote("light", True)),  # 2 free, 1 kept
    ({"heavy": 9, "light": 4}, Tenant("heavy"), {"light": 1}, Promote("light", False)),  # 1 free, 1 kept
    ({"heavy": 9, "light": 4}, Tenant("heavy"), {"heavy": 5}, False),
    # a tenant at its share with jobs queued is not taken ahead of the head
    ({"heavy": 6, "light": 7}, Tenant("heavy"), {"light": 3}, True),
    # the head's own tenant within its share: taken
    ({"heavy": 6, "light": 7}, Tenant("heavy"), {}, True),
    ({"heavy": 7, "light": 6}, Tenant("light"), {}, True),
    # two tenants below their share (14 / 3 each) keep a sequence each
    ({"a": 6, "b": 3, "c": 3}, Tenant("a"), {}, False),  # 2 free, 2 kept
    ({"a": 7, "b": 3, "c": 2}, Tenant("a"), {"b": 1, "c": 1}, Promote("c", False)),  # the one furthest below first
    ({"a": 6, "b": 3, "c": 2}, Tenant("a"), {"b": 1, "c": 1}, Promote("c", True)),  # 3 free, 2 kept
    ({"a": 7, "b": 3, "c": 3}, Tenant("a"), {"b": 1}, Promote("b", False)),  # 1 free, kept for c: b's job takes it
    ({"a": 5, "b": 3, "c": 3}, Tenant("a"), {}, True),  # 3 free
    # weights: 2 to 1 gives the heavier tenant 2/3 of 14 (9.3)
    ({"a": (10, 2.0), "b": 3}, Tenant("a", 2.0), {}, False),  # 1 free, kept for b (share 4.7)
    ({"a": (8, 2.0), "b": 5}, Tenant("a", 2.0), {}, True),  # within a's share
    ({"a": 4, "b": (9, 2.0)}, Tenant("a"), {}, True),  # a passes its share, but b is at its own: nothing kept
    ({"a": 5, "b": (8, 2.0)}, Tenant("a"), {}, False),  # b below its share: the one free sequence kept
])
def test_the_reserve_keeps_a_sequence_for_tenants_below_their_share(held: dict[str, Any], head: Tenant,
                                                                     queued: dict[str, int],
                                                                     taken: bool | Promote) -> None:
    t = tenants(**held)
    assert gate().reserve_open(sum(t.count.values()), t, lambda: Head(head, queued)) == taken


def test_below_the_slots_beside_one_tenant_or_off_or_with_no_tenant_at_the_head_every_job_is_taken() -> None:
    def unread() -> Head | None:
        raise AssertionError("the queue's head was read")

    assert gate().reserve_open(7, tenants(heavy=7), unread)
    assert gate().reserve_open(13, tenants(heavy=13), unread)  # one tenant held: any job is within its share
    assert gate(on=False).reserve_open(13, tenants(heavy=9, light=4), unread)
    assert gate().reserve_open(13, tenants(heavy=9, light=4), lambda: None)


def test_a_tenant_held_moments_ago_keeps_its_sequences_for_keep_s() -> None:
    """The light tenant held 4 jobs (its 4 clients); they just ended, and its clients send the next
    ones as they read the ends: for ``keep_s`` the worker still keeps it 4 sequences, then the
    backlog may take them."""
    now = [100.0]
    g = ServiceClasses(8, 6, LANE, BatchLimit(8), tenant_reserve=True, keep_s=2.0, clock=lambda: now[0])
    heavy = Head(Tenant("heavy"), {})
    assert not g.reserve_open(13, tenants(heavy=9, light=4), lambda: heavy)  # 1 free: kept for light
    now[0] += 1.5
    assert not g.reserve_open(13, tenants(heavy=13), lambda: heavy), "light ended 1.5 s ago: still kept"
    assert not g.reserve_open(10, tenants(heavy=10), lambda: heavy), "4 free, 4 kept"
    assert g.reserve_open(9, tenants(heavy=9), lambda: heavy), "5 free: one more is taken"
    now[0] += 1.0
    assert g.reserve_open(13, tenants(heavy=13), lambda: heavy), "2.5 s: light is gone, heavy takes it"


def test_a_tenants_peak_is_forgotten_after_keep_s() -> None:
    now = [100.0]
    g = ServiceClasses(8, 6, LANE, BatchLimit(8), tenant_reserve=True, keep_s=2.0, clock=lambda: now[0])
    heavy = Head(Tenant("heavy"), {})
    assert g.reserve_open(10, tenants(heavy=6, light=4), lambda: heavy)
    now[0] += 1.0
    assert not g.reserve_open(11, tenants(heavy=10, light=1), lambda: heavy), "3 free, 3 kept (4 held 1 s ago)"
    now[0] += 1.5
    assert g.reserve_open(11, tenants(heavy=10, light=1), lambda: heavy), "2.5 s: one kept for light's next"
    assert not g.reserve_open(13, tenants(heavy=12, light=1), lambda: heavy)


def test_without_keep_s_a_tenant_counts_only_while_held() -> None:
    g = ServiceClasses(8, 6, LANE, BatchLimit(8), tenant_reserve=True, keep_s=0.0, clock=lambda: 100.0)
    heavy = Head(Tenant("heavy"), {})
    assert not g.reserve_open(13, tenants(heavy=9, light=4), lambda: heavy)
    assert g.reserve_open(13, tenants(heavy=13), lambda: heavy)


# --- the gate on real Redis -------------------------------------------------------------------


def message(tenant: str | None, priority: int = 0, weight: float | None = None, queue: str | None = None,
            settings: Settings | None = None) -> tuple[str, str]:
    msg = JobMessage(id=f"job-{time.monotonic_ns()}", model="m", created_at=time.time(), tenant=tenant,
                     tenant_weight=weight, request=JobRequest(prompt="hello", max_tokens=4, priority=priority))
    return job_message(make_celery(settings or Settings()), msg, queue)


@pytest.fixture
def channel(own_redis: str) -> Iterator[Any]:
    """A kombu Redis channel of a worker that consumes the model's queue and its own lane."""
    app = make_celery(Settings(redis_url=own_redis))
    with app.connection_for_read() as conn:
        ch = conn.default_channel
        ch._active_queues[:] = [keys.queue("m"), keys.lane("m", "w1")]
        yield ch


async def test_the_head_is_the_message_the_brpop_would_return(channel: Any, r: Any) -> None:
    steps = list(range(LANE))
    assert kombu_gate.head(channel, steps) is None  # nothing queued
    for tenant, priority in (("light", 5), ("heavy", 0), ("heavy", 0)):
        await r.lpush(*message(tenant, priority, weight=2.0 if tenant == "heavy" else None))
    assert kombu_gate.head(channel, steps) == Head(Tenant("heavy", 2.0))  # priority 0 first
    await r.rpush(keys.queue("m"), message("light")[1])  # the tail of the list: popped next
    assert kombu_gate.head(channel, steps) == Head(Tenant("light", 1.0))
    await r.hset(keys.fair_queued(keys.queue_lists("m")[0]), mapping={"heavy": 2, "light": 1})
    await r.hset(keys.fair_queued(keys.queue_lists("m")[5]), mapping={"light": 1})
    assert kombu_gate.head(channel, steps) == Head(Tenant("light", 1.0), {"heavy": 2, "light": 2})
    await r.lpush(*message("heavy", 0, queue=keys.lane("m", "w1")))  # a job passed to this worker
    assert kombu_gate.head(channel, steps) is None  # is always taken
    await r.delete(*keys.priority_lists(keys.lane("m", "w1")))
    await r.lpush(*message(None))
    await r.rpush(keys.queue("m"), message(None)[1])
    assert kombu_gate.head(channel, steps) is None  # a message that names no tenant


def heavy_9_light_4(channel: Any, priority: int) -> tuple[Any, list[tuple[list[int], float | None]], Any]:
    """A consumer's channel holding 9 of heavy's messages and 4 of light's (of ``priority``); the BRPOPs
    its gated start would send (steps, timeout), and that start."""
    held_msgs = OrderedDict((f"t{i}", SimpleNamespace(properties={"priority": priority}, headers={"tenant": t}))
                            for i, t in enumerate(["heavy"] * 9 + ["light"] * 4))
    fake = SimpleNamespace(qos=SimpleNamespace(_delivered=held_msgs, _dirty=set()), priority_steps=list(range(10)),
                           active_queues=channel.active_queues, _q_for_pri=channel._q_for_pri,
                           conn_or_acquire=channel.conn_or_acquire)
    seen: list[tuple[list[int], float | None]] = []
    start = kombu_gate._gated(lambda self, timeout=None: seen.append((list(self.priority_steps), timeout)))
    return fake, seen, start


async def test_a_worker_waits_on_no_list_for_the_sequence_it_keeps(channel: Any, r: Any) -> None:
    """The BRPOP the consumer starts with one sequence free, kept for a tenant below its share with
    nothing queued: the idle list (for the short timeout) while the head is another tenant's, past
    its share; every list once the head is the tenant the sequence is kept for."""
    fake, seen, start = heavy_9_light_4(channel, priority=0)
    kombu_gate.use(gate())
    try:
        await r.lpush(*message("heavy"))
        start(fake)
        await r.rpush(keys.queue("m"), message("light")[1])
        start(fake)
    finally:
        kombu_gate.use(None)
    assert seen == [([kombu_gate.IDLE_STEP], kombu_gate.GATED_TIMEOUT_S), (list(range(9)), kombu_gate.GATED_TIMEOUT_S)]
    assert fake.priority_steps == list(range(10))


def test_the_idle_list_is_one_nobody_fills() -> None:
    assert kombu_gate.IDLE_STEP not in keys.PRIORITIES


async def test_a_promotion_moves_the_tenants_next_message_to_the_popping_end(channel: Any, r: Any) -> None:
    """Fair share's order put light's job behind heavy's: the promotion moves light's next message
    (the one nearest the popping end) to that end of its list, where the next pop takes it; the
    list keeps every message."""
    lst = keys.queue_lists("m")[5]
    light = [message("light", 5)[1] for _ in range(2)]
    heavy = [message("heavy", 5)[1] for _ in range(3)]
    await r.rpush(lst, light[1], heavy[2], light[0], heavy[1], heavy[0])  # popped from the right: heavy[0] first
    steps = list(range(LANE))
    assert kombu_gate.head(channel, steps) == Head(Tenant("heavy", 1.0))
    assert kombu_gate.promote(channel, steps, "light") == 5
    assert kombu_gate.head(channel, steps) == Head(Tenant("light", 1.0))
    assert await r.lrange(lst, 0, -1) == [light[1], heavy[2], heavy[1], heavy[0], light[0]]
    assert kombu_gate.promote(channel, steps, "light") == 5  # already at the end: nothing moves
    assert await r.rpop(lst) == light[0]
    assert kombu_gate.promote(channel, steps, "nobody") is None
    assert kombu_gate.promote(channel, [0, 1], "light") is None  # not on those steps
    await r.lpush(lst, *[message("heavy", 5)[1] for _ in range(kombu_gate.PROMOTE_WALK)])
    await r.rpush(lst, *[message("heavy", 5)[1] for _ in range(kombu_gate.PROMOTE_WALK)])
    assert kombu_gate.promote(channel, steps, "light") is None, "light's message is past the walk"
    assert await r.llen(lst) == 4 + 2 * kombu_gate.PROMOTE_WALK


async def test_the_gate_pops_the_promoted_message_on_its_own_step(channel: Any, r: Any) -> None:
    """Heavy holds 9 of 14 sequences, past its share, and its message is the head; light (4 held,
    below its share) has a job queued behind it: the BRPOP the consumer starts waits on that job's
    step alone, with light's message at its end; with it gone, the one free sequence is kept for light."""
    fake, seen, start = heavy_9_light_4(channel, priority=5)
    lst = keys.queue_lists("m")[5]
    light, heavy = message("light", 5)[1], message("heavy", 5)[1]
    await r.rpush(lst, light, heavy)
    await r.hset(keys.fair_queued(lst), mapping={"heavy": 1, "light": 1})
    kombu_gate.use(gate())
    try:
        start(fake)
        assert await r.lrange(lst, 0, -1) == [heavy, light]
        await r.rpop(lst)  # popped (here: by another worker)
        await r.hset(keys.fair_queued(lst), mapping={"light": 0})
        start(fake)
    finally:
        kombu_gate.use(None)
    assert seen == [([5], kombu_gate.GATED_TIMEOUT_S), ([kombu_gate.IDLE_STEP], kombu_gate.GATED_TIMEOUT_S)]


def test_room_expected_for_a_tenant_keeps_its_recent_higher_peak() -> None:
    """Jobs expected for a tenant (the room made for a newcomer) count as its peak, but do not lower
    a higher peak it held within ``keep_s``."""
    now = [100.0]
    g = ServiceClasses(8, 6, LANE, BatchLimit(8), tenant_reserve=True, keep_s=2.0, clock=lambda: now[0])
    heavy = Head(Tenant("heavy"), {})
    assert not g.reserve_open(13, tenants(heavy=9, light=4), lambda: heavy)  # light's peak: 4
    now[0] += 0.5
    g.expect("light", 1.0, 1)
    assert not g.reserve_open(10, tenants(heavy=10), lambda: heavy), "4 free, still 4 kept for light"
    now[0] += 2.0  # the peak of 4 is 2.5 s old: forgotten, the 2 expected now count
    g.expect("light", 1.0, 2)
    assert not g.reserve_open(12, tenants(heavy=12), lambda: heavy), "2 free, 2 kept (2 expected)"
    assert g.reserve_open(11, tenants(heavy=11), lambda: heavy), "3 free: one more is taken"
