"""Which model a multi-model worker holds awake (worker/multi/policy.py), as a table: the rule's
cases, its hysteresis (a busy model keeps the worker for min_awake_s; a waiting model's wait is
bounded by max_wait_s) and its tie-breaks."""

from __future__ import annotations

import pytest

from inferq.worker.multi.policy import Demand, Knobs, Swap, choose

K = Knobs(min_awake_s=10, max_wait_s=30)
IDLE = Demand()


def d(queued: int = 0, oldest: float = 0.0, elsewhere: int = 0, running: int = 0) -> Demand:
    return Demand(queued=queued, oldest_s=oldest, awake_elsewhere=elsewhere, running=running)


CASES = [
    # (what, demand by model, awake, awake for (s), expected)
    ("start-up, nothing waits: the first model", {"a": IDLE, "b": IDLE}, None, 0, Swap("a", "start")),
    ("start-up: the model with work", {"a": IDLE, "b": d(2, 1)}, None, 0, Swap("b", "waiting")),
    ("nothing waits: stay", {"a": d(3, 5, running=2), "b": IDLE}, "a", 1, None),
    ("awake model idle: swap at once, however short its stay", {"a": IDLE, "b": d(1, 0.1)}, "a", 0.1,
     Swap("b", "idle")),
    ("other model held awake elsewhere: not waiting", {"a": IDLE, "b": d(5, 20, elsewhere=1)}, "a", 100, None),
    ("held elsewhere but past the bound: waiting", {"a": IDLE, "b": d(5, 31, elsewhere=1)}, "a", 100,
     Swap("b", "idle")),
    ("awake model runs jobs, queue empty, too soon: stay", {"a": d(running=3), "b": d(1, 50)}, "a", 9, None),
    ("awake model runs jobs, queue empty, dwell passed: swap (they end in the grace)",
     {"a": d(running=3), "b": d(1, 1)}, "a", 10, Swap("b", "finishing")),
    ("awake model has a queue: stay under the bound", {"a": d(4, 2, running=8), "b": d(1, 29)}, "a", 100, None),
    ("awake model has a queue: swap once the other waited the bound", {"a": d(4, 40, running=8), "b": d(1, 30)},
     "a", 100, Swap("b", "max_wait")),
    ("the bound does not beat the dwell", {"a": d(4, 40, running=8), "b": d(1, 300)}, "a", 5, None),
    ("awake model has a queue others serve too: swap after the dwell",
     {"a": d(4, 2, elsewhere=2, running=8), "b": d(1, 1)}, "a", 10, Swap("b", "shared")),
    ("oldest job first", {"a": IDLE, "b": d(1, 5), "c": d(9, 4)}, "a", 0, Swap("b", "idle")),
    ("same age: more jobs first", {"a": IDLE, "b": d(1, 5), "c": d(9, 5)}, "a", 0, Swap("c", "idle")),
    ("cancelled jobs are no demand (queued 0)", {"a": IDLE, "b": d(0, 0)}, "a", 0, None),
]


@pytest.mark.parametrize(("demand", "awake", "awake_for", "expected"), [c[1:] for c in CASES],
                         ids=[c[0] for c in CASES])
def test_choose(demand: dict[str, Demand], awake: str | None, awake_for: float, expected: Swap | None) -> None:
    assert choose(demand, awake, awake_for, K) == expected


def test_prepare_starts_a_cold_model_only_while_idle_after_the_dwell() -> None:
    knobs = Knobs(min_awake_s=10, max_wait_s=30, prepare=True)
    cold = frozenset({"b", "c"})
    assert choose({"a": IDLE, "b": IDLE, "c": IDLE}, "a", 10, knobs, cold) == Swap("b", "prepare")
    assert choose({"a": IDLE, "b": IDLE, "c": IDLE}, "a", 9, knobs, cold) is None
    assert choose({"a": d(running=1), "b": IDLE, "c": IDLE}, "a", 100, knobs, cold) is None
    assert choose({"a": IDLE, "b": IDLE}, "a", 100, knobs, frozenset()) is None  # all started: stay
    assert choose({"a": IDLE, "b": IDLE, "c": IDLE}, "a", 100, K, cold) is None  # prepare off


def test_two_busy_models_alternate_no_faster_than_the_bound() -> None:
    """Both models keep a queue: the worker holds each until the other's oldest job waited max_wait_s
    (the queue's ages grow while a model waits), never sooner: no flapping."""
    awake, since, swaps = "a", 0.0, []
    waiting_since = {"a": 0.0, "b": 0.0}
    for t in range(0, 200):
        demand = {m: d(5, 0.0 if m == awake else t - waiting_since[m], running=4 if m == awake else 0)
                  for m in ("a", "b")}
        swap = choose(demand, awake, t - since, K)
        if swap is not None:
            waiting_since[awake] = t
            awake, since = swap.to, t
            swaps.append(t)
    gaps = [b - a for a, b in zip(swaps, swaps[1:], strict=False)]
    assert swaps and all(g >= K.max_wait_s for g in gaps), swaps
