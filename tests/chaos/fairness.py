"""Chaos scenario ``fairness``: one API key cannot starve another (a fleet of its own).

Four keys from a keys file, each its own tenant: ``a``, ``b`` and ``d`` of weight 1, ``c`` of
weight 3; two workers; fair share on (the default).

1. **Backlog.** Key ``a`` queues 10,000 jobs; then key ``b`` sends short probe jobs (4 tokens),
   one after another. Reported: each probe's wait in the queue (``started_at - created_at``) and
   its time end to end. Twice: with jobs of exactly 1,000 tokens (the engines' 64 sequences start
   together and end together, so a free slot comes once a job's run time: a probe must start
   within one job's run time), and with jobs of 500 to 1,500 tokens (1,000 on average: slots come
   free about every half second: queued p50 ≤ 2 s).
2. **Flood.** ``a``'s backlog cancelled, all four keys queue backlogs of 100-token jobs (``c`` three
   times as many). Once every one is queued, the tokens each tenant is served over a window
   (``inferq_tenant_served_tokens_total`` on ``/metrics``, read at its start and end). Targets:
   ``a`` and ``b`` within 10 % of each other; ``c`` : ``d`` within 10 % of 3 : 1; every tenant
   still had jobs queued at the window's end (else the window measured nothing).
"""

from __future__ import annotations

import asyncio
import random
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from tests.chaos.client import Client
from tests.fleet import Fleet
from tests.wait import eventually_async

SCENARIOS = ["fairness"]
WEIGHTS = {"a": 1, "b": 1, "c": 3, "d": 1}
KEY = "chaos-fair-{}"


def _keys_file(folder: Path) -> Path:
    f = folder / "keys.txt"
    f.write_text("".join(f"{KEY.format(t)} tenant {t} tenant={t} weight={w}\n" for t, w in WEIGHTS.items()))
    return f


async def _many(client: Client, n: int, body: dict[str, Any] | Callable[[], dict[str, Any]],
                concurrency: int = 48) -> list[str]:
    """Submit ``n`` jobs of ``body`` (or of what it makes, each), ``concurrency`` at a time; their ids."""
    sem, ids = asyncio.Semaphore(concurrency), []

    async def one() -> None:
        async with sem:
            r = await client.http.post("/v1/jobs", json=body() if callable(body) else body)
            r.raise_for_status()
            ids.append(r.json()["id"])

    await asyncio.gather(*(one() for _ in range(n)))
    return ids


async def _cancel(client: Client, ids: list[str], concurrency: int = 48) -> None:
    sem = asyncio.Semaphore(concurrency)

    async def one(job_id: str) -> None:
        async with sem:
            await client.http.delete(f"/v1/jobs/{job_id}")

    await asyncio.gather(*(one(j) for j in ids))


async def _tenants(client: Client) -> tuple[dict[str, float], dict[str, float]]:
    """Tokens served and jobs queued, by tenant, as ``/metrics`` says now."""
    served: dict[str, float] = {}
    queued: dict[str, float] = {}
    text = (await client.http.get("/metrics")).text
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == "inferq_tenant_served_tokens_total":
                served[s.labels["tenant"]] = served.get(s.labels["tenant"], 0) + s.value
            elif s.name == "inferq_tenant_jobs" and s.labels["status"] == "queued":
                queued[s.labels["tenant"]] = queued.get(s.labels["tenant"], 0) + s.value
    return served, queued


async def _probe(client: Client) -> tuple[float, float] | None:
    """One short job: (seconds queued, seconds end to end), or None if it did not succeed."""
    job_id = (await _many(client, 1, {"prompt": "probe", "max_tokens": 4, "ignore_eos": True}))[0]
    v = await client.final(job_id, 120)
    if v is None or v["status"] != "succeeded":
        return None
    return v["started_at"] - v["created_at"], v["finished_at"] - v["created_at"]


async def _backlog(a: Client, b: Client, jobs: int, tokens: int, spread: int, probes: int) -> dict[str, Any]:
    """``a`` queues ``jobs`` of ``tokens`` ± ``spread`` tokens, ``b`` sends ``probes`` one at a time;
    then ``a`` cancels its backlog."""
    rng = random.Random(jobs)
    t0 = time.time()
    ids = await _many(a, jobs, lambda: {"prompt": "flood", "ignore_eos": True,
                                        "max_tokens": tokens + rng.randint(-spread, spread)})
    queued_s = round(time.time() - t0, 1)
    waits = [await _probe(b) for _ in range(probes)]
    ok = [w for w in waits if w is not None]
    ran = [v for v in [await a.final(i, 0.1) for i in ids[:64]] if v and v["status"] == "succeeded"]
    await _cancel(a, ids)

    async def idle() -> bool:  # the cancelled jobs that were running have ended
        return all(m["running"] == 0 for m in (await a.http.get("/v1/queue")).json()["models"])
    await eventually_async(idle, 120, "the cancelled backlog's running jobs to end", interval=0.5)
    return {"jobs": jobs, "tokens": tokens, "spread": spread, "queued_in_s": queued_s, "probes": probes,
            "probes_failed": probes - len(ok), "probe_queued_s": _summary([w[0] for w in ok]),
            "probe_total_s": _summary([w[1] for w in ok]),
            "job_run_s": _summary([v["finished_at"] - v["started_at"] for v in ran])}


