"""The chaos scenarios. Each runs jobs on a live fleet while it injects one kind of trouble (or
none), and returns its figures (``client.figures``) plus what is particular to it.

- ``load``: long jobs at the engines' full batch, nothing injected: nothing may be reaped.
- ``sigstop``: a busy worker (and its engine) frozen past its TTL, then resumed.
- ``redis_down``: Redis killed for longer than the 30 s write budget, then back (append-only file).
- ``expiry``: a job's record expires while its log still lives.
- ``poison``: requests and queue messages built to choke the gateway or a worker.
- ``faults``: workers SIGKILLed (and replaced) and Redis restarted while jobs run.
- ``hot_prefix``: the worker that cache-affine pull draws a shared prefix's jobs to, SIGKILLed mid-load.

``cancel_depth`` and ``short_ttl`` (what the queue counts, records of long jobs) are in
tests/chaos/bookkeeping.py.
``slow_clients`` (half-sent requests holding the gateway's connections) is in tests/chaos/slowloris.py.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from inferq.shared import keys
from inferq.shared.celery_app import make_celery
from inferq.shared.redis import make_redis
from inferq.shared.schemas import JobRecord, JobRequest
from inferq.shared.settings import Settings
from inferq.shared.store import JobStore
from tests.chaos.client import Client, Followed, Outcome, figures, summary
from tests.fleet import Fleet
from tests.wait import WaitTimeout, eventually_async

Body = Callable[[int], dict[str, Any]]


def long_jobs(max_tokens: int) -> Body:
    return lambda i: {"prompt": f"chaos {i}:", "max_tokens": max_tokens, "ignore_eos": True, "temperature": 0}


async def run_jobs(client: Client, n: int, body: Body, concurrency: int,
                   during: Callable[[list[str]], Awaitable[Any]] | None = None) -> tuple[list[Outcome], Any]:
    """Submit ``n`` jobs (``concurrency`` in flight), follow each to its end while ``during(ids)``
    runs (``ids`` fills as jobs are accepted), then poll and replay every one."""
    run, sem, ids = uuid.uuid4().hex[:8], asyncio.Semaphore(concurrency), []

    async def one(i: int) -> tuple[str, Followed]:
        async with sem:
            job_id = await client.submit(body(i), f"chaos-{run}-{i}")
            ids.append(job_id)
            return job_id, await client.follow(job_id, 600)

    async def nothing(_: list[str]) -> None:
        return None

    followed, extra = await asyncio.gather(asyncio.gather(*(one(i) for i in range(n))), (during or nothing)(ids))
    outcomes = await asyncio.gather(*(client.outcome(job_id, f) for job_id, f in followed))
    return list(outcomes), extra


async def load(fleet: Fleet, client: Client, jobs: int = 64, max_tokens: int = 2000) -> dict[str, Any]:
    """All jobs at once, at the fleet's full batch; no fault. ``reaped`` must be 0."""
    t0 = time.time()
    outcomes, _ = await run_jobs(client, jobs, long_jobs(max_tokens), concurrency=jobs)
    report = figures(outcomes)
    report.update(max_tokens=max_tokens, reaped=report["restarts"].get("worker_lost", 0),
                  wall_s=round(time.time() - t0, 1), cancel_to_abort_s=summary(await client.cancel_to_abort(3)))
    return report


async def sigstop(fleet: Fleet, client: Client, jobs: int = 16, max_tokens: int = 1500) -> dict[str, Any]:
    """Freeze the worker (and its engine) that runs the first job, for two TTLs, then resume it:
    its jobs are taken back and run elsewhere; the resumed worker stops those attempts, writes
    nothing more for them, and registers again."""
    ttl = float(fleet.env()["INFERQ_WORKER_TTL_S"])
    frozen: dict[str, Any] = {}

    async def freeze(ids: list[str]) -> None:
        view = await _any_running(client, ids, fleet)
        if view is None:
            return
        wid = frozen["worker"] = view["worker"]
        pid = fleet.workers[wid].pid
        os.killpg(pid, signal.SIGSTOP)
        await asyncio.sleep(2 * ttl + 2)
        os.killpg(pid, signal.SIGCONT)
        frozen["stopped_s"] = 2 * ttl + 2
        await asyncio.to_thread(fleet.wait_worker, wid, 60)  # listed (and not draining) again
        frozen["registered_again"] = True

    outcomes, _ = await run_jobs(client, jobs, long_jobs(max_tokens), concurrency=jobs, during=freeze)
    report = figures(outcomes)
    report.update(frozen, reaped=report["restarts"].get("worker_lost", 0),
                  workers_alive=len(fleet.live()), workers=len(fleet.workers))
    return report


