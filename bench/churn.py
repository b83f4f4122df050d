"""Churn: a real gateway taking in new requests while it streams others, on any machine.

At a level where every request has the same length, a closed loop runs in waves: N streams end
together and N new requests arrive at once, on a gateway still busy with the tails of the last
ones. This puts one real gateway process (pinned to one core) in front of one real ``inferq
worker`` on the paced stand-in engine of the intake bench (one token per running job every
``--step-ms``; real Celery, job runner, event writer, Redis), and drives it with the harness's own
closed-loop client over SSE (streamed chat completions) or WebSocket (``WS /v1/generate``). It
reports throughput and, from each job's record, where the time to first token went: ingest
(request sent -> job record made, i.e. the gateway's intake), queued, to first token, delivery.
With ``--profile`` py-spy records the gateway during the measured level.

``python -m bench churn --client sse [--clients 64] [--requests 256] [--tokens 64] [--step-ms 20]
[--profile F] [--out F]``
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

import psutil

from bench import clients
from bench.config import Level
from bench.intake import MODEL, start_standin_worker
from bench.load import RequestResult, run_level
from bench.stack import Procs, base_env, free_port, http_ok, py_spy, start_redis
from bench.sysinfo import cpu_model

TEXT = "the quick brown fox jumps over the lazy dog " * 6


def _body(kind: str, i: int, tokens: int) -> dict[str, Any]:
    common = {"max_tokens": tokens, "temperature": 0, "ignore_eos": True}
    if kind == "sse":
        return {"model": MODEL, "stream": True, "stream_options": {"include_usage": True},
                "messages": [{"role": "user", "content": f"{i} {TEXT}"}], **common}
    return {"prompt": f"{i} {TEXT}", **common}


def _median_ms(results: list[RequestResult], field: str) -> float | None:
    values = [getattr(r, field) for r in results if getattr(r, field) is not None]
    return round(1e3 * statistics.median(values), 1) if values else None


async def _drive(base: str, a: argparse.Namespace, gateway_pid: int) -> dict[str, Any]:
    kind = "inferq-sse" if a.client == "sse" else "inferq-ws"
    async with clients.http_client(base) as http:
        spec = clients.SendSpec(kind, base, "/v1/chat/completions" if a.client == "sse" else "", a.tokens, {})
        send = clients.sender(spec, http)
        level = Level("closed", float(a.clients))
        await run_level(level, [(i, _body(a.client, i, a.tokens)) for i in range(a.clients)], send, 300)  # warm-up
        spy = None
        if a.profile:
            exe = py_spy()
            if exe is None:
                raise SystemExit("--profile needs py-spy next to the interpreter (pip install py-spy)")
            spy = subprocess.Popen([exe, "record", "-p", str(gateway_pid), "-r", "200", "--format", "raw",
                                    "-o", a.profile, "--nonblocking"], stdout=subprocess.DEVNULL,
                                   stderr=subprocess.DEVNULL)
        gateway = psutil.Process(gateway_pid)
        cpu0 = sum(gateway.cpu_times()[:2])
        reqs = [(i, _body(a.client, 100_000 + i, a.tokens)) for i in range(a.requests)]
        results, wall = await run_level(level, reqs, send, 300)
        cpu = sum(gateway.cpu_times()[:2]) - cpu0
        if spy is not None:
            spy.send_signal(2)
            spy.wait(30)
        ok = [r for r in results if r.ok]
        for r in ok:
            if r.job_id:
                await clients.job_stages(http, r)
    tokens = sum(r.out_tokens for r in ok)
    return {"client": a.client, "clients": a.clients, "requests": a.requests, "ok": len(ok),
            "wall_s": round(wall, 2), "out_tok_s": round(tokens / wall), "gateway_cpu_s": round(cpu, 2),
            "gateway_cpu_s_per_1k_tok": round(1e3 * cpu / tokens, 4) if tokens else None,
            "ms_p50": {f: _median_ms(ok, f) for f in ("ttft", "ingest", "queued", "to_first_token", "delivery")}}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench churn", description=__doc__.split("\n\n")[0])
    p.add_argument("--client", choices=("sse", "ws"), default="sse", help="sse: streamed chat completions; "
                   "ws: WS /v1/generate")
    p.add_argument("--clients", type=int, default=64, help="closed-loop clients (= the worker's slots)")
    p.add_argument("--requests", type=int, default=256, help="requests measured (after one warm-up wave)")
    p.add_argument("--tokens", type=int, default=64, help="tokens per request")
    p.add_argument("--step-ms", type=float, default=20.0, help="the stand-in engine's step time")
    p.add_argument("--profile", help="py-spy the gateway during the measured level; raw stacks to this file")
    p.add_argument("--out", help="write the results as JSON here")
    a = p.parse_args(argv)
    with Procs(Path(os.environ.get("TMPDIR", "/tmp"))) as procs:
        redis = procs.add(start_redis(free_port(), procs.logdir, name="redis-churn-bench"))
        start_standin_worker(procs, "worker-churn-bench", redis.url, a.clients, a.step_ms)
        port = free_port()
        pin = ["taskset", "-c", "0"] if (os.cpu_count() or 1) > 1 else []
        gw = procs.start("gateway-churn-bench", [*pin, sys.executable, "-m", "inferq.cli", "api", "--port", str(port)],
                         base_env(INFERQ_REDIS_URL=redis.url, INFERQ_SERVED_MODEL_NAME=MODEL,
                                  INFERQ_LOG_LEVEL="WARNING"))
        base = f"http://127.0.0.1:{port}"
        procs.wait(lambda: http_ok(f"{base}/readyz", lambda body: body.get("workers") == 1), 180,
                   "the gateway and the stand-in worker")
        row = asyncio.run(_drive(base, a, gw.proc.pid))
    doc = {"benchmark": "gateway-churn", "cpu": cpu_model(), "cpus": os.cpu_count(), "tokens_per_request": a.tokens,
           "step_ms": a.step_ms, "python": sys.version.split()[0], **row}
    print(json.dumps(doc))
    if a.out:
        Path(a.out).write_text(json.dumps(doc, indent=2) + "\n")
    return 0 if row["ok"] == a.requests else 1
