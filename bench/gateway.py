"""Gateway alone: how many streamed tokens/s one gateway process can fan out.

No engine and no worker: a publisher plays N running jobs and appends their token events through
:meth:`JobStore.append` (the worker's write path: Lua fencing, log, pub/sub), at a fixed offered
rate; one client process follows every job over ``WS /v1/jobs/{id}/stream`` (``--client ws``) or
streams it as an OpenAI chat completion (``--client sse``). Each event carries
its publish time, so the client measures publish-to-client latency. The gateway is pinned to one
core and everything else to the others, and its CPU time is read from /proc, so the result is
also given per gateway CPU-second: the capacity of one process on one core, even when the
load generator (not the gateway) is what runs out of CPU first.

``python -m bench gateway --rates 10000,25000,50000 [--jobs 64] [--seconds 8] [--tokens-per-event 1]``
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import secrets
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import psutil

from bench.clients import HttpClients
from bench.stack import Procs, base_env, free_port, http_ok, py_spy, start_redis
from bench.sysinfo import cpu_model
from inferq.shared.redis import make_redis, texts
from inferq.shared.schemas import DoneEvent, JobRecord, JobRequest, JobStatus, TokenEvent
from inferq.shared.store import JobStore

TICK_S = 0.005
STAMP_LEN = 17  # an event's text: its publish time, f"{t:017.6f}"
PUBLISHER = "bench-publisher"


class _Tally:
    """What a client process saw: tokens, messages, the first and last arrival, and each event's
    latency (its publish time is its text); ``ready`` is set once all ``n`` streams are open."""

    def __init__(self, k: int, n: int, ready: Any) -> None:
        self.k, self.n, self.ready = k, n, ready
        self.lat: list[float] = []
        self.stats: dict[str, Any] = {"tokens": 0, "messages": 0, "first": float("inf"), "last": 0.0}
        self.started = 0

    def got(self, text: str) -> None:
        """One message: one publish time per event in it (a stream may merge events)."""
        now = time.time()
        stamps = [text[i:i + STAMP_LEN] for i in range(0, len(text), STAMP_LEN)]
        self.lat.extend(now - float(t) for t in stamps)
        self.stats["tokens"] += self.k * len(stamps)
        self.stats["messages"] += 1
        self.stats["first"] = min(self.stats["first"], now)
        self.stats["last"] = now

    def opened(self) -> None:
        self.started += 1
        if self.started == self.n:
            self.ready.set()

    def report(self) -> dict[str, Any]:
        a = np.array(self.lat) * 1000
        return {**self.stats, "latency_ms": {p: float(np.percentile(a, q)) for p, q in
                                             (("p50", 50), ("p99", 99), ("max", 100))} if a.size else {}}


async def _ws_follow(base: str, job_id: str, tally: _Tally) -> None:
    from websockets.asyncio.client import connect

    async with connect(f"{base.replace('http', 'ws')}/v1/jobs/{job_id}/stream", max_queue=None) as c:
        tally.opened()  # the client offers permessage-deflate, as browsers do
        async for raw in c:
            ev = json.loads(raw)
            if ev["type"] != "token":
                return
            tally.got(ev["text"])


async def _sse_follow(http: HttpClients, tally: _Tally) -> None:
    body = {"model": "inferq-tiny", "messages": [{"role": "user", "content": "x"}], "stream": True}
    tally.opened()  # the gateway answers once the first token is there: the publisher waits for the jobs
    async with http.stream("POST", "/v1/chat/completions", json=body) as r:
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            choices = json.loads(line[6:])["choices"]
            if choices and (text := choices[0]["delta"].get("content")):
                tally.got(text)


def _client(base: str, jobs: list[str] | int, k: int, ready: Any, out: Any) -> None:
    """Follow every job (WebSocket: the given job ids; SSE: ``jobs`` new chat completions that the
    publisher then claims); report tokens, timing and latency percentiles."""
    tally = _Tally(k, jobs if isinstance(jobs, int) else len(jobs), ready)

    async def main() -> None:
        if isinstance(jobs, int):
            async with HttpClients(base) as http:
                await asyncio.gather(*(_sse_follow(http, tally) for _ in range(jobs)))
        else:
            await asyncio.gather(*(_ws_follow(base, j, tally) for j in jobs))
        out.put(tally.report())

    asyncio.run(main())


async def _subscribed(store: JobStore, job_ids: list[str], timeout: float = 30) -> None:
    """Wait until the gateway's hub listens on every job's channel."""
    from inferq.shared import keys

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        counts = await store.redis.pubsub_numsub(*[keys.job_channel(j) for j in job_ids])
        if all(n >= 1 for _, n in counts):
            return
        await asyncio.sleep(0.1)
    raise TimeoutError("the gateway did not subscribe to every job's channel")


async def _publish(store: JobStore, job_ids: list[str], rate: float, per_job: int, k: int) -> float:
    """Append ``per_job`` token events (``k`` tokens each) to every job at ``rate`` tokens/s in
    total, then each job's final event. Returns the seconds it took."""
    events_per_tick = max(1, round(rate / k * TICK_S))
    order = [(j, s) for s in range(1, per_job + 1) for j in job_ids]  # round robin over the jobs
    t0 = time.monotonic()
    for i in range(0, len(order), events_per_tick):
        items = [(j, 1, TokenEvent(seq=s, text=f"{time.time():017.6f}", n_tokens=k))
                 for j, s in order[i:i + events_per_tick]]
        res = await store.append(items)
        if not all(r is True for r in res):
            raise RuntimeError(f"append refused: {[r for r in res if r is not True][:3]}")
        ahead = t0 + (i + events_per_tick) / (rate / k) - time.monotonic()
        if ahead > 0:
            await asyncio.sleep(ahead)
    wall = time.monotonic() - t0
    for j in job_ids:
        done = DoneEvent(seq=per_job + 1, status=JobStatus.succeeded, finish_reason="length")
        await store.finish(j, PUBLISHER, 1, done, status="succeeded")
    return wall