async def _any_running(client: Client, ids: list[str], fleet: Fleet, timeout: float = 120) -> dict[str, Any] | None:
    """The view of the first of ``ids`` seen running with some text on a worker of the fleet."""
    async def running() -> dict[str, Any] | None:
        for job_id in list(ids):
            v = (await client.http.get(f"/v1/jobs/{job_id}")).json()
            if v["status"] == "running" and v["text"] and v.get("worker") in fleet.workers:
                return dict(v)
        return None

    try:
        return await eventually_async(running, timeout, "a job running with text on a worker of the fleet")
    except WaitTimeout:
        return None


async def redis_down(fleet: Fleet, client: Client, jobs: int = 16, max_tokens: int = 1500,
                     down_s: float = 40.0) -> dict[str, Any]:
    """SIGKILL Redis while every job runs and keep it down past the event-write budget. An
    attempt that could not log an event stops and its job runs again: none may end `succeeded`
    with a hole in its log. Sockets that cannot be served are told why (an error event)."""
    async def outage(ids: list[str]) -> None:
        await eventually_async(lambda: len(ids) >= jobs, 300, f"all {jobs} jobs submitted")
        await client.wait_running(ids[-1])
        await asyncio.to_thread(fleet.restart_redis, down_s)

    outcomes, _ = await run_jobs(client, jobs, long_jobs(max_tokens), concurrency=jobs, during=outage)
    report = figures(outcomes)
    report.update(down_s=down_s, told=sum(o.followed.told for o in outcomes),
                  workers_alive=len(fleet.live()), workers=len(fleet.workers))
    return report


async def expiry(fleet: Fleet, owner: Client, other: Client) -> dict[str, Any]:
    """A finished job's record expires while its log is still there (forced with PEXPIRE, as if
    its TTL ran out first). Nobody may read the job afterwards: not its owner, not another key."""
    job_id = await owner.submit({"prompt": "expire me", "max_tokens": 16})
    final = await owner.final(job_id, 120)
    r = make_redis(fleet.redis_url)
    try:
        ttls = (await r.ttl(keys.job(job_id)), await r.ttl(keys.job_log(job_id)))
        before = {"owner": (await owner.http.get(f"/v1/jobs/{job_id}")).status_code,
                  "other": (await other.http.get(f"/v1/jobs/{job_id}")).status_code}
        await r.pexpire(keys.job(job_id), 1)
        await eventually_async(lambda: r.exists(keys.job(job_id)), 10, "the record to expire", until=lambda n: n == 0,
                               interval=0.01)
        log_left = await r.exists(keys.job_log(job_id))
    finally:
        await r.aclose()
    after, leaked = {}, 0
    for name, c in (("owner", owner), ("other", other)):
        after[f"{name}_poll"] = (await c.http.get(f"/v1/jobs/{job_id}")).status_code
        events = await c.replay(job_id)
        after[f"{name}_stream"] = "refused" if events is None else f"{len(events)} events"
        leaked += after[f"{name}_poll"] < 400 or events is not None
    return {"submitted": 1, "succeeded": int(final is not None and final["status"] == "succeeded"), "before": before,
            "record_ttl_s": ttls[0], "log_ttl_s": ttls[1], "log_left_after_record": bool(log_left),
            "after": after, "leaked": leaked}


def _nest(levels: int) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "string"}
    for _ in range(levels):
        schema = {"type": "object", "properties": {"a": schema}}
    return schema


