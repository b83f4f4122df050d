"""Chaos scenario ``classes``: interactive and batch work on one fleet, a worker killed while it holds
batch jobs that were preempted (docs/design.md, "Service classes").

A Batch API job fills the workers' job slots with batch work; then more long interactive jobs arrive
than the workers' interactive reserves hold, so the workers hand batch jobs back to make room
(``restart`` events, reason ``preempted``) and those run again. Once a worker runs a batch job that
was preempted before, it is SIGKILLed (and replaced): the reaper takes its jobs back. Afterwards
every line of the batch is answered once, with all its tokens, none failed; every interactive job
ends once, its stream replaying to its text (``figures``: lost and corrupted 0).
"""

from __future__ import annotations

import asyncio
import json
import signal
from typing import Any

from inferq.api.batches.runner import line_job_ids
from inferq.api.batches.schemas import BatchRecord
from inferq.shared import keys
from inferq.shared.redis import make_redis
from tests.chaos.client import Client, figures
from tests.chaos.scenarios import long_jobs, run_jobs
from tests.fleet import Fleet
from tests.wait import WaitTimeout, eventually_async

SCENARIOS = ["classes"]


async def _batch(client: Client, lines: int, max_tokens: int) -> str:
    body = "".join(json.dumps({"custom_id": f"line-{i}", "method": "POST", "url": "/v1/completions", "body": {
        "prompt": f"bulk line {i}:", "max_tokens": max_tokens, "ignore_eos": True, "temperature": 0}}) + "\n"
        for i in range(lines))
    f = await client.http.post("/v1/files", files={"file": ("bulk.jsonl", body.encode())}, data={"purpose": "batch"})
    f.raise_for_status()
    b = await client.http.post("/v1/batches", json={"input_file_id": f.json()["id"], "endpoint": "/v1/completions",
                                                    "completion_window": "24h"})
    b.raise_for_status()
    return str(b.json()["id"])


async def _line_jobs(fleet: Fleet, batch_id: str, lines: int) -> list[str]:
    r = make_redis(fleet.redis_url)
    try:
        rec = BatchRecord.model_validate_json(await r.hget(keys.batch(batch_id), "record"))
    finally:
        await r.aclose()
    return [line_job_ids(rec, i, 1)[0] for i in range(lines)]


async def _preempted_holder(fleet: Fleet, jobs: list[str], timeout: float) -> str | None:
    """A live worker of the fleet running a batch job that was preempted before (None: none seen)."""
    r = make_redis(fleet.redis_url)

    async def holder() -> str | None:
        for job_id in jobs:
            status, worker, preempted = await r.hmget(keys.job(job_id), ["status", "worker", "preemptions"])
            wid = json.loads(worker) if worker else None
            if status == '"running"' and preempted and wid in fleet.live():
                return str(wid)
        return None

    try:
        return await eventually_async(holder, timeout, "a worker running a batch job preempted before", interval=0.2)
    except WaitTimeout:
        return None
    finally:
        await r.aclose()


async def _preemptions(fleet: Fleet, jobs: list[str]) -> int:
    r = make_redis(fleet.redis_url)
    try:
        return sum(int(n or 0) for n in [await r.hget(keys.job(j), "preemptions") for j in jobs])
    finally:
        await r.aclose()


async def _audit(client: Client, batch_id: str, lines: int, max_tokens: int, timeout: float) -> dict[str, Any]:
    async def ended() -> dict[str, Any] | None:
        b = (await client.http.get(f"/v1/batches/{batch_id}")).json()
        return dict(b) if b["status"] in ("completed", "failed", "cancelled", "expired") else None

    b = await eventually_async(ended, timeout, f"batch {batch_id} to end", interval=1.0)
    out: dict[str, Any] = {"status": b["status"], "counts": b["request_counts"], "answered": 0, "answered_twice": 0,
                           "short": 0, "error_lines": 0}
    if b.get("output_file_id"):
        rows = [json.loads(x) for x in (await client.http.get(f"/v1/files/{b['output_file_id']}/content")).text
                .splitlines() if x.strip()]
        ids = [row["custom_id"] for row in rows]
        out.update(answered=len(rows), answered_twice=len(ids) - len(set(ids)),
                   short=sum(row["response"]["body"]["usage"]["completion_tokens"] != max_tokens for row in rows))
    if b.get("error_file_id"):
        out["error_lines"] = len((await client.http.get(f"/v1/files/{b['error_file_id']}/content")).text.split())
    out["lines"] = lines
    return out


async def classes(fleet: Fleet, client: Client, batch_lines: int = 96, batch_tokens: int = 300, chats: int = 96,
                  chat_tokens: int = 200) -> dict[str, Any]:
    batch_id = await _batch(client, batch_lines, batch_tokens)
    batch_jobs = await _line_jobs(fleet, batch_id, batch_lines)
    killed: dict[str, Any] = {}

    async def kill(_: list[str]) -> None:
        wid = await _preempted_holder(fleet, batch_jobs, 240)
        if wid is None:
            return
        killed["killed"] = wid
        await asyncio.to_thread(fleet.kill_worker, wid, signal.SIGKILL)
        fleet.start_worker(wait=False)

    r = make_redis(fleet.redis_url)  # the batch's first lines are running: the slots are taken by batch work
    try:
        await eventually_async(lambda: r.hlen(keys.batch_part(batch_id, "running")), 120, "batch lines running",
                               until=lambda n: n >= batch_lines // 2)
    finally:
        await r.aclose()
    outcomes, _ = await run_jobs(client, chats, long_jobs(chat_tokens), concurrency=chats, during=kill)
    audit = await _audit(client, batch_id, batch_lines, batch_tokens, 900)
    for wid in fleet.live():
        await asyncio.to_thread(fleet.wait_worker, wid)
    report = figures(outcomes)
    report.update(killed, batch=audit, preempted=await _preemptions(fleet, batch_jobs),
                  workers_alive=len(fleet.live()), workers=len(fleet.workers))
    return report


def problems(r: dict[str, Any]) -> list[str]:
    bad = []
    b = r["batch"]
    if b["status"] != "completed" or b["answered"] != b["lines"] or b["answered_twice"] or b["short"] or \
            b["error_lines"]:
        bad.append(f"the batch did not answer every line once with all its tokens: {b}")
    if not r.get("preempted"):
        bad.append("no batch job was preempted (the interactive jobs did not need the batch's slots)")
    if not r.get("killed"):
        bad.append("no worker was seen running a batch job preempted before, to kill")
    return bad


def cell(r: dict[str, Any]) -> str:
    b = r["batch"]
    return (f"a Batch API job of {b['lines']} lines beside {r['submitted']} long interactive jobs: batch jobs "
            f"preempted {r['preempted']} times, worker {r.get('killed')} SIGKILLed while it ran one; the batch "
            f"{b['status']}, {b['answered']} lines answered ({b['answered_twice']} twice, {b['short']} short)")