async def _jobs(store: JobStore, n: int) -> list[str]:
    """``n`` jobs, each claimed by the publisher (running, attempt 1), as a worker would."""
    ids = []
    for _ in range(n):
        rec = JobRecord(id=f"job-{secrets.token_hex(16)}", model="bench", request=JobRequest(prompt="x", max_tokens=1))
        await store.create(rec)
        ids.append(rec.id)
    return ids


async def _claim(store: JobStore, job_ids: list[str] | None, n: int, timeout: float = 60) -> list[str]:
    """Claim the given jobs, or (``None``) the first ``n`` that the gateway queues."""
    from inferq.shared import keys

    deadline = time.monotonic() + timeout
    while job_ids is None:
        queued = texts(await store.redis.zrange(keys.QUEUED, 0, -1))
        if len(queued) >= n:
            job_ids = queued[:n]
        elif time.monotonic() > deadline:
            raise TimeoutError(f"only {len(queued)} of {n} jobs were queued")
        else:
            await asyncio.sleep(0.05)
    for j in job_ids:
        claim = await store.claim(j, PUBLISHER)
        assert claim is not None and claim.attempt == 1, (j, claim)
    return job_ids


def run_rate(redis_url: str, base: str, gw: psutil.Process, kind: str, rate: float, jobs: int,
             seconds: float, k: int, profile: Path | None = None) -> dict[str, object]:
    """One offered rate; with ``profile``, py-spy records the gateway while tokens flow."""
    per_job = max(1, round(rate * seconds / k / jobs))

    async def create() -> list[str]:
        r = make_redis(redis_url)
        try:
            return await _jobs(JobStore(r, ttl_s=600), jobs)
        finally:
            await r.aclose()

    job_ids = asyncio.run(create()) if kind == "ws" else None
    ctx = mp.get_context("spawn")
    ready, out = ctx.Event(), ctx.Queue()
    client = ctx.Process(target=_client, args=(base, job_ids if job_ids is not None else jobs, k, ready, out))
    client.start()
    if not ready.wait(60):
        client.kill()
        raise TimeoutError("the client could not open its streams")
    spy: subprocess.Popen[bytes] | None = None

    async def publish() -> tuple[float, float]:
        r = make_redis(redis_url)
        s = JobStore(r, ttl_s=600)
        ids = await _claim(s, job_ids, jobs)
        await _subscribed(s, ids)
        nonlocal spy
        spy = _profile(gw.pid, seconds, profile) if profile else None
        cpu0 = sum(gw.cpu_times()[:2])
        wall = await _publish(s, ids, rate, per_job, k)
        await r.aclose()
        return wall, cpu0

    wall, cpu0 = asyncio.run(publish())
    if spy is not None:
        spy.wait(60)
    res = out.get(timeout=120)
    cpu = sum(gw.cpu_times()[:2]) - cpu0
    client.join(10)
    span = res["last"] - res["first"]
    delivered = res["tokens"] / span if span > 0 else 0.0
    return {"client": kind, "offered_tok_s": rate, "tokens_per_event": k, "jobs": jobs, "tokens": res["tokens"],
            "expected_tokens": per_job * jobs * k, "client_messages": res["messages"], "publish_s": round(wall, 3),
            "deliver_s": round(span, 3),
            "delivered_tok_s": round(delivered), "gateway_cpu_s": round(cpu, 3),
            "gateway_cpu_util": round(cpu / span, 3) if span > 0 else None,
            "tok_per_gateway_cpu_s": round(res["tokens"] / cpu) if cpu > 0 else None,
            "latency_ms": {p: round(v, 2) for p, v in res["latency_ms"].items()}}