POISON: list[tuple[str, str, str, dict[str, Any] | None]] = [
    ("json_schema nested 230 levels", "POST", "/v1/jobs", {"prompt": "x", "json_schema": _nest(230)}),
    ("json_schema nested 300 levels", "POST", "/v1/jobs", {"prompt": "x", "json_schema": _nest(300)}),
    ("chat response_format nested 230", "POST", "/v1/chat/completions",
     {"model": "inferq-tiny", "messages": [{"role": "user", "content": "x"}],
      "response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": _nest(230)}}}),
    ("prompt of 2 MB", "POST", "/v1/jobs", {"prompt": "x" * 2_000_000}),
    ("max_tokens 10**9", "POST", "/v1/jobs", {"prompt": "x", "max_tokens": 10**9}),
    ("n = 10**6", "POST", "/v1/jobs", {"prompt": "x", "n": 10**6}),
    ("unknown model", "POST", "/v1/jobs", {"prompt": "x", "model": "no/such:model"}),
    ("id naming another key of the job", "GET", "/v1/jobs/job-00000000000000000000000000000000:log", None),
    ("DELETE of such an id", "DELETE", "/v1/jobs/job-00000000000000000000000000000000:log", None),
    ("id of 10 kB", "GET", "/v1/jobs/" + "a" * 10_000, None),
]


async def poison(fleet: Fleet, client: Client, jobs: int = 8) -> dict[str, Any]:
    """While ordinary jobs run: requests meant to choke the gateway or a worker (each must get a
    4xx), WebSockets with bad ids or offsets (each must get an error event), and two Celery
    messages no worker can decode (their jobs must end `failed`; no worker may go down)."""
    answers: dict[str, int | str] = {}

    async def attack(_: list[str]) -> dict[str, str]:
        for name, method, path, body in POISON:
            try:
                r = await client.http.request(method, path, json=body)
                answers[name] = r.status_code
            except Exception as e:
                answers[name] = type(e).__name__
        ws = {}
        for name, path, after in (("stream of {id}:log", "/v1/jobs/job-00000000000000000000000000000000:log/stream", 0),
                                  ("after=10**23", "/v1/jobs/job-00000000000000000000000000000000/stream",
                                   "99999999999999999999999")):
            ws[name] = await _ws_refusal(client, path, after)
        return {**ws, **await _undecodable(fleet)}

    outcomes, extra = await run_jobs(client, jobs, long_jobs(200), concurrency=jobs, during=attack)
    report = figures(outcomes)
    bad = {k: v for k, v in answers.items() if not (isinstance(v, int) and 400 <= v < 500)}
    report.update(requests=answers, not_4xx=len(bad), sockets_and_messages=extra,
                  workers_alive=len(fleet.live()), workers=len(fleet.workers))
    return report


async def _ws_refusal(client: Client, path: str, after: int | str) -> str:
    try:
        async with connect(client.ws_url(path, after), open_timeout=10) as ws:
            ev = json.loads(await ws.recv())
            await ws.wait_closed()
            return f"{ev.get('type')} {(ev.get('error') or {}).get('type')}, close {ws.close_code}"
    except ConnectionClosed as e:
        return f"closed {e.rcvd.code if e.rcvd else 1006} with no event"


def _deep_message(job_id: str, levels: int = 230) -> str:
    schema = '{"type":"object","properties":{"a":' * levels + '{"type":"string"}' + "}}" * levels
    return '{"id":"%s","model":"m","request":{"prompt":"x","json_schema":%s},"created_at":0}' % (job_id, schema)


async def _undecodable(fleet: Fleet) -> dict[str, str]:
    """Two queued jobs whose Celery message no worker can decode, sent as the gateway sends."""
    settings = Settings(redis_url=fleet.redis_url)
    app, r = make_celery(settings), make_redis(fleet.redis_url)
    store, out = JobStore(r, 3600), {}
    try:
        # messages mangled on the way (their records are fine): the job must end failed, not hang
        for name, payload in (("message nested 230 levels", _deep_message),
                              ("message that is not JSON", lambda job_id: f"{job_id} \xff not json")):
            rec = JobRecord(id=f"job-{uuid.uuid4().hex}", model=settings.model_name, request=JobRequest(prompt="p"))
            await store.create(rec)
            await asyncio.to_thread(app.send_task, keys.TASK_NAME, args=[payload(rec.id)], task_id=rec.id,
                                    queue=keys.queue(rec.model))
            try:
                got = await eventually_async(lambda rec=rec: store.get(rec.id), 120, f"job {rec.id} to end",
                                             until=lambda got: got is not None and got.status.terminal, interval=0.5)
            except WaitTimeout:
                got = await store.get(rec.id)
            out[name] = f"{got.status.value} {got.error.code if got.error else None}" if got else "gone"
    finally:
        await r.aclose()
    return out