async def scenario(fleet: Fleet, backlog: int = 10_000, backlog_tokens: int = 1000, probes: int = 10,
                   flood: int = 1000, flood_tokens: int = 100, window_s: float = 45.0) -> dict[str, Any]:
    clients = {t: Client(fleet.base, fleet.ws, KEY.format(t)) for t in WEIGHTS}
    try:
        same = await _backlog(clients["a"], clients["b"], backlog, backlog_tokens, 0, max(1, probes // 3))
        varied = await _backlog(clients["a"], clients["b"], backlog, backlog_tokens, backlog_tokens // 2, probes)
        body = {"prompt": "share", "max_tokens": flood_tokens, "ignore_eos": True}
        flood_ids = await asyncio.gather(*(_many(c, flood * WEIGHTS[t], body) for t, c in clients.items()))
        served0, _ = await _tenants(clients["a"])
        await asyncio.sleep(window_s)
        served1, queued1 = await _tenants(clients["a"])
        got = {t: served1.get(t, 0) - served0.get(t, 0) for t in WEIGHTS}
        for t, ids in zip(WEIGHTS, flood_ids, strict=True):
            await _cancel(clients[t], ids)
        return {
            "submitted": 2 * backlog + same["probes"] + probes + sum(len(ids) for ids in flood_ids),
            "same_length": same, "varied_length": varied,
            "window_s": window_s, "flood_tokens": flood_tokens, "served_tokens": got,
            "queued_at_window_end": {t: queued1.get(t, 0) for t in WEIGHTS},
            "a_to_b": round(got["a"] / got["b"], 3) if got["b"] else None,
            "c_to_d": round(got["c"] / got["d"], 3) if got["d"] else None,
            "workers_alive": len(fleet.live()), "workers": len(fleet.workers),
        }
    finally:
        for c in clients.values():
            await c.aclose()


def _summary(xs: list[float]) -> dict[str, float]:
    return {"p50": round(statistics.median(xs), 2), "max": round(max(xs), 2)} if xs else {}


def problems(r: dict[str, Any]) -> list[str]:
    bad = []
    same, varied = r["same_length"], r["varied_length"]
    if same["probes_failed"] or varied["probes_failed"]:
        bad.append(f"probes failed: {same['probes_failed']} + {varied['probes_failed']}")
    if same["probe_queued_s"].get("max", 1e9) > same["job_run_s"].get("max", 0):
        bad.append(f"a probe queued {same['probe_queued_s'].get('max')} s, longer than one job's run "
                   f"({same['job_run_s'].get('max')} s)")
    if varied["probe_queued_s"].get("p50", 1e9) > 2.0:
        bad.append(f"probes behind the varied backlog queued p50 {varied['probe_queued_s'].get('p50')} s (> 2 s)")
    if r["a_to_b"] is None or abs(r["a_to_b"] - 1) > 0.1:
        bad.append(f"a : b served {r['a_to_b']} (not within 10 % of 1)")
    if r["c_to_d"] is None or abs(r["c_to_d"] / 3 - 1) > 0.1:
        bad.append(f"c : d served {r['c_to_d']} (not within 10 % of 3)")
    if not all(r["queued_at_window_end"].values()):
        bad.append(f"a tenant ran out of queued jobs in the window: {r['queued_at_window_end']}")
    return bad


def cell(r: dict[str, Any]) -> str:
    def backlog(x: dict[str, Any]) -> str:
        q, tot = x["probe_queued_s"], x["probe_total_s"]
        size = f"{x['tokens']:,}" + (f" ± {x['spread']:,}" if x["spread"] else "")
        return (f"key a queued {x['jobs']:,} jobs of {size} tokens (in {x['queued_in_s']} s; a job ran "
                f"{x['job_run_s'].get('p50')} s): key b's {x['probes']} probes of 4 tokens queued p50/max "
                f"{q.get('p50')}/{q.get('max')} s, end to end {tot.get('p50')}/{tot.get('max')} s")
    return (f"{backlog(r['same_length'])}; {backlog(r['varied_length'])}. Then 4 keys flooding "
            f"{r['flood_tokens']}-token jobs, served over {r['window_s']:g} s: a : b = {r['a_to_b']} "
            f"(weights 1 : 1), c : d = {r['c_to_d']} (weights 3 : 1)")


def run(logdir: Path, extra_env: dict[str, str], sizes: dict[str, Any]) -> dict[str, Any]:
    """The scenario on a fleet of its own, started and stopped here."""
    folder = logdir / "fairness"
    folder.mkdir(parents=True, exist_ok=True)
    env = {**extra_env, "INFERQ_API_KEYS": "", "INFERQ_API_KEYS_FILE": str(_keys_file(folder)),
           "INFERQ_MAX_QUEUE_DEPTH": "20000", "INFERQ_FAIR_SHARE": "true"}
    fleet = Fleet(folder, extra_env=env, api_key=KEY.format("a"))
    try:
        fleet.start()
        return asyncio.run(scenario(fleet, **sizes))
    finally:
        fleet.stop()
