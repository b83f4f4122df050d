"""Cache-affine pull: a job goes where its prompt's prefix and its adapter already are, and the
workers decide it, not a router.

A worker that takes a job from its model's queue hashes the prompt's blocks (prefix_index.py),
reads the fleet once (fleet_view.py: which engines hold each block, every worker's live load and
lane, the adapter's homes) and asks the pure rule (placement.py: follow the deepest prefix until it
saturates, else the adapter's home, else wherever loads stay even). A job for another worker goes
to that worker's lane (a queue only it consumes) and this worker takes the next one. After a job
is claimed here, its prefix is recorded for this engine (prefix_index.py says how the index is fed).

What keeps a queue's promises: a job is passed at most once (``passed_by``: the lane's worker runs
it); only to a live worker with room, so that no job waits on a busy worker while another is free,
and a worker that fills up hands its lane back to the queue at its next heartbeat, as a draining
or dead one does (liveness/lanes.py); passing is a push of the same message (same job id) before
this one is acked, so a crash in between leaves the job twice on queues, never lost, and the claim
runs it once. Cancel, deadlines, priorities (the lane has a list per priority) and fencing are the
claim's, unchanged.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence

from celery import Celery

from inferq.shared import keys
from inferq.shared.celery_app import job_message
from inferq.shared.redis import make_sync_redis
from inferq.shared.schemas import JobMessage
from inferq.shared.settings import Settings
from inferq.worker.engine.group import frontend_slots
from inferq.worker.jobs.fleet_view import FleetView
from inferq.worker.jobs.placement import Decision, Peer, Rules, choose
from inferq.worker.jobs.prefix_index import PrefixIndex, block_hashes
from inferq.worker.metrics import JOBS_PASSED

log = logging.getLogger(__name__)

#: How long a pass's effect on its receiver's load is counted here after the push (seconds).
PASS_MEMORY_S = 5.0
#: Jobs decided and not claimed yet whose seen prefixes are kept (a bound for jobs that never claim).
SEEN_HERE_MAX = 4096


class Affinity:
    """One worker's side of cache-affine pull, called from Celery's threads (a client of its own)."""

    def __init__(self, settings: Settings, celery: Celery, worker_id: str, slots: int,
                 own_load: Callable[[], int] = lambda: 0, engine: str | None = None, max_loras: int = 0) -> None:
        self.settings = settings
        self.own_load = own_load  # the jobs this worker holds (taken, not passed on or ended)
        self.celery = celery
        self.worker_id = worker_id
        self.engine = engine or worker_id
        self.slots = slots
        self.model = settings.model_name
        self.redis = make_sync_redis(settings, decode_responses=True, socket_timeout=5,
                                     max_connections=max(4, slots))
        self.index = PrefixIndex(self.redis, self.model, settings.affinity_ttl_s)
        self.view = FleetView(settings, self.redis, self.index, worker_id, self.engine, max_loras)
        self.rules = Rules(slack=max(1, int(settings.affinity_slack * settings.max_num_seqs)),
                           spread=settings.affinity_spread)
        self._mode: tuple[float, bool] = (0.0, True)  # (read at, on): the fleet's switch, read once a second
        self._deciding = threading.Lock()  # one decision at a time: each sees the ones before it
        self._transit = 0  # jobs decided to go elsewhere whose push has not ended yet
        self._undecided = 0  # jobs taken and being placed, not yet decided
        self._passes: list[tuple[str, float | None]] = []  # (receiver, when its push ended) lately
        # per job decided to run here, the prefixes its reading saw this engine hold: with the engine's
        # events feeding the index, the claim refreshes only those (no command for a prefix nobody holds)
        self._seen_here: dict[str, list[str]] = {}
        self._load_withdrawn = False  # this worker's load entry is out (it is its model's only worker)
        self._write_load(0)  # a worker starting again under its id runs nothing yet

    def on(self) -> bool:
        """Whether cache-affine pull is on for the model now: an operator can switch every worker of a
        model off (and on again) at run time, ``SET inferq:affinity:{model} off``, without a restart
        (docs/operations.md); read at most once a second. A Redis error keeps the last answer."""
        at, on = self._mode
        if time.monotonic() - at > 1.0:
            try:
                on = self.redis.get(keys.affinity_mode(self.model)) != "off"
            except Exception as e:
                log.debug("could not read the affinity switch: %s", e)
            self._mode = (time.monotonic(), on)
        return on

    def hashes(self, msg: JobMessage, ids: Sequence[int]) -> list[str]:
        adapter = msg.adapter.name if msg.adapter is not None else None
        return block_hashes(ids, adapter, self.settings.affinity_block_tokens)

    def route(self, msg: JobMessage, ids: Sequence[int] | None, passed: Callable[[], None]) -> bool:
        """Pass the job to the worker that should run it, then call ``passed`` (True), or leave it
        to run here (False). A job not tokenized (``ids`` None: its run reports why) or a Redis
        error: it runs here."""
        if ids is None:
            return False
        decision = self.decide(msg, ids)
        if decision is None or decision.to is None:
            return False
        try:
            self.pass_to(msg, decision.to)
        except Exception as e:  # Redis away: run it here (the claim path has its own retries)
            log.warning("job %s: could not pass it on (%s); running it here", msg.id, e)
            self._pushed(decision.to, ok=False)
            return False
        self._pushed(decision.to, ok=True)
        passed()
        return True

    def decide(self, msg: JobMessage, ids: Sequence[int]) -> Decision | None:
        """Read the fleet, then (one decision at a time) choose. None: the read failed."""
        if msg.passed_by is not None:  # passed here once: it runs here, nothing to read
            return Decision(None, "passed")
        adapter = msg.adapter.name if msg.adapter is not None else None
        try:  # the only worker of its model: it runs here, with no read of the fleet (an adapter's job
            # is still read: its demand is counted for the homes of the workers that join)
            if adapter is None and self.view.alone():
                return Decision(None, "alone")
        except Exception as e:
            log.warning("job %s: cache-affine placement failed (%s); running it here", msg.id, e)
            return None
        hashes = self.hashes(msg, ids)
        with self._deciding:
            self._undecided += 1
        try:
            reading = self.view.read(hashes, adapter, count_demand=True)
        except Exception as e:
            log.warning("job %s: cache-affine placement failed (%s); running it here", msg.id, e)
            with self._deciding:
                self._undecided -= 1
            return None
        with self._deciding:
            # this worker's load as it decides: the jobs it runs and this one, not the rest of a burst it
            # has taken and not placed yet (other workers count those: its published load has them)
            self._undecided -= 1
            me = Peer(self.worker_id, self.engine, self.own_load() - self._transit - self._undecided, self.slots)
            decision = choose(reading.snapshot(me, False, self._unseen(reading.started_at)), self.rules)
            if decision.to is not None:
                self._transit += 1
                self._passes.append((decision.to, None))
            elif self.settings.affinity_index == "events":
                if len(self._seen_here) >= SEEN_HERE_MAX:  # jobs that never reached their claim
                    self._seen_here.clear()
                self._seen_here[msg.id] = [h for h, held in zip(hashes, reading.holders, strict=False)
                                           if self.engine in held]
        return decision

    def _unseen(self, read_at: float) -> dict[str, int]:
        """Per receiver, the passes a reading begun at ``read_at`` may not count: pushes that had not
        ended by then (a push that had is in the receiver's lane, or load, by the reading)."""
        now = time.monotonic()
        self._passes = [(w, t) for w, t in self._passes if t is None or now - t < PASS_MEMORY_S]
        wall_to_mono = now - time.time()
        out: dict[str, int] = {}
        for w, t in self._passes:
            if t is None or t > read_at + wall_to_mono:
                out[w] = out.get(w, 0) + 1
        return out

    def _pushed(self, to: str, ok: bool) -> None:
        with self._deciding:
            self._transit -= 1
            i = self._passes.index((to, None))
            if ok:
                self._passes[i] = (to, time.monotonic())
            else:
                del self._passes[i]

    def wants_claim(self, msg: JobMessage, ids: Sequence[int] | None) -> bool:
        """Whether the job's claim here has anything to record (``ran_here``): not for a prompt with no
        whole block (or not tokenized), nor, with the engine's events feeding the index, for one whose
        reading saw this engine hold none of its prefix (a prompt nobody holds). Such a job's run is
        not told back to the taking thread: one hand-off less a job where nothing is shared."""
        if ids is None or len(ids) < self.settings.affinity_block_tokens or (
                self.settings.affinity_index == "events" and self._seen_here.get(msg.id, None) == []):
            self._seen_here.pop(msg.id, None)
            return False
        return True

    def ran_here(self, msg: JobMessage, ids: Sequence[int] | None) -> None:
        """The job was claimed here: its prefix is this engine's. With the engine's events feeding
        the index, only entries it already has are refreshed: those its reading saw this engine hold
        (none, and no command, for a prompt nobody held), or every block's where it was not read.
        Best effort."""
        seen = self._seen_here.pop(msg.id, None)
        if ids is None:
            return
        events = self.settings.affinity_index == "events"
        try:
            self.index.hold(self.engine, seen if events and seen is not None else self.hashes(msg, ids),
                            refresh_only=events)
        except Exception as e:
            log.debug("job %s: could not record its prefix (%s)", msg.id, e)

    def publish_load(self, running: int) -> None:
        """Say how many jobs this worker runs now (it has just taken one on, or ended one): other
        workers compare it, live, when they place jobs. A model's only worker has no reader: it takes
        its entry out once (a worker that joins reads its heartbeat's running and waiting instead,
        until this worker's view sees it, within a second, and writes again). Best effort: a failed
        write leaves the last."""
        try:
            if self.view.alone():
                if not self._load_withdrawn:
                    self.redis.hdel(keys.worker_loads(self.model), self.worker_id)
                    self._load_withdrawn = True
                return
        except Exception as e:
            log.debug("could not publish this worker's load: %s", e)
            return
        self._load_withdrawn = False
        self._write_load(running)

    def _write_load(self, running: int) -> None:
        try:
            self.redis.hset(keys.worker_loads(self.model), self.worker_id, running)
        except Exception as e:
            log.debug("could not publish this worker's load: %s", e)

    def pass_to(self, msg: JobMessage, worker_id: str) -> None:
        """Put the job on the worker's lane, marked as passed (its message here is acked after)."""
        passed = msg.model_copy(update={"passed_by": self.worker_id})
        queue_list, message = job_message(self.celery, passed, keys.lane(self.model, worker_id))
        self.redis.lpush(queue_list, message)
        JOBS_PASSED.labels(self.model).inc()
        log.info("job %s passed to worker %s", msg.id, worker_id, extra={"job_id": msg.id})


def slots_of(max_num_seqs: int, frontends: int) -> int:
    """Jobs one worker takes at once (a frontend of a group, its share)."""
    return frontend_slots(max_num_seqs, frontends)