async def faults(fleet: Fleet, client: Client, jobs: int = 200, kills: int = 3, redis_restarts: int = 1,
                 max_tokens: int = 120, concurrency: int = 16, gap_s: float = 4.0,
                 replace: bool = True) -> dict[str, Any]:
    """Random workers SIGKILLed every ``gap_s`` (``replace``: a new one started each time) and Redis
    restarted, in a random order, while the jobs run."""
    kill_times: list[float] = []

    async def chaos(_: list[str]) -> None:
        actions = ["kill"] * kills + ["redis"] * redis_restarts
        random.shuffle(actions)
        for action in actions:
            await asyncio.sleep(gap_s)
            if action == "kill" and fleet.live():
                kill_times.append(time.time())
                await asyncio.to_thread(fleet.kill_worker, random.choice(fleet.live()), signal.SIGKILL)
                if replace:
                    fleet.start_worker(wait=False)
            elif action == "redis":
                await asyncio.to_thread(fleet.restart_redis, 1.0)

    t0 = time.time()
    outcomes, _ = await run_jobs(client, jobs, long_jobs(max_tokens), concurrency, during=chaos)
    for wid in fleet.live():
        await asyncio.to_thread(fleet.wait_worker, wid)
    redelivery = []
    for o in outcomes:
        started = (o.final or {}).get("started_at")
        if started and any(e["type"] == "restart" for e in o.replay or []):
            before = [k for k in kill_times if k < started]
            if before:
                redelivery.append(started - before[-1])
    report = figures(outcomes)
    report.update(kills=len(kill_times), redis_restarts=redis_restarts, restarted_jobs=len(redelivery),
                  redelivery_s=summary(redelivery), wall_s=round(time.time() - t0, 1),
                  cancel_to_abort_s=summary(await client.cancel_to_abort(3)))
    return report


async def hot_prefix(fleet: Fleet, client: Client, jobs: int = 48, max_tokens: int = 600,
                     concurrency: int = 24) -> dict[str, Any]:
    """Jobs that share one long prompt prefix, so that cache-affine pull draws them to the worker
    that ran it first (through its lane); that worker SIGKILLed mid-load and replaced: its running
    jobs and those waiting in its lane run elsewhere, none lost or run twice."""
    prefix = Path(json.__file__).read_text()[:3000]  # ~1,000 tokens of the tiny model's tokenizer
    killed: dict[str, Any] = {}

    async def kill_holder(ids: list[str]) -> None:
        view = await _any_running(client, ids, fleet)
        if view is None:
            return
        wid = killed["killed"] = view["worker"]
        await asyncio.to_thread(fleet.kill_worker, wid, signal.SIGKILL)
        fleet.start_worker(wait=False)

    def body(i: int) -> dict[str, Any]:
        return {"prompt": f"{prefix}\n# job {i}\n", "max_tokens": max_tokens, "ignore_eos": True, "temperature": 0}

    outcomes, _ = await run_jobs(client, jobs, body, concurrency, during=kill_holder)
    for wid in fleet.live():
        await asyncio.to_thread(fleet.wait_worker, wid)
    report = figures(outcomes)
    ended_on: dict[str, int] = {}
    for o in outcomes:
        worker = str((o.final or {}).get("worker"))
        ended_on[worker] = ended_on.get(worker, 0) + 1
    report.update(killed, ended_on=ended_on, workers_alive=len(fleet.live()), workers=len(fleet.workers))
    return report


async def run_chaos(fleet: Fleet, jobs: int, kills: int, redis_restarts: int, **kw: Any) -> dict[str, Any]:
    """The ``faults`` scenario with a client of its own (the fleet's tests call this)."""
    client = Client(fleet.base, fleet.ws)
    try:
        return await faults(fleet, client, jobs, kills, redis_restarts, **kw)
    finally:
        await client.aclose()
