"""Load generation shared by every target: closed loop (N clients) or open loop (Poisson arrivals).

A target is one coroutine ``send(index, request) -> RequestResult``; this module decides when to
call it, enforces the per-request timeout, and turns any exception into a failed result.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from bench import cpu
from bench.config import Level

STAGES = ("ingest", "queued", "to_first_token", "delivery")


@dataclass
class RequestResult:
    index: int
    ok: bool = False
    error: str | None = None
    start: float = 0.0            # seconds since the level started
    ttft: float | None = None     # first output visible to the client
    e2e: float | None = None
    itl: list[float] = field(default_factory=list)  # gaps between output chunks after the first
    out_tokens: int = 0
    prompt_tokens: int | None = None
    chunks: int = 0
    job_id: str | None = None
    queued: float | None = None   # inferq: started_at - created_at from GET /v1/jobs/{id}
    sent_at: float = 0.0          # wall clock when the request was sent (to place the job's times)
    # inferq, where the TTFT went (from the job's record, same host's clock): sent -> created_at
    # (ingest: the gateway up to the job's record), created_at -> started_at (queued), started_at ->
    # first_token_at (to_first_token: the worker's claim, tokenizing and the engine's first step),
    # first_token_at -> seen by the client (delivery: event log, pub/sub, gateway, socket)
    ingest: float | None = None
    to_first_token: float | None = None
    delivery: float | None = None

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["itl"] = [round(x, 6) for x in self.itl]
        for k in ("start", "ttft", "e2e", *STAGES):
            if d[k] is not None:
                d[k] = round(d[k], 6)
        return d


class Timer:
    """Client-side timestamps of one streamed request."""

    def __init__(self, result: RequestResult) -> None:
        self.r = result
        self.t0 = time.perf_counter()
        result.sent_at = time.time()
        self.last: float | None = None

    def chunk(self, n_tokens: int) -> None:
        """An output chunk with ``n_tokens`` tokens arrived now (n_tokens may be 0 if unknown)."""
        now = time.perf_counter()
        if self.last is None:
            self.r.ttft = now - self.t0
        else:
            self.r.itl.append(now - self.last)
        self.last = now
        self.r.chunks += 1
        self.r.out_tokens += n_tokens

    def done(self, expected_tokens: int | None) -> None:
        self.r.e2e = time.perf_counter() - self.t0
        if expected_tokens is not None and self.r.out_tokens != expected_tokens:
            self.r.ok, self.r.error = False, f"expected {expected_tokens} output tokens, got {self.r.out_tokens}"
        elif self.r.error is None:
            self.r.ok = True


Send = Callable[[int, Any], Awaitable[RequestResult]]


async def _one(send: Send, index: int, request: Any, timeout: float, t_level: float) -> RequestResult:
    start = time.perf_counter() - t_level
    try:
        r = await asyncio.wait_for(send(index, request), timeout)
    except TimeoutError:
        r = RequestResult(index=index, error=f"timed out after {timeout:g} s")
    except Exception as e:  # a failed request, not a failed benchmark
        r = RequestResult(index=index, error=f"{type(e).__name__}: {e}"[:500])
    r.start = start
    if r.error is not None:
        r.ok = False
    return r


async def run_level(level: Level, requests: Sequence[tuple[int, Any]], send: Send,
                    timeout: float, seed: int = 0) -> tuple[list[RequestResult], float]:
    """Send every request at this level; return the results (in request order) and the wall time."""
    t_level = time.perf_counter()
    results: list[RequestResult] = []
    if level.mode == "closed":
        queue = list(requests)[::-1]

        async def client() -> None:
            while queue:
                index, req = queue.pop()
                results.append(await _one(send, index, req, timeout, t_level))

        await asyncio.gather(*(client() for _ in range(max(1, int(level.value)))))
    else:
        rng = random.Random(seed)
        tasks: list[asyncio.Task[RequestResult]] = []
        at = 0.0
        for index, req in requests:
            delay = at - (time.perf_counter() - t_level)
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(_one(send, index, req, timeout, t_level)))
            at += rng.expovariate(level.value)
        results = list(await asyncio.gather(*tasks))
    wall = time.perf_counter() - t_level
    return sorted(results, key=lambda r: r.index), wall


Plan = list[tuple[Level, list[list[tuple[int, Any]]]]]  # per level: the requests of each repeat


RunLevel = Callable[[Level, Sequence[tuple[int, Any]], Send, float, int],
                   Awaitable[tuple[list[RequestResult], float]]]
Prepare = Callable[[Level, Sequence[tuple[int, Any]], int], Awaitable[None]]


async def drive(send: Send, warmup: Sequence[tuple[int, Any]], plan: Plan, timeout: float,
                seed: int = 0, log: Callable[[str], None] = print,
                run: RunLevel = run_level, prepare: Prepare | None = None) -> dict[str, dict[str, Any]]:
    """Warm up (results dropped; any failure is reported), then run each level in turn, once per
    repeat (each repeat with its own requests). ``run``: how one level runs (here, or spread
    over client processes: bench/clientprocs.py, or by vLLM's client: bench/vllm_bench.py);
    ``prepare``: what ``run`` needs done before each of its calls, outside the measured window
    (the CPU counted, the wall time)."""
    if warmup:
        if prepare is not None:
            await prepare(Level("closed", min(2, len(warmup))), warmup, seed)
        res, _ = await run(Level("closed", min(2, len(warmup))), warmup, send, timeout, seed)
        bad = [r.error for r in res if not r.ok]
        log(f"    warm-up: {len(res) - len(bad)}/{len(res)} ok" + (f" ({bad[0]})" if bad else ""))
    out: dict[str, dict[str, Any]] = {}
    for level, repeats in plan:
        runs = []
        for k, requests in enumerate(repeats):
            if prepare is not None:
                await prepare(level, requests, seed + k)
            before, threads, procs = cpu.sample(), cpu.thread_times(), cpu.process_times()
            res, wall = await run(level, requests, send, timeout, seed + k)
            use: dict[str, Any] = cpu.shares(before, cpu.sample(), wall)
            use["cpu_by_role"] = cpu.by_role(procs, cpu.process_times())
            use["busiest_thread"], use["busiest_thread_cpu_s"] = cpu.busiest_thread(threads, cpu.thread_times())
            failed = sum(not r.ok for r in res)
            tokens = sum(r.out_tokens for r in res if r.ok)
            tag = f" #{k + 1}" if len(repeats) > 1 else ""
            log(f"    {level.label + tag:>10}: {len(res)} requests, {failed} failed, {wall:.1f} s, "
                f"{tokens / wall if wall > 0 else 0:.1f} output tok/s" + _others(use.get("cpu_others"))
                + (f" ({_first_error(res)})" if failed else ""))
            runs.append({"wall_s": wall, "results": res, **use})
        out[level.label] = {"mode": level.mode, "value": level.value, "runs": runs}
    return out


def _others(share: float | None) -> str:
    return "" if share is None or share < 0.05 else f", other processes used {share:.0%} of the CPU"


def _first_error(results: Sequence[RequestResult]) -> str:
    return next((r.error or "" for r in results if not r.ok), "")[:200]
