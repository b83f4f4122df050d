"""Adapter homes: which engines of a model's fleet hold which LoRA adapters (a pure plan).

An engine runs requests of at most ``max_loras`` adapters in one batch (its GPU slots); a request
whose adapter has no slot waits until a running adapter's requests end. Sent anywhere, a mix of
more adapters than one engine's slots makes every engine juggle all of them (16 adapters drawn
uniformly over 2 engines of 4 slots each: the engines ran at half the throughput of one adapter).
Homes split the adapters in demand between the engines, so that each engine sees as few as
possible and a popular adapter has as many engines as its traffic needs:

- each adapter gets a number of homes in proportion to its share of the recent demand, at least
  one, at most every engine, and no more in all than the fleet's slots (while the adapters fit in
  the slots; past that, one home each);
- adapters are placed in turn (those with more homes first, then by name) on the engines that rank
  highest for them by rendezvous hashing, skipping engines whose slots are taken (past the slots:
  whose share of the adapters is taken). Rendezvous hashing keeps a plan stable: an engine that
  joins or leaves moves only the adapters it gains or held, and every worker that computes the plan
  from the same demand and engines gets the same answer.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping


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
    slots = sum(max(1, s) for s in engines.values())
    counts = home_counts(demand, len(engines), slots)
    if len(counts) <= slots:
        cap = {e: max(1, s) for e, s in engines.items()}
    else:  # more adapters than slots: each engine takes its share of them
        cap = {e: math.ceil(len(counts) * max(1, s) / slots) for e, s in engines.items()}
    used = dict.fromkeys(engines, 0)
    out: dict[str, frozenset[str]] = {}
    for adapter in sorted(counts, key=lambda a: (-counts[a], a)):
        ranked = sorted(engines, key=lambda e: _score(adapter, e), reverse=True)
        picked = [e for e in ranked if used[e] < cap[e]][:counts[adapter]]
        if not picked:  # every engine full (a rounding edge): the least used of its ranking
            picked = [min(ranked, key=lambda e: used[e])]
        for e in picked:
            used[e] += 1
        out[adapter] = frozenset(picked)
    return out
