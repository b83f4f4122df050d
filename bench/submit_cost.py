"""What a submit costs Redis with fair share on, against the depth of the queue.

job_submit.lua puts a job's Celery message into its list in virtual-tag order (shared/fairshare.py):
a message that belongs deep inside the list is placed by walking the list to it. This fills one
list of a redis-server of its own with ``depth`` queued jobs of one tenant (a backlog), then times
(Redis' own count, SLOWLOG, microseconds of the script alone) the submits that place a job:

- ``front``: a new tenant's first job, which belongs at the popping end, ahead of the whole backlog;
- ``middle``: a new tenant's job whose cost is half the backlog's, which belongs in its middle;
- ``back``: the backlogged tenant's next job, which goes behind everything.

    python -m bench.submit_cost [--depths 10000 100000] [--probes 20] [--out F]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import uuid
from pathlib import Path
from typing import Any

from bench.stack import Procs, free_port, start_redis
from bench.sysinfo import cpu_model
from inferq.shared import keys
from inferq.shared.celery_app import job_message, make_celery
from inferq.shared.fairshare import Share, fair_share
from inferq.shared.redis import make_redis
from inferq.shared.schemas import JobRecord, JobRequest
from inferq.shared.settings import Settings
from inferq.shared.store import JobStore

MODEL = "bench-submit"
JOB_COST = 11  # a 4-character prompt and 10 tokens out, as the gateway charges it


def _job(celery: Any, cost: int) -> tuple[JobRecord, str, str]:
    rec = JobRecord(id=f"job-{uuid.uuid4().hex}", model=MODEL, request=JobRequest(prompt="abcd", max_tokens=10))
    queue_list, message = job_message(celery, rec.message())
    return rec, queue_list, message if cost else ""


async def _fill(store: JobStore, celery: Any, depth: int, batch: int = 500) -> None:
    share = fair_share(Share("backlog"), JOB_COST, True)
    for start in range(0, depth, batch):
        jobs = [_job(celery, JOB_COST) for _ in range(min(batch, depth - start))]
        await asyncio.gather(*(store.submit(r, ql, m, 10**9, share) for r, ql, m in jobs))


async def _probe(store: JobStore, celery: Any, tenant: str, cost: int) -> float:
    """One submit of a job of ``tenant`` charged ``cost``: the script's own time (µs, SLOWLOG)."""
    r = store.redis
    await r.slowlog_reset()
    rec, ql, msg = _job(celery, cost)
    await store.submit(rec, ql, msg, 10**9, fair_share(Share(tenant), cost, True))
    got = [e for e in await r.slowlog_get(16) if b"EVALSHA" in e["command"] or "EVALSHA" in str(e["command"])]
    return float(got[0]["duration"]) if got else float("nan")


async def measure(url: str, depths: list[int], probes: int) -> dict[str, Any]:
    r = make_redis(url)
    s = Settings(redis_url=url, served_model_name=MODEL)
    store, celery = JobStore(r, s.job_ttl_s), make_celery(s)
    await r.config_set("slowlog-log-slower-than", 0)
    out: dict[str, Any] = {}
    try:
        for depth in depths:
            await r.flushdb()
            await _fill(store, celery, depth)
            placed = {
                "front": [await _probe(store, celery, f"new-{i}", JOB_COST) for i in range(probes)],
                "middle": [await _probe(store, celery, f"big-{i}", JOB_COST * depth // 2) for i in range(probes)],
                "back": [await _probe(store, celery, "backlog", JOB_COST) for _ in range(probes)],
            }
            length = await r.llen(keys.queue_lists(MODEL)[5])
            out[str(depth)] = {"list_length": length, **{k: {"p50_us": statistics.median(v), "max_us": max(v)}
                                                         for k, v in placed.items()}}
            said = [f"{k} p50 {v['p50_us']:.0f} µs (max {v['max_us']:.0f})" for k, v in out[str(depth)].items()
                    if k != "list_length"]
            print(f"depth {depth:>7,} (list {length:,}): " + ", ".join(said), flush=True)
    finally:
        await r.aclose()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--depths", type=int, nargs="+", default=[10_000, 100_000])
    ap.add_argument("--probes", type=int, default=20)
    ap.add_argument("--out", type=Path)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp, Procs(Path(tmp)) as procs:
        redis_proc = procs.add(start_redis(free_port(), Path(tmp), name="redis-submit"))
        result = {"host": cpu_model(), "depths": asyncio.run(measure(redis_proc.url, a.depths, a.probes))}
    if a.out:
        a.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
