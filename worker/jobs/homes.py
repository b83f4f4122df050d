"""Adapter homes: which engines of a model's fleet hold which LoRA adapters (a pure plan).

An engine runs requests of at most ``max_loras`` adapters in one batch (its GPU slots); a request
whose adapter has no slot waits until a running adapter's requests end. Sent anywhere, a mix of
more adapters than one engine's slots makes every engine juggle all of them (16 adapters drawn
uniformly over 2 engines of 4 slots each: the engines ran at half the throughput of one adapter).
Homes split the adapters in demand between the engines, so that each engine sees as few as
possible and a popular adapter has as many engines as its traffic needs:

- each adapter gets a number of homes in proportion to its share of the recent demand, at least
  one, at most every engine, and no more in all than the fleet's slots (while the adapters fit in
  the slots; past that, one home each, and below, one more for a hot adapter where needed);
- adapters are placed in turn (those with more homes first, then by name) on the engines that rank
  highest for them by rendezvous hashing, skipping engines whose slots are taken (past the slots:
  whose share of the adapters is taken);
- then, while the engine that takes the most demand for its slots takes more than its share by
  :data:`BALANCE_SLACK`, one of its homes moves to (or swaps with a colder one of) the least
  loaded engine where that brings the two closer (a Zipf-like mix of 16 adapters over two engines
  of 4 slots: 68 % of the demand on one without it). Rendezvous hashing keeps a plan stable: an
  engine that joins or leaves moves only the adapters it gains or held (and the few the balance
  step moves), and every worker that computes the plan from the same demand and engines gets the
  same answer;
- past the slots, while the busiest engine still takes more than that, its hottest adapter (by
  demand a home) gets one more home and the plan is made again: no move cures a Zipf head with
  30 % of the demand on one of four engines (16 Zipf adapters over four engines of 4 slots: the
  busiest at 1.42x its share with one home each, 1.08x with two for the head).

The plan in use changes as little as serves (:func:`follow`): an adapter that appears is added
without moving the others, a cooled adapter's extra homes go back, and where no plan serves the
demand it stays unless a new one is better by the slack.

A plan is made by one worker and stored for the fleet (worker/jobs/fleet_view.py); every worker
uses it while :func:`keeps` says it serves the demand that worker reads: counted jobs spread apart
however evenly they are drawn, so a plan is kept until an engine takes more than its share by the
slack and :data:`NOISE_SIGMAS` standard deviations of its count (a plan for every read moved homes
on that noise alone, and workers reading at different moments worked to different plans).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Collection, Mapping

#: How far past its share of the demand (by its slots) the busiest engine may stay before homes move off it.
BALANCE_SLACK = 0.1
#: How many standard deviations of its share's count (binomial) past the slack an engine may take
#: before the fleet's plan is made again (:func:`keeps`): a plan must not move on counting noise.
NOISE_SIGMAS = 3.0


def _score(adapter: str, engine: str) -> int:
    return int.from_bytes(hashlib.blake2b(f"{adapter}\0{engine}".encode(), digest_size=8).digest(), "big")


def home_counts(demand: Mapping[str, float], engines: int, slots: int) -> dict[str, int]:
    """How many homes each adapter with demand gets: proportional to its share of ``slots`` (the
    fleet's), within [1, engines], no more than ``slots`` in all while the adapters fit."""
    wanted = {a: d for a, d in demand.items() if d > 0}
    if not wanted or engines < 1:
        return {}
    if len(wanted) >= slots:
        return dict.fromkeys(wanted, 1)
    total = sum(wanted.values())
    counts = {a: min(engines, max(1, round(d / total * slots))) for a, d in wanted.items()}
    while sum(counts.values()) > slots:  # rounding up overshot: take from the one with most homes per demand
        a = max((a for a in counts if counts[a] > 1), key=lambda a: (counts[a] / wanted[a], a))
        counts[a] -= 1
    return counts


def plan(demand: Mapping[str, float], engines: Mapping[str, int]) -> dict[str, frozenset[str]]:
    """Adapter -> its home engines. ``demand``: each adapter's recent jobs (adapters without any
    get no home, and take no slot); ``engines``: engine id -> its GPU adapter slots."""
    if not engines:
        return {}
    weight = _weights(engines)
    slots = sum(weight.values())
    counts = home_counts(demand, len(engines), slots)
    out = _place(counts, demand, weight)
    if len(counts) >= slots:  # one home each: a hot adapter the balance step cannot spread gets more
        while (hot := _too_hot(out, counts, demand, weight)) is not None:
            counts[hot] += 1
            out = _place(counts, demand, weight)
    return {a: frozenset(h) for a, h in out.items()}


def follow(stored: Mapping[str, Collection[str]] | None, demand: Mapping[str, float],
           engines: Mapping[str, int]) -> tuple[dict[str, frozenset[str]], bool]:
    """The plan a worker works to, and whether it is new (to be stored for the fleet): ``stored``
    (made for these ``engines``; None: none) while it :func:`keeps` serving; else changed as little
    as serves: grown by the adapters it lacks, less a cooled adapter's extra homes (:func:`_extend`);
    else a new plan, unless none serves this demand and the new one would not take the busiest
    engine's load down by the slack (a plan made at every read moved homes on every job)."""
    if stored is None:
        return plan(demand, engines), True
    fresh, most = None, None
    if keeps(stored, demand, engines):
        kept = {a: frozenset(h) for a, h in stored.items()}
        placed = sum(len(kept[a]) for a, d in demand.items() if d > 0)
        if placed <= sum(_weights(engines).values()):  # within the slots: nothing held for nothing
            return kept, False
        fresh = plan(demand, engines)
        most = sum(len(h) for h in fresh.values())
        if most >= placed:
            return kept, False
    grown = _extend(stored, demand, engines, most)  # the extra homes go back, the rest stay
    if grown is not None and keeps(grown, demand, engines):
        return grown, True
    fresh = fresh if fresh is not None else plan(demand, engines)
    if grown is not None and _fits(grown, _weights(engines)) and \
            not keeps(fresh, demand, engines) and \
            _worst(fresh, demand, engines) * (1 + BALANCE_SLACK) >= _worst(grown, demand, engines):
        # no plan serves this demand: the one in use stays
        same = grown == {a: frozenset(h) for a, h in stored.items() if a in grown}
        return grown, not same
    return fresh, True


def _fits(homes: Mapping[str, Collection[str]], weight: Mapping[str, int]) -> bool:
    """Whether no engine is home to more adapters than a new plan would let it (:func:`_caps`)."""
    cap, held = _caps(weight, sum(len(h) for h in homes.values())), _held(homes, weight)
    return all(held[e] <= cap[e] for e in weight)


def _worst(plan: Mapping[str, Collection[str]], demand: Mapping[str, float], engines: Mapping[str, int]) -> float:
    """The demand the busiest engine of ``plan`` takes for its slots (each home an equal part)."""
    weight = _weights(engines)
    took = _split({a: set(plan[a]) & weight.keys() for a, d in demand.items() if d > 0 and plan.get(a)}, demand, weight)
    return max((took[e] / weight[e] for e in weight), default=0.0)


def _extend(stored: Mapping[str, Collection[str]], demand: Mapping[str, float],
            engines: Mapping[str, int], most: int | None = None) -> dict[str, frozenset[str]] | None:
    """``stored`` grown by a home for each adapter in demand it lacks, on the engine with room that
    takes the least demand for its slots (ties: rendezvous ranking); past ``most`` homes (or the
    slots) extra homes go first, from the adapter with most homes for its demand. None: a home is
    on an engine no longer there (docs/design.md, "A new adapter moves no other")."""
    weight = _weights(engines)
    wanted = {a: d for a, d in demand.items() if d > 0}
    if any(not set(stored[a]) <= weight.keys() for a in wanted if a in stored):
        return None
    out = {a: set(h) for a, h in stored.items() if a in wanted and h}
    new = sorted((a for a in wanted if a not in out), key=lambda a: (-wanted[a], a))
    limit = sum(weight.values()) if most is None else most
    while sum(len(h) for h in out.values()) + len(new) > limit and any(len(h) > 1 for h in out.values()):
        # room for the new ones within the slots: an extra home goes, never one added elsewhere
        a = max((a for a, h in out.items() if len(h) > 1), key=lambda a: (len(out[a]) / wanted[a], a))
        held = _held(out, weight)
        out[a].remove(max(out[a], key=lambda e: (held[e] / weight[e], e)))
    cap = _caps(weight, sum(len(h) for h in out.values()) + len(new))
    held, took = _held(out, weight), _split(out, wanted, weight)
    for adapter in new:
        rank = {e: _score(adapter, e) for e in weight}
        e = min(weight, key=lambda e: (held[e] >= cap[e], took[e] / weight[e], -rank[e]))
        held[e] += 1
        took[e] += wanted[adapter]
        out[adapter] = {e}
    return {a: frozenset(h) for a, h in out.items()}


def keeps(plan: Mapping[str, Collection[str]], demand: Mapping[str, float], engines: Mapping[str, int]) -> bool:
    """Whether a plan made earlier (for these ``engines``) still serves ``demand``: every adapter
    in demand has homes in it, no engine holds more of them than a new plan would let it, and no
    engine takes more than its share past the slack and :data:`NOISE_SIGMAS` standard deviations
    of its count. A fleet keeps its plan while it serves: counts that move within their noise
    move no home."""
    wanted = {a: d for a, d in demand.items() if d > 0}
    weight = _weights(engines)
    if not wanted or not weight:
        return not wanted
    homes = {a: set(plan.get(a, ())) for a in wanted}
    if any(not h or not h <= weight.keys() for h in homes.values()):
        return False
    if not _fits(homes, weight):
        return False
    slots = sum(weight.values())
    took = _split(homes, wanted, weight)
    total = sum(wanted.values())
    return all(took[e] <= _limit(total, w / slots) for e, w in weight.items())


def _place(counts: Mapping[str, int], demand: Mapping[str, float], weight: Mapping[str, int]) -> dict[str, set[str]]:
    """Each adapter's ``counts`` homes by rendezvous hashing within the engines' caps, then balanced."""
    cap = _caps(weight, sum(counts.values()))
    used = dict.fromkeys(weight, 0)
    out: dict[str, set[str]] = {}
    for adapter in sorted(counts, key=lambda a: (-counts[a], a)):
        ranked = sorted(weight, key=lambda e: _score(adapter, e), reverse=True)
        picked = [e for e in ranked if used[e] < cap[e]][:counts[adapter]]
        if not picked:  # every engine full (a rounding edge): the least used of its ranking
            picked = [min(ranked, key=lambda e: used[e])]
        for e in picked:
            used[e] += 1
        out[adapter] = set(picked)
    _balance(out, {a: demand[a] / counts[a] for a in counts}, weight, cap)
    return out


def _weights(engines: Mapping[str, int]) -> dict[str, int]:
    """Each engine's adapter slots, at least one (an engine without any still takes a home)."""
    return {e: max(1, s) for e, s in engines.items()}


def _caps(weight: Mapping[str, int], placed: int) -> dict[str, int]:
    """How many homes each engine may hold: its slots, or, with more homes than slots in the
    fleet, its share of them."""
    slots = sum(weight.values())
    return dict(weight) if placed <= slots else {e: math.ceil(placed * w / slots) for e, w in weight.items()}


def _held(homes: Mapping[str, Collection[str]], weight: Mapping[str, int]) -> dict[str, int]:
    """How many adapters each engine is home to."""
    held = dict.fromkeys(weight, 0)
    for h in homes.values():
        for e in h:
            held[e] += 1
    return held


def _over(took: Mapping[str, float], weight: Mapping[str, int]) -> str | None:
    """The engine that takes the most demand for its slots, if it takes more than its share by
    the slack (None: none does)."""
    total, slots = sum(took.values()), sum(weight.values())
    hi = max(weight, key=lambda e: (took[e] / weight[e], e))
    return hi if took[hi] > _limit(total, weight[hi] / slots, noise=False) else None


def _limit(total: float, part: float, noise: bool = True) -> float:
    """The most of ``total`` jobs of demand an engine whose share is ``part`` of it takes before
    homes move off it: its share and the slack, and (``noise``) the spread of its count (binomial)."""
    share = total * part
    spread = NOISE_SIGMAS * math.sqrt(max(share * (1 - part), 0.0)) if noise else 0.0
    return share * (1 + BALANCE_SLACK) + spread + 1e-9


def _took(homes: Mapping[str, set[str]], each: Mapping[str, float], weight: Mapping[str, int]) -> dict[str, float]:
    """Each engine's demand, each home of an adapter ``a`` taking ``each[a]``."""
    took = dict.fromkeys(weight, 0.0)
    for a, h in homes.items():
        for e in h:
            took[e] += each[a]
    return took


def _split(homes: Mapping[str, set[str]], demand: Mapping[str, float], weight: Mapping[str, int]) -> dict[str, float]:
    """Each engine's demand where each adapter's is split equally over its homes."""
    return _took(homes, {a: demand[a] / len(h) for a, h in homes.items() if h}, weight)


def _too_hot(homes: Mapping[str, set[str]], counts: Mapping[str, int], demand: Mapping[str, float],
             weight: Mapping[str, int]) -> str | None:
    """The adapter to give one more home: where the busiest engine still takes more than its share
    by the slack after balancing, its hottest adapter (by demand a home) that is not on
    every engine yet; None where none is."""
    each = {a: demand[a] / counts[a] for a in counts}
    if (hi := _over(_took(homes, each, weight), weight)) is None:
        return None
    on_hi = [a for a, h in homes.items() if hi in h and counts[a] < len(weight)]
    return max(on_hi, key=lambda a: (each[a], a), default=None)


def _balance(homes: dict[str, set[str]], each: Mapping[str, float], weight: Mapping[str, int],
             cap: Mapping[str, int]) -> None:
    """Move or swap homes, one at a time, from the engine that takes the most demand for its slots
    to the least loaded engine where a move brings the two closer, while that engine takes more
    than its share by :data:`BALANCE_SLACK` (an engine's adapter count stays within ``cap``). A plan
    whose engines already take their shares is left as rendezvous hashing made it."""
    for _ in range(len(homes)):
        took, count = _took(homes, each, weight), _held(homes, weight)
        if (hi := _over(took, weight)) is None:
            return
        for lo in sorted((e for e in weight if e != hi), key=lambda e: (took[e] / weight[e], e)):
            step = _best_step(homes, each, hi, lo, took, weight, room=count[lo] < cap[lo])
            if step is not None:
                a, b = step
                homes[a] = (homes[a] - {hi}) | {lo}
                if b is not None:
                    homes[b] = (homes[b] - {lo}) | {hi}
                break
        else:
            return


def _best_step(homes: Mapping[str, set[str]], each: Mapping[str, float], hi: str, lo: str,
               took: Mapping[str, float], weight: Mapping[str, int], room: bool) -> tuple[str, str | None] | None:
    """The move of a home from ``hi`` to ``lo`` (``room``: ``lo`` may take one more adapter), or the
    swap with a colder home of ``lo``, that leaves the worse of the two loads lowest; None if none
    lowers it."""
    worst = took[hi] / weight[hi]
    best: tuple[float, str, str] | None = None
    on_lo = [b for b, h in homes.items() if lo in h and hi not in h]
    options = ([("", 0.0)] if room else []) + [(b, each[b]) for b in on_lo]  # "": a move, nothing back
    for a in (a for a, h in homes.items() if hi in h and lo not in h):
        for b, back in options:
            d = each[a] - back
            after = max((took[hi] - d) / weight[hi], (took[lo] + d) / weight[lo])
            if d > 0 and after < worst - 1e-9 and (best is None or (after, a, b) < best):
                best = (after, a, b)
    return None if best is None else (best[1], best[2] or None)
