"""Service classes on a worker (worker/jobs/classes.py, worker/kombu_gate.py): which of its queue's
lists the consumer pops, and the batch limit the latency targets move. No engine, no Redis: the
gate is given the messages a kombu channel holds, as kombu keeps them."""

from __future__ import annotations

from collections import Counter, OrderedDict
from types import SimpleNamespace
from typing import Any

import pytest

from inferq.shared.schemas import JobMessage, JobRequest
from inferq.shared.settings import Settings
from inferq.worker import kombu_gate
from inferq.worker.jobs.classes import ServiceClasses, Tenant, Tenants
from inferq.worker.jobs.latency import BatchLimit, Watch, p99

LANE = 9


def channel(*priorities: int, acked: int = 0) -> Any:
    """A kombu channel as the gate reads it: the messages it holds (the first ``acked`` acked already)."""
    delivered = OrderedDict((f"tag{i}", SimpleNamespace(properties={"priority": p})) for i, p in enumerate(priorities))
    dirty = {f"tag{i}" for i in range(acked)}
    return SimpleNamespace(qos=SimpleNamespace(_delivered=delivered, _dirty=dirty), priority_steps=list(range(10)))


def popped(ch: Any, classes: ServiceClasses | None) -> tuple[list[int], float | None]:
    """The lists and timeout the ``BRPOP`` the consumer starts now would wait on."""
    seen: list[tuple[list[int], float | None]] = []
    start = kombu_gate._gated(lambda self, timeout=None: seen.append((list(self.priority_steps), timeout)))
    kombu_gate.use(classes)
    try:
        start(ch)
    finally:
        kombu_gate.use(None)
    assert ch.priority_steps == list(range(10))  # the channel is left as it was
    return seen[0]


def classes(slots: int = 4, reserve: int = 2, limit: int | None = None) -> ServiceClasses:
    c = ServiceClasses(slots, reserve, LANE, BatchLimit(slots))
    if limit is not None:
        c.limit.value = limit
    return c


def test_without_a_gate_every_list_is_popped() -> None:
    assert popped(channel(LANE, LANE, LANE, LANE), None) == (list(range(10)), None)


def test_the_batch_lane_is_popped_while_batch_work_may_grow() -> None:
    assert popped(channel(5, LANE), classes()) == (list(range(10)), None)


def test_a_full_worker_pops_interactive_work_only_into_its_reserve() -> None:
    """4 slots all held (batch and interactive alike): the reserve takes interactive work only."""
    steps, timeout = popped(channel(LANE, LANE, 5, 5), classes())
    assert steps == list(range(9)) and timeout == kombu_gate.GATED_TIMEOUT_S


def test_batch_work_stops_at_its_limit_with_slots_free() -> None:
    steps, _ = popped(channel(LANE, LANE), classes(limit=2))
    assert LANE not in steps
    assert LANE in popped(channel(LANE, LANE, 5), classes(limit=3))[0]


def test_acked_messages_no_longer_count() -> None:
    assert LANE in popped(channel(LANE, LANE, LANE, LANE, acked=1), classes())[0]


def test_the_limit_is_halved_over_a_target_and_grows_back_by_one_under_it() -> None:
    limit = BatchLimit(8, ttft_ms=100)
    limit.first_token(0.5)
    assert limit.adjust() == 4
    limit.first_token(0.5)
    assert limit.adjust() == 2
    for want in (3, 4, 5):  # no sample over the target: one more each step
        limit.first_token(0.05)
        assert limit.adjust() == want
    for _ in range(10):
        limit.adjust()
    assert limit.value == 8  # never above the slots


def test_between_token_times_count_against_their_own_target() -> None:
    limit = BatchLimit(8, itl_ms=20)
    limit.gaps([0.01] * 98 + [0.05] * 2)  # p99 over 20 ms
    assert limit.adjust() == 4
    limit.gaps([0.01] * 200)
    assert limit.adjust() == 5


def test_without_targets_the_limit_is_the_slots() -> None:
    limit = BatchLimit(8)
    limit.first_token(9.0)
    assert limit.adjust() == 8


def test_a_watch_feeds_its_limit_and_an_unwatched_job_feeds_nothing() -> None:
    limit = BatchLimit(8, ttft_ms=10, itl_ms=10)
    w = Watch(limit, created_at=0.0)  # queued at the epoch: its first token is very late
    for _ in range(3):
        w.output()
    w.flush()
    assert limit.adjust() == 4 and len(limit._itl) == 0
    silent = Watch(None, created_at=0.0)
    silent.output()
    silent.flush()


def test_p99() -> None:
    assert p99([]) == 0.0 and p99([float(i) for i in range(100)]) == 99.0


def test_held_jobs_are_counted_by_class_and_tenant() -> None:
    c = classes()
    batch = JobMessage(id="job-1", model="m", created_at=0.0, tenant="t1",
                       request=JobRequest(prompt="x", service_class="batch"))
    chat = JobMessage(id="job-2", model="m", created_at=0.0, request=JobRequest(prompt="x"))
    with c.holding(batch), c.holding(chat):
        assert c.running() == {"batch": {"t1": 1}, "interactive": {"anonymous": 1}}
        info = c.beat()
        assert (info.slots, info.reserve, info.batch_limit) == (4, 2, 4)
    with pytest.raises(RuntimeError), c.holding(batch):
        raise RuntimeError
    assert c.running() == {}


def test_a_worker_of_a_group_gets_its_share_of_the_reserve() -> None:
    s = Settings(max_num_seqs=8, interactive_reserve=3)
    c = ServiceClasses.of(s, slots=4, frontends=2)
    assert c is not None and (c.slots, c.reserve, c.lane) == (4, 2, s.batch_priority)
    assert ServiceClasses.of(Settings(service_classes=False), 4, 1) is None


def test_the_gate_counts_what_the_consumer_holds_from_its_delivery() -> None:
    ch = channel(5, LANE, LANE, acked=1)
    popped(ch, classes())
    try:
        assert kombu_gate.delivered() == 2
    finally:
        kombu_gate._qos = None
    assert kombu_gate.delivered() == 0


def test_the_gate_counts_the_interactive_messages_held_by_tenant() -> None:
    """A newcomer's job popped, its thread not started yet, is seen as its tenant's (worker/jobs/room.py)."""
    ch = channel(5, 5, 5, LANE, acked=1)
    heads = [{"tenant": "light"}, {"tenant": "light"}, None, {"tenant": "light"}]
    for m, h in zip(ch.qos._delivered.values(), heads, strict=True):
        m.headers = h
    kombu_gate.use(classes())
    kombu_gate._qos = ch.qos
    try:
        assert kombu_gate.delivered_tenants() == Counter({"light": 1, "anonymous": 1})  # (acked, lane: not)
    finally:
        kombu_gate._qos = None
        kombu_gate.use(None)
    assert kombu_gate.delivered_tenants() == Counter()


def test_a_message_that_names_no_tenant_is_the_anonymous_tenants_as_its_held_job_is() -> None:
    """The gate's count and the worker's count of held jobs (Held.tenant) name the same tenant."""
    t = Tenants()
    t.add(None)
    t.add(Tenant("anonymous", 1.0))
    t.add(Tenant("light", 2.0))
    assert t.count == Counter({"anonymous": 2, "light": 1})
    assert t.weight == {"anonymous": 1.0, "light": 2.0}