def _profile(pid: int, seconds: float, path: Path) -> subprocess.Popen[bytes] | None:
    if (exe := py_spy()) is None:
        print("py-spy not found; no profile", file=sys.stderr)
        return None
    return subprocess.Popen([exe, "record", "-p", str(pid), "-d", str(int(seconds)), "-r", "200", "--gil",
                             "-f", "raw", "-o", str(path)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def top_frames(raw: Path, n: int = 25, inclusive: bool = False) -> list[tuple[str, float]]:
    """Time per function from py-spy's collapsed stacks (self time, or with ``inclusive`` the
    time with the function anywhere on the stack), as shares of all samples."""
    per: dict[str, int] = {}
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        frames = stack.split(";")
        for f in set(frames) if inclusive else frames[-1:]:
            name = f.split(" (")[0] + " (" + f.split("/")[-1] if "(" in f else f
            per[name] = per.get(name, 0) + int(count)
        total += int(count)
    return [(f, c / total) for f, c in sorted(per.items(), key=lambda x: -x[1])[:n]]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench gateway", description=__doc__.split("\n\n")[0])
    p.add_argument("--rates", default="10000,25000,50000,75000", help="offered tokens/s, comma-separated")
    p.add_argument("--client", choices=["ws", "sse"], default="ws",
                   help="ws: WS /v1/jobs/{id}/stream; sse: streamed POST /v1/chat/completions")
    p.add_argument("--jobs", type=int, default=64, help="concurrent streams")
    p.add_argument("--seconds", type=float, default=8.0, help="publishing time per rate")
    p.add_argument("--tokens-per-event", type=int, default=1, help="tokens per message (worker coalescing)")
    p.add_argument("--ws-compression", action="store_true",
                   help="let the gateway accept permessage-deflate (the client offers it)")
    p.add_argument("--no-pin", action="store_true", help="do not pin the gateway to its own core")
    p.add_argument("--profile", help="py-spy the gateway during the last rate; collapsed stacks to this file")
    p.add_argument("--out", help="write the results as JSON here")
    a = p.parse_args(argv)
    rates = [float(r) for r in a.rates.split(",")]
    cpus = sorted(os.sched_getaffinity(0))
    pin = not a.no_pin and len(cpus) > 1
    with tempfile.TemporaryDirectory() as logdir, Procs(Path(logdir)) as procs:
        redis = procs.add(start_redis(free_port(), procs.logdir, env=base_env()))
        redis_url = redis.url
        gport = free_port()
        gw = procs.start("gateway", [sys.executable, "-m", "inferq.cli", "api", "--port", str(gport), "--workers", "1"],
                         base_env(INFERQ_REDIS_URL=redis_url, INFERQ_LOG_LEVEL="WARNING",
                                  INFERQ_WS_COMPRESSION=str(a.ws_compression).lower()))
        base = f"http://127.0.0.1:{gport}"
        procs.wait(lambda: http_ok(f"{base}/healthz"), 60, "gateway")
        gwp = psutil.Process(gw.proc.pid)
        if pin:
            gwp.cpu_affinity(cpus[:1])
            for proc in (psutil.Process(redis.proc.pid), psutil.Process()):
                proc.cpu_affinity(cpus[1:])
        results = []
        for i, rate in enumerate(rates):
            prof = Path(a.profile) if a.profile and i == len(rates) - 1 else None
            r = run_rate(redis_url, base, gwp, a.client, rate, a.jobs, a.seconds, a.tokens_per_event, prof)
            results.append(r)
            print(json.dumps(r), flush=True)
            if prof is not None and prof.exists():
                for inclusive in (False, True):
                    print("inclusive" if inclusive else "self")
                    for f, share in top_frames(prof, inclusive=inclusive):
                        print(f"  {share:6.1%}  {f}")
    doc = {"benchmark": "gateway-alone", "client": a.client, "cpus": len(cpus), "pinned": pin,
           "ws_compression": a.ws_compression, "cpu_model": cpu_model(),
           "results": results}
    if a.out:
        Path(a.out).write_text(json.dumps(doc, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
