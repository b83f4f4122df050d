"""Chaos scenarios about what the fleet counts and keeps (the others: tests/chaos/scenarios.py).

- ``cancel_depth``: every engine slot busy, the queue filled to ``INFERQ_MAX_QUEUE_DEPTH``, then every
  queued job cancelled: their messages wait in the queue's lists until a worker pops and skips them,
  and the next submission must be admitted at once all the same.
- ``short_ttl``: gateway and workers restarted with a 120 s job TTL and a 60 s timeout; long jobs at the
  engines' full batch, whose records and logs are brought to the last seconds of their TTL while they
  run (as if they had run that long since their last refresh): no job may vanish, every job ends, and
  afterwards no worker lists a job it does not run (``/v1/queue`` shows 0 running).
"""

from __future__ import annotations

import asyncio
import signal
from typing import Any

from inferq.shared import keys
from inferq.shared.redis import make_redis
from inferq.shared.schemas import TERMINAL_STATUSES
from inferq.shared.settings import Settings
from tests.chaos.client import Client, figures
from tests.chaos.scenarios import long_jobs, run_jobs
from tests.fleet import Fleet
from tests.wait import WaitTimeout, eventually_async

SCENARIOS = ["cancel_depth", "short_ttl"]
#: short_ttl's fleet: a job's record lives 120 s past its last refresh, the longest deadline and the margin
SHORT_TTL = {"INFERQ_JOB_TTL_S": "120", "INFERQ_MAX_TIMEOUT_S": "60", "INFERQ_DEFAULT_TIMEOUT_S": "60"}


async def _queue(client: Client, model: str) -> dict[str, Any]:
    """The model's entry of ``GET /v1/queue``."""
    return next(m for m in (await client.http.get("/v1/queue")).json()["models"] if m["model"] == model)


async def _fill(client: Client, depth: int) -> tuple[list[str], int]:
    """Submit short jobs until one is refused: their ids and the refusal's status code."""
    ids: list[str] = []
    while len(ids) <= depth:
        r = await client.http.post("/v1/jobs", json={"prompt": "wait", "max_tokens": 8})
        if r.status_code != 202:
            return ids, r.status_code
        ids.append(r.json()["id"])
    return ids, 202


async def _left(fleet: Fleet, model: str) -> tuple[int, int]:
    """Messages left in the model's queue lists, and jobs still counted as cancelled in them."""
    r = make_redis(fleet.redis_url)
    try:
        lists = keys.queue_lists(model)
        return (sum([await r.llen(q) for q in lists]),
                sum([await r.zcard(keys.queue_cancelled(q)) for q in lists]))
    finally:
        await r.aclose()


def _engine_seqs(max_num_seqs: int, env: dict[str, str]) -> int:
    """A worker's engine sequences as its settings make them: its slots and the interactive reserve."""
    return Settings.model_validate({"max_num_seqs": max_num_seqs,
                                    "service_classes": env.get("INFERQ_SERVICE_CLASSES", "true"),
                                    "interactive_reserve": env.get("INFERQ_INTERACTIVE_RESERVE")}).engine_max_num_seqs


async def cancel_depth(fleet: Fleet, client: Client, max_tokens: int = 6000) -> dict[str, Any]:
    """Long jobs in every engine sequence, the queue filled until a 429, every queued job cancelled, then one
    more submission: it must be admitted (202) at once, and the queue must show 0, then 1, queued."""
    env = fleet.env()
    depth = int(env["INFERQ_MAX_QUEUE_DEPTH"])
    workers = (await client.http.get("/v1/workers")).json()
    # every engine sequence: the slots and the interactive reserve beside them (these jobs are interactive)
    model, slots = workers[0]["model"], sum(_engine_seqs(w["max_num_seqs"], env) for w in workers)
    busy = list(await asyncio.gather(*(client.submit(long_jobs(max_tokens)(i)) for i in range(slots))))
    await eventually_async(lambda: _queue(client, model), 300, "every slot busy and nothing queued",
                           until=lambda v: v["running"] >= slots and v["queued"] == 0, interval=0.5)
    queued, full = await _fill(client, depth)
    cancelled = [(await client.http.delete(f"/v1/jobs/{j}")).json()["status"] for j in queued]
    shown = (await _queue(client, model))["queued"]
    nxt = await client.http.post("/v1/jobs", json={"prompt": "after the cancels", "max_tokens": 8})
    shown_after = (await _queue(client, model))["queued"]
    for job_id in busy:
        await client.http.delete(f"/v1/jobs/{job_id}")
    ends = await asyncio.gather(*(client.final(j, 300) for j in busy))
    fresh = await client.final(nxt.json()["id"], 300) if nxt.status_code == 202 else None
    try:
        left = await eventually_async(lambda: _left(fleet, model), 120, "the cancelled jobs' messages popped",
                                      until=lambda n: n == (0, 0), interval=0.5)
    except WaitTimeout:
        left = await _left(fleet, model)
    return {"submitted": slots + len(queued) + 1, "succeeded": int(bool(fresh) and fresh["status"] == "succeeded"),
            "failed": {}, "lost": sum(e is None for e in ends) + (nxt.status_code == 202 and fresh is None),
            "busy": slots, "depth": depth, "filled": len(queued), "refused_with": full,
            "cancelled": sum(s == "cancelled" for s in cancelled), "queued_shown_after_cancel": shown,
            "next_submission": nxt.status_code, "queued_shown_after_it": shown_after,
            "busy_ended": sum(e is not None and e["status"] in TERMINAL_STATUSES for e in ends),
            "messages_left": left[0], "cancelled_left": left[1]}


