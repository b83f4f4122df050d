"""Which model a multi-model worker holds awake: a pure rule over what the queue shows.

Inputs, per model the worker can serve (:class:`Demand`): the jobs waiting in its queue and how long
the oldest has waited, the other workers that hold it awake (or are waking it), and the jobs this
worker runs of it. The rule, in order:

1. Nothing awake (start-up, or a swap that failed): the model with the oldest waiting job, else the
   first of the worker's models.
2. A model *waits* when it has jobs queued and no other worker holds it awake, or when its oldest job
   has waited ``max_wait_s`` even so. With none waiting, the worker stays (or, with ``prepare``,
   starts a model never started while it is idle).
3. Of the waiting models, the one whose oldest job has waited longest (then the most jobs) is the
   target. The worker swaps to it at once when its own model is idle (nothing queued, nothing running
   here); after ``min_awake_s`` awake when its own model has nothing queued (the jobs it runs end, or
   go back, in the sleep's grace) or other workers hold it awake too; and, while its own model still
   has jobs queued that nobody else takes, only once the target's oldest job has waited ``max_wait_s``.

Hysteresis comes from ``min_awake_s`` (a busy model keeps the worker that long after a wake) and
``max_wait_s`` (the bound on a waiting model's wait): two models with queued work alternate no faster
than that, while an idle model gives way at once.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Demand:
    queued: int = 0  # jobs waiting in the model's queue (cancelled ones not counted)
    oldest_s: float = 0.0  # how long its oldest queued job has waited
    awake_elsewhere: int = 0  # other workers holding it awake, or waking it
    running: int = 0  # jobs this worker runs of it


@dataclass(frozen=True)
class Knobs:
    min_awake_s: float
    max_wait_s: float
    prepare: bool = False


@dataclass(frozen=True)
class Swap:
    to: str
    reason: str


def waiting(d: Demand, knobs: Knobs) -> bool:
    """Whether the model has work nobody takes (or that waited past the bound)."""
    return d.queued > 0 and (d.awake_elsewhere == 0 or d.oldest_s >= knobs.max_wait_s)


def target(demand: dict[str, Demand], awake: str | None, knobs: Knobs) -> str | None:
    """The waiting model (not the awake one) whose oldest job has waited longest, then the most jobs."""
    ready = [m for m, d in demand.items() if m != awake and waiting(d, knobs)]
    return max(ready, key=lambda m: (demand[m].oldest_s, demand[m].queued), default=None)


def choose(demand: dict[str, Demand], awake: str | None, awake_for_s: float, knobs: Knobs,
           cold: frozenset[str] = frozenset()) -> Swap | None:
    """The swap to make now, or None to stay. ``demand``: every model of the worker, in its order;
    ``awake_for_s``: how long the awake model has been awake; ``cold``: models never started."""
    to = target(demand, awake, knobs)
    if awake is None:
        first = to or next(iter(demand), None)
        return Swap(first, "waiting" if to else "start") if first is not None else None
    here = demand.get(awake, Demand())
    idle = here.queued == 0 and here.running == 0
    if to is None:
        if knobs.prepare and cold and idle and awake_for_s >= knobs.min_awake_s:
            return Swap(next(m for m in demand if m in cold), "prepare")
        return None
    if idle:
        return Swap(to, "idle")
    if awake_for_s < knobs.min_awake_s:
        return None
    if here.queued == 0:
        return Swap(to, "finishing")
    if here.awake_elsewhere > 0:
        return Swap(to, "shared")
    if demand[to].oldest_s >= knobs.max_wait_s:
        return Swap(to, "max_wait")
    return None
