"""The chaos suite: jobs under load while workers are SIGKILLed and Redis restarts.

    python -m tests.chaos --jobs 200 --kills 3 --redis-restarts 1 --out docs/reliability-run.json
    python -m tests.chaos --jobs 64 --kills 0 --redis-restarts 0 --max-tokens 2000 \
        --concurrency 64 --worker-ttl 3 --max-num-seqs 32       # load alone: nothing may be reaped

Every job is submitted with an Idempotency-Key (and retried through outages), followed over a
WebSocket that reconnects with ``?after=SEQ``, and finally polled. Reported: submitted,
succeeded, failed (by reason), lost (never reached a final state: must be 0), duplicated (a client
saw a seq twice or assembled text that differs from the job's: must be 0), redelivery times
(kill -> the job running again elsewhere) and cancel-to-abort times.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import signal
import statistics
import tempfile
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
from websockets.asyncio.client import connect
from websockets.exceptions import WebSocketException

from inferq.shared.schemas import TERMINAL_STATUSES
from tests.fleet import Fleet



async def _submit(http: httpx.AsyncClient, body: dict[str, Any], key: str) -> str:
    for _ in range(120):
        try:
            r = await http.post("/v1/jobs", json=body, headers={"Idempotency-Key": key})
            if r.status_code == 202:
                return str(r.json()["id"])
        except httpx.HTTPError:
            pass
        await asyncio.sleep(0.5)
    raise RuntimeError("could not submit for 60 s")


async def _follow(ws_base: str, job_id: str, timeout: float) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        last = events[-1]["seq"] if events else 0
        try:
            async with connect(f"{ws_base}/v1/jobs/{job_id}/stream?after={last}", open_timeout=5) as ws:
                async for raw in ws:
                    ev = json.loads(raw)
                    if ev["seq"] == 0:  # the gateway's own error (e.g. the store was away): retry
                        break
                    events.append(ev)
                    if ev["type"] in ("done", "error"):
                        return events
        except (OSError, WebSocketException, asyncio.TimeoutError):
            pass
        await asyncio.sleep(0.3)
    return events


async def _final(http: httpx.AsyncClient, job_id: str, timeout: float) -> dict[str, Any] | None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            r = await http.get(f"/v1/jobs/{job_id}")
            if r.status_code == 200 and r.json()["status"] in TERMINAL_STATUSES:
                return dict(r.json())
        except httpx.HTTPError:
            pass
        await asyncio.sleep(0.25)
    return None


def _client_text(events: list[dict[str, Any]]) -> tuple[str, bool]:
    """The text a careful client assembles (dropping text before a restart), and whether every
    seq arrived exactly once in order."""
    text, ok = "", [e["seq"] for e in events] == list(range(1, len(events) + 1))
    for e in events:
        if e["type"] == "restart":
            text = ""
        elif e["type"] == "token" and e.get("index", 0) == 0:
            text += e["text"]
    return text, ok


async def _cancel_to_abort(http: httpx.AsyncClient, n: int) -> list[float]:
    out = []
    for _ in range(n):
        job_id = await _submit(http, {"prompt": "cancel me", "max_tokens": 1500, "ignore_eos": True}, uuid.uuid4().hex)
        for _ in range(400):
            v = (await http.get(f"/v1/jobs/{job_id}")).json()
            if v["status"] == "running" and v["text"]:
                break
            await asyncio.sleep(0.05)
        t0 = time.time()
        await http.delete(f"/v1/jobs/{job_id}")
        v = await _final(http, job_id, 30)
        if v and v["status"] == "cancelled":
            out.append(v["finished_at"] - t0)
    return out


async def run_chaos(fleet: Fleet, jobs: int, kills: int, redis_restarts: int, max_tokens: int = 120,
                    concurrency: int = 16, gap_s: float = 4.0, replace: bool = True) -> dict[str, Any]:
    """``replace``: start a new worker after each kill (the fleet keeps its size; waiting for the
    new engines is most of a short run's time)."""
    run = uuid.uuid4().hex[:8]
    kill_times: list[float] = []
    sem = asyncio.Semaphore(concurrency)
    async with httpx.AsyncClient(base_url=fleet.base, timeout=30) as http:
        async def one(i: int) -> tuple[str, list[dict[str, Any]]]:
            async with sem:
                body = {"prompt": f"chaos {i}:", "max_tokens": max_tokens, "ignore_eos": True, "temperature": 0}
                job_id = await _submit(http, body, f"chaos-{run}-{i}")
                return job_id, await _follow(fleet.ws, job_id, 300)

        async def chaos() -> None:
            actions = ["kill"] * kills + ["redis"] * redis_restarts
            random.Random(run).shuffle(actions)
            for action in actions:
                await asyncio.sleep(gap_s)
                if action == "kill" and fleet.live():
                    victim = random.choice(fleet.live())
                    kill_times.append(time.time())
                    await asyncio.to_thread(fleet.kill_worker, victim, signal.SIGKILL)
                    if replace:
                        fleet.start_worker(wait=False)
                elif action == "redis":
                    await asyncio.to_thread(fleet.restart_redis, 1.0)

        followed, _ = await asyncio.gather(asyncio.gather(*(one(i) for i in range(jobs))), chaos())
        finals = await asyncio.gather(*(_final(http, job_id, 300) for job_id, _ in followed))
        for wid in fleet.live():
            await asyncio.to_thread(fleet.wait_worker, wid)
        cancel_times = await _cancel_to_abort(http, 3)

    failed: Counter[str] = Counter()
    succeeded = lost = duplicated = 0
    redelivery: list[float] = []
    restarts: Counter[str] = Counter()  # restart events by reason (a job lost by its attempt)
    for (job_id, events), final in zip(followed, finals):
        restarts.update(e.get("reason", "?") for e in events if e["type"] == "restart")
        if final is None:
            lost += 1
            continue
        if final["status"] == "succeeded":
            succeeded += 1
        else:
            err = final.get("error") or {}
            failed[err.get("code") or err.get("type") or final["status"]] += 1
        text, in_order = _client_text(events)
        if not in_order or (final["status"] == "succeeded" and text != final["text"]):
            duplicated += 1
        if any(e["type"] == "restart" for e in events) and kill_times and final.get("started_at"):
            before = [k for k in kill_times if k < final["started_at"]]
            if before:
                redelivery.append(final["started_at"] - before[-1])
    return {
        "submitted": jobs, "succeeded": succeeded, "failed": dict(failed), "lost": lost,
        "duplicated": duplicated, "restarted_jobs": len(redelivery), "restarts": dict(restarts),
        "kills": len(kill_times),
        "redis_restarts": redis_restarts,
        "redelivery_s": _summary(redelivery), "cancel_to_abort_s": _summary(cancel_times),
    }


def _summary(xs: list[float]) -> dict[str, float | int]:
    if not xs:
        return {"n": 0}
    return {"n": len(xs), "p50": round(statistics.median(xs), 3), "max": round(max(xs), 3)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--jobs", type=int, default=200)
    p.add_argument("--kills", type=int, default=3)
    p.add_argument("--redis-restarts", type=int, default=1)
    p.add_argument("--max-tokens", type=int, default=120)
    p.add_argument("--concurrency", type=int, default=16, help="jobs in flight at once")
    p.add_argument("--worker-ttl", type=float, help="INFERQ_WORKER_TTL_S (default: the fleet's)")
    p.add_argument("--max-num-seqs", type=int, help="INFERQ_MAX_NUM_SEQS (default: the fleet's)")
    p.add_argument("--out", type=Path)
    a = p.parse_args()
    env = {k: str(v) for k, v in (("INFERQ_WORKER_TTL_S", a.worker_ttl), ("INFERQ_MAX_NUM_SEQS", a.max_num_seqs))
           if v is not None}
    fleet = Fleet(Path(tempfile.mkdtemp(prefix="inferq-chaos-")), extra_env=env)
    try:
        fleet.start()
        t0 = time.time()
        report = asyncio.run(run_chaos(fleet, a.jobs, a.kills, a.redis_restarts, a.max_tokens,
                                       concurrency=a.concurrency))
        report["wall_s"] = round(time.time() - t0, 1)
        report["logs"] = str(fleet.logdir)
    finally:
        fleet.stop()
    print(json.dumps(report, indent=2))
    if a.out:
        a.out.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