def _restart(fleet: Fleet, env: dict[str, str | None], workers: int) -> None:
    """Gateway and workers again, with ``env`` over the fleet's (None: back to the fleet's own)."""
    for name, value in env.items():
        if value is None:
            fleet.extra_env.pop(name, None)
        else:
            fleet.extra_env[name] = value
    for wid in fleet.live():
        fleet.kill_worker(wid, signal.SIGTERM)
    assert fleet.gateway is not None
    fleet.gateway.stop(signal.SIGTERM)
    fleet.start_gateway()
    wids = [fleet.start_worker(wait=False) for _ in range(workers)]
    for wid in wids:
        fleet.wait_worker(wid, 240)


async def _running_ids(fleet: Fleet, ids: list[str]) -> list[str]:
    r = make_redis(fleet.redis_url)
    try:
        now = list(ids)
        statuses = [await r.hget(keys.job(j), "status") for j in now]
        return [j for j, st in zip(now, statuses, strict=True) if st == '"running"']
    finally:
        await r.aclose()


async def _squeeze(fleet: Fleet, ids: list[str], jobs: int, left_s: float) -> int:
    """Once most jobs run, leave each running job's record and log ``left_s`` of their TTL."""
    await eventually_async(lambda: len(ids) >= jobs, 300, f"all {jobs} jobs submitted")
    running = await eventually_async(lambda: _running_ids(fleet, ids), 120, "most jobs running",
                                     until=lambda got: len(got) >= jobs // 2, interval=0.5)
    r = make_redis(fleet.redis_url)
    try:
        for job_id in running:
            await r.pexpire(keys.job(job_id), int(left_s * 1000))
            await r.pexpire(keys.job_log(job_id), int(left_s * 1000))
    finally:
        await r.aclose()
    return len(running)


async def short_ttl(fleet: Fleet, client: Client, jobs: int = 64, max_tokens: int = 1900,
                    left_s: float = 10.0) -> dict[str, Any]:
    """The fleet on a 120 s job TTL and a 60 s timeout and default timeout (the shortest the settings allow):
    all jobs at once, each running job's record and log left ``left_s`` of their TTL. Every job must
    end (succeeded, or failed at its 60 s deadline), none may be gone, none left listed as running."""
    await asyncio.to_thread(_restart, fleet, dict(SHORT_TTL), 2)
    try:
        model = (await client.http.get("/v1/workers")).json()[0]["model"]
        outcomes, squeezed = await run_jobs(client, jobs, long_jobs(max_tokens), concurrency=jobs,
                                            during=lambda ids: _squeeze(fleet, ids, jobs, left_s))
        try:
            view = await eventually_async(lambda: _queue(client, model), 60, "no job counted as running",
                                          until=lambda v: v["running"] == 0, interval=0.5)
        except WaitTimeout:
            view = await _queue(client, model)
    finally:
        await asyncio.to_thread(_restart, fleet, dict.fromkeys(SHORT_TTL), 0)
    report = figures(outcomes)
    report.update(max_tokens=max_tokens, squeezed=squeezed, left_s=left_s, running_after=view["running"],
                  queued_after=view["queued"])
    return report


def problems(name: str, r: dict[str, Any]) -> list[str]:
    """What went wrong in one of these scenarios (beyond lost, corrupted and bare closes)."""
    if name == "cancel_depth":
        bad = [] if r["next_submission"] == 202 else [f"the next submission got {r['next_submission']}"]
        if r["refused_with"] != 429 or r["cancelled"] != r["filled"] or r["queued_shown_after_cancel"]:
            bad.append("the queue was not refused when full, or cancelled jobs still showed as queued")
        if r["succeeded"] != 1 or r["busy_ended"] != r["busy"] or r["messages_left"] or r["cancelled_left"]:
            bad.append("a job did not end, or cancelled jobs' messages stayed counted")
        return bad
    bad = [f"failed other than at the deadline: {r['failed']}"] if set(r["failed"]) - {"deadline_exceeded"} else []
    if r["succeeded"] + sum(r["failed"].values()) != r["submitted"] or not r["squeezed"]:
        bad.append("not every job ended, or no job was caught running")
    if r["running_after"]:
        bad.append(f"{r['running_after']} jobs still counted as running afterwards")
    return bad


def cell(name: str, r: dict[str, Any]) -> str:
    """What is particular to the scenario, in a few words."""
    if name == "cancel_depth":
        return (f"{r['busy']} slots busy; queue filled to {r['filled']} (limit {r['depth']}), then "
                f"{r['refused_with']}; {r['cancelled']} cancelled: queued shown {r['queued_shown_after_cancel']}, "
                f"next submission {r['next_submission']}, then queued {r['queued_shown_after_it']}; "
                f"messages left afterwards {r['messages_left']}")
    return (f"job TTL, timeout 60 s; {r['max_tokens']} tokens each, all at once; {r['squeezed']} running jobs "
            f"left {r['left_s']:g} s of TTL; running counted afterwards {r['running_after']}")
