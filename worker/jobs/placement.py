"""Where a job a worker has taken should run: a pure rule over one snapshot of the fleet.

Cache-affine pull (worker/jobs/affinity.py) reads one :class:`Snapshot` per job (the engines that
hold each of its prompt's prefix blocks, the live load of every worker that may receive it, its
adapter's homes) and asks :func:`choose`. Nothing here reads Redis or a clock, so every rule is a
row of a table test (tests/unit/test_placement.py). The rules, in order:

1. **Passed once, run here.** A job another worker passed to this one's lane runs here: a job is
   never passed twice.
2. **Follow the deepest prefix, until it saturates.** The deepest prompt block some engine holds
   decides: of the workers on those engines that have a free slot, this one keeps the job if it is
   one of them and no busier than the least loaded by more than ``slack``; else the least loaded
   gets it. A prefix whose every holder is busier than the least loaded worker of the fleet by more
   than ``slack`` is *saturated*: the job is placed as a new one (rule 4), and the worker that runs
   it becomes one more holder ("sticky until saturated": a hot prefix spreads instead of piling up).
3. **An adapter goes home.** A job with a LoRA adapter and no prefix to follow goes to one of its
   adapter's home engines (worker/jobs/homes.py): here if this worker is a home and no busier than
   the least loaded home by more than ``slack``, else that home, as long as a home has a free slot
   (elsewhere the adapter would need one of the engine's adapter slots, and wait for it); homes
   with no free slot: rule 4.
4. **A new prefix starts where it was taken** unless this worker is busier than the least loaded by
   more than ``slack`` (``spread``): then it goes there. A job no engine holds anything of has
   nothing to gain from a hop (a passed job joins its engine's batch a step later, on a busy GPU
   tens of milliseconds); only a load that has drifted apart is worth one.

Only a worker with a free slot ever receives a job, so a passed job starts at that worker's next
free slot, and a job never waits on a busy worker while it could run where it was taken.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Peer:
    """A worker that may run the job: its id, the engine it feeds (a lone worker's own id; the
    group's, for the frontends of one engine), the jobs it holds now (running, taken and in its
    lane) and how many it takes at once."""

    id: str
    engine: str
    load: int
    slots: int

    @property
    def room(self) -> bool:
        return self.load < self.slots


@dataclass(frozen=True)
class Snapshot:
    """What one placement reads. ``me``'s load counts the job being placed."""

    me: Peer
    peers: tuple[Peer, ...] = ()  # the other workers that may receive a job (live, lane on, not draining)
    holders: tuple[frozenset[str], ...] = ()  # per prompt block, shallowest first: engines holding it
    homes: frozenset[str] | None = None  # the engines that are homes of the job's adapter (None: no adapter)
    passed: bool = False


@dataclass(frozen=True)
class Rules:
    slack: int = 1  # jobs a worker may be busier than the least loaded and still draw (or keep) a job
    spread: bool = True  # rule 4: a new prefix on a worker busier than the least loaded by more than slack moves


@dataclass(frozen=True)
class Decision:
    to: str | None  # the worker to pass the job to; None: run it here
    why: str  # passed | alone | prefix | adapter | spread | here (what decided), for logs and metrics

    @property
    def here(self) -> bool:
        return self.to is None


def choose(snap: Snapshot, rules: Rules) -> Decision:
    """Where the job runs (see the module's rules)."""
    if snap.passed:
        return Decision(None, "passed")
    workers = (snap.me, *snap.peers)
    floor = min(w.load for w in workers if w is snap.me or w.room)
    for engines in reversed(snap.holders):  # the deepest block with a holder among these workers
        held = [w for w in workers if w.engine in engines]
        if held:
            got = _among(held, snap.me, floor, rules.slack, keep=rules.slack)
            if got is not None:
                return got if got.to is not None else Decision(None, "prefix")
            break  # saturated: placed as a new prefix
    if snap.homes:
        homes = [w for w in workers if w.engine in snap.homes]
        got = _among(homes, snap.me, floor, None, keep=rules.slack)
        if got is not None:
            return Decision(got.to, "adapter")
    return _spread(snap, rules)


def _among(cands: Sequence[Peer], me: Peer, floor: int, slack: int | None, keep: int) -> Decision | None:
    """Of the candidates with a free slot (``me`` always qualifies: it holds the job already), the
    one to run the job: ``me`` if it is one and no busier than the least loaded by more than
    ``keep``, else the least loaded; None if none has room, or every candidate is busier than
    ``floor`` (the least loaded worker of the fleet) by more than ``slack`` (saturated; None: no
    such limit)."""
    open_ = [w for w in cands if w is me or w.room]
    if not open_:
        return None
    least = min(open_, key=lambda w: (w.load, w is not me, w.id))
    if slack is not None and least.load > floor + slack:
        return None
    if me in open_ and me.load <= least.load + keep:
        return Decision(None, "here")
    return Decision(least.id, "prefix") if least is not me else Decision(None, "here")


def _spread(snap: Snapshot, rules: Rules) -> Decision:
    if rules.spread:
        open_ = [w for w in snap.peers if w.room]
        if open_:
            least = min(open_, key=lambda w: (w.load, w.id))
            if least.load + rules.slack < snap.me.load:
                return Decision(least.id, "spread")
    return Decision(None, "here")
