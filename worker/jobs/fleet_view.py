"""What cache-affine pull reads of the fleet to place one job: a :class:`Reading` per job, in one
Redis round trip (the engines holding each of the prompt's blocks, every worker's live load and
lane, the adapter's demand), over a view of the live workers and of the adapter homes that is
refreshed at most once a second (a second round trip, then). The homes are the fleet's stored plan,
changed as little as serves the demand read; a changed plan is stored for the others (a round trip
more)."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import redis

from inferq.shared import keys
from inferq.shared.redis import texts
from inferq.shared.schemas import AdapterHomes, WorkerInfo
from inferq.shared.settings import Settings
from inferq.worker.engine.group import frontend_slots
from inferq.worker.jobs import homes
from inferq.worker.jobs.placement import Peer, Snapshot
from inferq.worker.jobs.prefix_index import PrefixIndex

log = logging.getLogger(__name__)

#: How old the view of the live workers (and the adapter homes) may be (seconds).
VIEW_S = 1.0
#: How many windows of adapter demand (keys.ADAPTER_DEMAND_WINDOW_S each) the homes follow.
DEMAND_WINDOWS = 6
#: How long a stored plan of adapter homes lives once no worker reads it (seconds): each read renews it.
HOMES_TTL_S = 2 * DEMAND_WINDOWS * keys.ADAPTER_DEMAND_WINDOW_S


@dataclass
class Reading:
    """One job's read of the fleet, from which :meth:`snapshot` builds the placement's input."""

    started_at: float
    holders: list[frozenset[str]]
    peers: list[Peer]
    homes: frozenset[str] | None
    live_engines: set[str] = field(default_factory=set)

    def snapshot(self, me: Peer, passed: bool, unseen: dict[str, int]) -> Snapshot:
        """``unseen``: jobs this worker passed to each peer that this reading may not count yet."""
        peers = tuple(Peer(p.id, p.engine, p.load + unseen.get(p.id, 0), p.slots) for p in self.peers)
        return Snapshot(me, peers, tuple(self.holders), self.homes, passed)


class FleetView:
    """One worker's view of its model's fleet (a synchronous client of its own; Celery threads)."""

    def __init__(self, settings: Settings, client: redis.Redis, index: PrefixIndex, worker_id: str, engine: str,
                 max_loras: int) -> None:
        self.settings = settings
        self.redis = client
        self.index = index
        self.model = settings.model_name
        self.worker_id = worker_id
        self.engine = engine
        self.max_loras = max_loras
        self._workers: dict[str, WorkerInfo] = {}  # live, lane on, not draining, this model; not this worker
        self._workers_at = 0.0
        self._plan: dict[str, frozenset[str]] = {}
        self._plan_at = 0.0

    def read(self, hashes: Sequence[str], adapter: str | None, count_demand: bool) -> Reading:
        now = time.time()
        if now - self._workers_at > VIEW_S:
            self._refresh_workers(now)
        replan = adapter is not None and (now - self._plan_at > VIEW_S or adapter not in self._plan)
        ids = list(self._workers)
        window = int(now // keys.ADAPTER_DEMAND_WINDOW_S)
        with self.redis.pipeline(transaction=False) as p:
            self.index.read(p, hashes, now)
            p.hmget(keys.worker_loads(self.model), ids) if ids else p.echo("")
            for w in ids:
                for name in keys.priority_lists(keys.lane(self.model, w)):
                    p.llen(name)
            if adapter is not None and count_demand:
                p.hincrby(keys.adapter_demand(self.model, window), adapter, 1)
                p.expire(keys.adapter_demand(self.model, window), DEMAND_WINDOWS * keys.ADAPTER_DEMAND_WINDOW_S * 2)
            if replan:
                for k in range(DEMAND_WINDOWS):
                    p.hgetall(keys.adapter_demand(self.model, window - k))
                p.get(keys.adapter_homes(self.model))
                p.expire(keys.adapter_homes(self.model), HOMES_TTL_S)  # a plan in use lives on
            got = p.execute()
        held, published = got[:len(hashes)], got[len(hashes)]
        lanes = len(keys.PRIORITIES)
        rest = got[len(hashes) + 1:]
        peers = []
        for i, w in enumerate(ids):
            info = self._workers[w]
            lane = sum(rest[i * lanes:(i + 1) * lanes])
            running = published[i] if published[i] is not None else info.stats.running + info.stats.waiting
            peers.append(Peer(w, info.engine or w, int(running) + lane,
                              frontend_slots(info.max_num_seqs, info.frontends)))
        if replan:
            self._replan(rest[-DEMAND_WINDOWS - 2:-2], rest[-2], now)
        live = {p.engine for p in peers} | {self.engine}
        holders = [frozenset(e for e in engines if e in live) for engines in held]
        homes_ = self._plan.get(adapter) if adapter is not None else None
        return Reading(now, holders, peers, homes_, live)

    def alone(self) -> bool:
        """Whether this worker is its model's only live worker with a lane (the view refreshed at
        most once a second): a job has nowhere else to go, and nothing needs reading to place it."""
        now = time.time()
        if now - self._workers_at > VIEW_S:
            self._refresh_workers(now)
        return not self._workers

    def _refresh_workers(self, now: float) -> None:
        live = texts(self.redis.zrangebyscore(keys.workers(self.model), now - self.settings.worker_ttl_s, "+inf"))
        others = [w for w in live if w != self.worker_id]
        raws = self.redis.mget([keys.worker(w) for w in others]) if others else []
        view = {}
        for w, raw in zip(others, raws, strict=True):
            if raw is None:
                continue
            info = WorkerInfo.model_validate_json(raw)
            if (info.model == self.model and info.lane and not info.draining
                    and now - info.last_seen <= self.settings.worker_ttl_s):
                view[w] = info
        self._workers, self._workers_at = view, now

    def _replan(self, windows: list[dict[str, str]], stored: bytes | str | None, now: float) -> None:
        """The homes for the demand counted: the fleet's stored plan (made for these engines),
        changed as little as serves this demand (homes.follow); a changed plan is stored for the
        others."""
        demand: dict[str, float] = {}
        for counts in windows:
            for name, n in counts.items():
                demand[name] = demand.get(name, 0) + int(n)
        engines = {info.engine or w: info.max_loras for w, info in self._workers.items() if info.max_loras}
        if self.max_loras:
            engines[self.engine] = self.max_loras
        kept = _stored(stored)
        self._plan, new = homes.follow(kept.homes if kept is not None and kept.engines == engines else None,
                                       demand, engines)
        if new:
            made = AdapterHomes(engines=engines, homes={a: sorted(h) for a, h in self._plan.items()}, made_at=now)
            try:
                self.redis.set(keys.adapter_homes(self.model), made.model_dump_json(), ex=HOMES_TTL_S)
            except Exception as e:  # noqa: BLE001 (this worker uses its plan; the others make their own)
                log.debug("could not store the adapter homes: %s", e)
        self._plan_at = now

    def invalidate(self) -> None:
        """Read the live workers and the adapter homes again at the next placement."""
        self._workers_at = self._plan_at = 0.0

    def plan(self) -> dict[str, frozenset[str]]:
        """The adapter homes as last computed (the console and tests read it)."""
        return dict(self._plan)


def _stored(raw: bytes | str | None) -> AdapterHomes | None:
    """The fleet's stored plan (None: none, or one this version cannot read)."""
    if raw is None:
        return None
    try:
        return AdapterHomes.model_validate_json(raw)
    except ValueError:
        return None
