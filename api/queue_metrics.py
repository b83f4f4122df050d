"""The cluster's queue metrics, read from Redis when ``/metrics`` is scraped.

They describe the whole deployment (every gateway and worker shares the one Redis), so they are
the same whichever gateway answers: aggregate them with ``max``, never ``sum``, across gateways
(docs/operations.md). Counters are kept in Redis (``inferq:stats``, written by the Lua scripts
of shared/store.py and by the reaper) so that they survive gateway restarts and count each event
once, whichever process saw it.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from redis.asyncio import Redis

from inferq.shared import keys, lua
from inferq.shared.fairshare import FairShare
from inferq.shared.redis import text_map
from inferq.shared.schemas import SERVICE_CLASSES, WorkerInfo
from inferq.shared.store import queue_depths

#: The batch lane's priority when the caller names none (INFERQ_BATCH_PRIORITY's default).
DEFAULT_LANE = 9
#: labels of each kind of keys.stat()
_ARITY = {"submitted": 1, "end": 3, "requeue": 2, "reaped": 1, "batch_line": 1, "served": 2}


@dataclass
class QueueSnapshot:
    """What Redis said, at one moment."""

    now: float
    depth: dict[tuple[str, int], int] = field(default_factory=dict)  # (model, priority) -> jobs queued
    oldest: dict[str, float] = field(default_factory=dict)  # model -> oldest queued job's time
    workers: dict[tuple[str, str], int] = field(default_factory=dict)  # (model, live|draining|asleep) -> n
    running: dict[str, int] = field(default_factory=dict)  # model -> jobs its live workers hold
    stats: dict[str, int] = field(default_factory=dict)  # inferq:stats
    batches: int = 0  # batches not yet ended
    tenants: dict[tuple[str, str, str], int] = field(default_factory=dict)  # (model, tenant, status) -> jobs
    classes: dict[tuple[str, str, str], int] = field(default_factory=dict)  # (model, class, status) -> jobs


async def snapshot(redis: Redis, default_model: str, ttl_s: float, window_s: float,
                   lane: int = DEFAULT_LANE) -> QueueSnapshot:
    """Read the queues of the default model and of every model served within ``window_s``
    (``lane``: the batch lane's priority, INFERQ_BATCH_PRIORITY: its depth is batch work queued)."""
    now = time.time()
    models = {default_model, *await redis.zrangebyscore(keys.MODELS, now - window_s, "+inf")}
    snap = QueueSnapshot(now, stats={k: int(v) for k, v in text_map(await redis.hgetall(keys.STATS)).items()},
                         batches=await redis.scard(keys.BATCHES_ACTIVE))
    for model in sorted(models):
        lists = keys.queue_lists(model)
        lengths = await queue_depths(redis, model)  # jobs cancelled while queued not counted
        async with redis.pipeline(transaction=False) as p:
            p.eval(lua.source("queue_oldest"), len(lists) + 1, *lists, keys.QUEUED, json.dumps(model), keys.job(""))
            p.zrangebyscore(keys.workers(model), now - ttl_s, "+inf")
            p.zcount(keys.standby(model), now - ttl_s, "+inf")
            oldest, wids, asleep = await p.execute()
        snap.depth.update({(model, prio): n for prio, n in zip(keys.PRIORITIES, lengths, strict=True)})
        if oldest is not None:
            snap.oldest[model] = float(oldest)
        infos = [WorkerInfo.model_validate_json(r) for r in await redis.mget([keys.worker(w) for w in wids]) if r] \
            if wids else []
        snap.workers[(model, "live")] = sum(not w.draining for w in infos)
        snap.workers[(model, "draining")] = sum(w.draining for w in infos)
        if asleep:  # multi-model workers holding it asleep (worker/multi)
            snap.workers[(model, "asleep")] = int(asleep)
        running = await _running(redis, wids)
        snap.running[model] = len(running)
        await _tenants(redis, snap, model, lists, running)
        _classes(snap, model, lengths, lane, infos)
    return snap


def _classes(snap: QueueSnapshot, model: str, lengths: list[int], lane: int, infos: list[WorkerInfo]) -> None:
    """Each service class's jobs: queued (the batch lane's depth is batch work's) and held by the
    model's workers (as their heartbeats say: worker/jobs/classes.py)."""
    batch = lengths[lane] if 0 <= lane < len(lengths) else 0
    snap.classes[(model, "interactive", "queued")] = sum(lengths) - batch
    snap.classes[(model, "batch", "queued")] = batch
    for cls in SERVICE_CLASSES:
        snap.classes[(model, cls, "running")] = sum(sum((w.classes.running.get(cls) or {}).values())
                                                    for w in infos if w.classes is not None)


async def _running(redis: Redis, wids: list[str]) -> list[str]:
    """The jobs the workers ``wids`` hold."""
    if not wids:
        return []
    async with redis.pipeline(transaction=False) as p:
        for w in wids:
            p.smembers(keys.worker_jobs(w))
        return [j for held in await p.execute() for j in held]


async def _tenants(redis: Redis, snap: QueueSnapshot, model: str, lists: list[str], running: list[str]) -> None:
    """Each tenant's jobs queued (shared/fairshare.py's counts) and running (its jobs' records)."""
    async with redis.pipeline(transaction=False) as p:
        for name in lists:
            p.hgetall(keys.fair_queued(name))
        for job_id in running:
            p.hget(keys.job(job_id), "fair")
        got = await p.execute()
    for counts in got[:len(lists)]:
        for tenant, n in counts.items():
            if int(n) > 0:
                k = (model, tenant, "queued")
                snap.tenants[k] = snap.tenants.get(k, 0) + int(n)
    for fair in got[len(lists):]:
        try:
            tenant = FairShare.model_validate_json(fair).tenant if fair else None
        except ValueError:  # a share written before it had its full names
            tenant = None
        if tenant is not None:
            k = (model, tenant, "running")
            snap.tenants[k] = snap.tenants.get(k, 0) + 1


class QueueCollector(Collector):
    """The snapshot as Prometheus metrics."""

    def __init__(self, snap: QueueSnapshot) -> None:
        self.snap = snap

    def collect(self) -> Iterator[Metric]:
        s = self.snap
        depth = GaugeMetricFamily("inferq_queue_jobs", "Jobs waiting in a model's queue, by priority "
                                  "(0 most urgent).", labels=["model", "priority"])
        for (model, prio), n in s.depth.items():
            depth.add_metric([model, str(prio)], n)
        yield depth
        age = GaugeMetricFamily("inferq_queue_oldest_job_age_seconds", "Age of the oldest job waiting "
                                "in a model's queue since it was (re)queued; 0 when none waits.", labels=["model"])
        for model in {m for m, _ in s.depth}:
            age.add_metric([model], max(0.0, s.now - s.oldest[model]) if model in s.oldest else 0.0)
        yield age
        jobs = GaugeMetricFamily("inferq_jobs", "Jobs not finished, by status (queued: in the queue, "
                                 "not cancelled; running: held by live workers).", labels=["model", "status"])
        for model in {m for m, _ in s.depth}:
            jobs.add_metric([model, "queued"], sum(n for (m, _), n in s.depth.items() if m == model))
            jobs.add_metric([model, "running"], s.running.get(model, 0))
        yield jobs
        workers = GaugeMetricFamily("inferq_workers", "Workers heartbeating, live (awake) or draining, and "
                                    "multi-model workers holding the model asleep (asleep).", labels=["model", "state"])
        for (model, state), n in s.workers.items():
            workers.add_metric([model, state], n)
        yield workers
        tenants = GaugeMetricFamily("inferq_tenant_jobs", "Jobs of each tenant (an API key, or the tenant "
                                    "its keys-file line names) queued and running, for fair share.",
                                    labels=["model", "tenant", "status"])
        for (model, tenant, status), n in sorted(s.tenants.items()):
            tenants.add_metric([model, tenant, status], n)
        yield tenants
        classes = GaugeMetricFamily("inferq_class_jobs", "Jobs of each service class queued (batch: the batch "
                                    "lane's) and held by live workers.", labels=["model", "class", "status"])
        for (model, cls, status), n in sorted(s.classes.items()):
            classes.add_metric([model, cls, status], n)
        yield classes
        yield GaugeMetricFamily("inferq_batches_active", "Batches (the Batch API) not yet ended.", value=s.batches)
        yield from self._counters()

    def _counters(self) -> Iterator[Metric]:
        fams = {
            "submitted": CounterMetricFamily("inferq_jobs_submitted", "Jobs accepted into the queue.",
                                             labels=["model"]),
            "end": CounterMetricFamily("inferq_jobs_finished", "Jobs that reached a terminal status, by "
                                       "status (invalid: failed for the client's input) and error code ('' "
                                       "unless failed or invalid).", labels=["model", "status", "code"]),
            "requeue": CounterMetricFamily("inferq_job_redeliveries", "Jobs sent to the queue again, by "
                                           "reason (worker_lost, engine_failure, worker_shutdown, "
                                           "event_write_failed, message_lost, message_stranded, preempted).",
                                           labels=["model", "reason"]),
            "reaped": CounterMetricFamily("inferq_workers_reaped", "Workers found dead (no heartbeat for "
                                          "INFERQ_WORKER_TTL_S) and removed by a reaper.", labels=["model"]),
            "served": CounterMetricFamily("inferq_tenant_served_tokens", "Tokens served to each tenant (prompt "
                                          "and output of its ended jobs), what fair share evens out.",
                                          labels=["model", "tenant"]),
            "batch_line": CounterMetricFamily("inferq_batch_lines", "Batch requests answered, by outcome "
                                              "(ok: output file; error: error file).", labels=["outcome"]),
        }
        expired = CounterMetricFamily("inferq_job_deadline_expiries", "Jobs that failed at their deadline "
                                      "(inferq_jobs_finished_total with code deadline_exceeded).", labels=["model"])
        deadline: dict[str, int] = {}
        for name, n in self.snap.stats.items():
            kind, *labels = name.split(keys.STAT_SEP)
            if kind in fams and len(labels) == _ARITY[kind]:
                fams[kind].add_metric(labels, n)
            if kind == "end" and labels[-1:] == ["deadline_exceeded"]:
                deadline[labels[0]] = deadline.get(labels[0], 0) + n
        for model, n in deadline.items():
            expired.add_metric([model], n)
        yield from fams.values()
        yield expired


def exposition(snap: QueueSnapshot) -> bytes:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(QueueCollector(snap))
    return generate_latest(registry)
