"""Cache-affine pull: a job goes where its prompt's prefix and its adapter already are, and the
workers decide it, not a router.

Every worker keeps, in Redis, which prompt prefixes it ran last: a prompt's token ids are cut into
blocks of INFERQ_AFFINITY_BLOCK_TOKENS, each block hashed with the ones before it (and the job's
adapter), and ``inferq:px:{model}:{hash}`` names the last worker that ran a prompt holding that
block (a TTL drops what its cache has long evicted). A worker that takes a job from its model's
queue looks the job's blocks up (one MGET): if another live worker ran the longest of them (or,
failing a prefix, the job's adapter), and that worker has a free slot and is not much busier (loads
read live: each worker writes the jobs it runs; for a job drawn by its adapter alone, not busier at
all), the job is passed to that worker's lane (a queue only it consumes) and this worker takes the
next one.
A job that starts a new prefix (no worker holds its first block) goes to the least loaded worker
when this one is busier by more than one job (INFERQ_AFFINITY_SPREAD): its follow-ups will come back
to wherever it runs, so where new prefixes start decides the fleet's balance from then on.

What keeps a queue's promises: a job is passed at most once (``passed_by``: the lane's worker runs
it); only to a live worker with room, so that no job waits on a busy worker while another is free,
and a worker that fills up hands its lane back to the queue at its next heartbeat, as a draining
or dead one does (liveness/lanes.py); passing is a push of the same message (same job id) before
this one is acked, so a crash in between leaves the job twice on queues, never lost, and the claim
runs it once. Cancel, deadlines, priorities (the lane has a list per priority) and fencing are the
claim's, unchanged.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from array import array
from collections.abc import Callable, Sequence

from celery import Celery

from inferq.shared import keys
from inferq.shared.celery_app import job_message
from inferq.shared.redis import make_sync_redis
from inferq.shared.schemas import JobMessage, WorkerInfo
from inferq.shared.settings import Settings
from inferq.worker.metrics import JOBS_PASSED

log = logging.getLogger(__name__)


def block_hashes(ids: Sequence[int], adapter: str | None, block: int, limit: int = 64) -> list[str]:
    """The hashes of the prompt's whole blocks of ``block`` tokens (at most ``limit``), each of a
    block and every block before it, and of the adapter: two prompts share a hash where they
    share every token up to the end of that block, with the same adapter (vLLM's prefix cache
    is per adapter too)."""
    prev = hashlib.blake2b((adapter or "").encode(), digest_size=8).digest()
    out = []
    for i in range(min(len(ids) // block, limit)):
        prev = hashlib.blake2b(prev + array("q", ids[i * block:(i + 1) * block]).tobytes(), digest_size=8).digest()
        out.append(prev.hex())
    return out


class Affinity:
    """One worker's side of cache-affine pull, called from Celery's threads (a client of its own)."""

    def __init__(self, settings: Settings, celery: Celery, worker_id: str, slots: int,
                 own_load: Callable[[], int] = lambda: 0,
                 own_adapters: Callable[[], list[str]] = lambda: []) -> None:
        self.settings = settings
        self.own_load = own_load  # the jobs this worker holds (taken, not passed on or ended)
        self._deciding = threading.Lock()  # one job placed (and passed, or kept) at a time
        self.own_adapters = own_adapters  # the adapters this worker's engine has loaded
        self.celery = celery
        self.worker_id = worker_id
        self.model = settings.model_name
        self.redis = make_sync_redis(settings, decode_responses=True, socket_timeout=5,
                                     max_connections=max(4, slots))
        self.publish_load(0)  # a worker starting again under its id runs nothing yet

    def _keys(self, hashes: list[str], adapter: str | None) -> list[str]:
        names = [keys.prefix_owner(self.model, h) for h in hashes]
        return names + [keys.prefix_owner(self.model, f"a:{adapter}")] if adapter else names

    def route(self, msg: JobMessage, ids: Sequence[int] | None, passed: Callable[[], None]) -> bool:
        """Pass the job to the worker that should run it, then call ``passed`` (True), or leave it
        to run here (False). One job at a time, ``passed`` included: each decision sees the ones
        before it (this worker's load counts every job it has taken, placed or not; a pass takes
        its job off). A job not tokenized (``ids`` None: its run reports why) or a Redis error: it
        runs here."""
        if ids is None:
            return False
        with self._deciding:
            try:
                holder = self.place(msg, ids)
                if holder is not None:
                    self.pass_to(msg, holder)
            except Exception as e:  # Redis away: run it here (the claim path has its own retries)
                log.warning("job %s: cache-affine placement failed (%s); running it here", msg.id, e)
                return False
            if holder is not None:
                passed()
            return holder is not None

    def place(self, msg: JobMessage, ids: Sequence[int]) -> str | None:
        """The worker to pass the job to, or None to run it here (and remember it ran here). The
        deepest prefix block another worker holds decides; failing any, the job's adapter, unless
        this worker has it loaded too."""
        adapter = msg.adapter.name if msg.adapter is not None else None
        hashes = block_hashes(ids, adapter, self.settings.affinity_block_tokens)
        names = self._keys(hashes, adapter)
        if not names:
            return None
        holder = None
        if msg.passed_by is None:
            owners = self.redis.mget(names)
            holder = next((o for o in reversed(owners[:len(hashes)]) if o), None)
            new = holder is None  # no worker holds its first block: it starts a new prefix
            if new and adapter and adapter not in self.own_adapters():
                holder = owners[-1]  # go where the adapter is loaded, if that keeps loads even
            if holder == self.worker_id or (holder is not None and not self._has_room(holder, even=new)):
                holder = None
            if holder is None and new and hashes and self.settings.affinity_spread:
                holder = self._least_loaded()  # a new prefix: it starts where it keeps loads even
        if holder is None:
            self.remember(names)
        return holder

    def remember(self, names: list[str]) -> None:
        """This worker now holds these blocks (and adapter)."""
        with self.redis.pipeline(transaction=False) as p:
            for name in names:
                p.set(name, self.worker_id, ex=self.settings.affinity_ttl_s)
            p.execute()

    def publish_load(self, running: int) -> None:
        """Say how many jobs this worker runs now (it has just taken one on, or ended one): other
        workers compare it, live, when they place jobs. Best effort: a failed write leaves the last."""
        try:
            self.redis.hset(keys.worker_loads(self.model), self.worker_id, running)
        except Exception as e:
            log.debug("could not publish this worker's load: %s", e)

    def _load_of(self, worker_ids: list[str]) -> dict[str, tuple[WorkerInfo, int]]:
        """Of the workers that may receive a job (live, serving this model, consuming their lane,
        not draining): each one's description and load, the jobs it runs as it last wrote them
        (:meth:`publish_load`, live; a worker that writes none, its engine's sequences by its last
        heartbeat) and its lane (live)."""
        if not worker_ids:
            return {}
        lanes = len(keys.PRIORITIES)
        with self.redis.pipeline(transaction=False) as p:
            p.hmget(keys.worker_loads(self.model), worker_ids)
            for w in worker_ids:
                p.get(keys.worker(w))
                for name in keys.priority_lists(keys.lane(self.model, w)):
                    p.llen(name)
            published, *got = p.execute()
        out = {}
        for i, w in enumerate(worker_ids):
            raw, *lane = got[i * (lanes + 1):(i + 1) * (lanes + 1)]
            if raw is None:
                continue
            info = WorkerInfo.model_validate_json(raw)
            if (info.model != self.model or not info.lane or info.draining
                    or time.time() - info.last_seen > self.settings.worker_ttl_s):
                continue
            stale = info.stats.running + info.stats.waiting  # (right after a wave ends, still the wave's)
            running = int(published[i]) if published[i] is not None else stale
            out[w] = (info, running + sum(lane))
        return out

    def _least_loaded(self) -> str | None:
        """For a job that starts a new prefix (its follow-ups will come back to where it runs): the
        least loaded other worker with a free slot, if running it there leaves the two loads
        closer than running it here; else None (it runs here). Without this, sessions would stay
        split as the first jobs happened to be popped, however uneven."""
        live = self.redis.zrangebyscore(keys.workers(self.model), time.time() - self.settings.worker_ttl_s, "+inf")
        others = [w for w in live if w != self.worker_id]
        loads = {w: load for w, (info, load) in self._load_of(others).items() if load < info.max_num_seqs}
        if not loads:
            return None
        best = min(loads, key=lambda w: loads[w])
        return best if loads[best] + 1 < self.own_load() else None

    def _has_room(self, worker_id: str, even: bool = False) -> bool:
        """Whether the worker is live, serving this model, consuming its lane (a worker with
        INFERQ_AFFINITY=off, or of an older release, does not), not draining, and has a slot free,
        and is not busier than this one by more than INFERQ_AFFINITY_SLACK of its slots (then the
        job runs here: the two loads even out, and this worker holds the prefix from then on).
        ``even`` (a job that starts a new prefix, drawn only by its adapter): not busier at all, so
        that the job leaves the two loads within one of each other; the sessions of a popular
        adapter would otherwise pile up on the worker that loaded it first, and stay there. The
        holder's load is :meth:`_load_of`'s; this worker's, the jobs it holds, this one included."""
        got = self._load_of([worker_id]).get(worker_id)
        if got is None:
            return False
        info, load = got
        slack = -1 if even else max(1, int(self.settings.affinity_slack * info.max_num_seqs))
        return load < info.max_num_seqs and load <= self.own_load() + slack

    def pass_to(self, msg: JobMessage, worker_id: str) -> None:
        """Put the job on the worker's lane, marked as passed (its message here is acked after)."""
        passed = msg.model_copy(update={"passed_by": self.worker_id})
        queue_list, message = job_message(self.celery, passed, keys.lane(self.model, worker_id))
        self.redis.lpush(queue_list, message)
        JOBS_PASSED.labels(self.model).inc()
        log.info("job %s passed to worker %s, which holds its prefix or adapter", msg.id, worker_id,
                 extra={"job_id": msg.id})
