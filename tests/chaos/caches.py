"""Chaos: the fleet's prefix index when an engine and its cache are lost.

- ``cache_restart``: conversations (each its own ~1,000-token start, every turn appending the last
  answer and a line, half a second between turns) run under cache-affine pull for 30 s; the worker whose engine holds
  the most of them is SIGKILLed mid-turn and a new worker started. No job is lost, run twice or
  corrupted; the fleet's prefix-cache hit rate (the engines' own counters, as the heartbeats
  report them) is back to 90 % of its level before the kill within 60 s: the conversations whose
  cache died become new prefixes (the index's entries name the dead engine instance, which no
  longer counts) and settle where they run next, instead of being passed to a cache that lost them.
"""

from __future__ import annotations

import asyncio
import signal
import statistics
import time
import uuid
from pathlib import Path
from typing import Any

from tests.chaos.client import Client, Outcome, figures
from tests.fleet import Fleet

SCENARIOS = ["cache_restart"]
WINDOW_S = 5.0


def _starts(n: int) -> list[str]:
    """``n`` conversation starts of ~1,000 tokens of the tiny model's tokenizer, each its own."""
    text = Path(asyncio.base_events.__file__).read_text()
    return [text[i * 3000:(i + 1) * 3000] for i in range(n)]


async def _cache_counters(client: Client) -> dict[str, tuple[int, int]]:
    """Each live worker's engine prefix-cache counters (queries, hits) as its last heartbeat said."""
    workers = (await client.http.get("/v1/workers")).json()
    return {w["id"]: (w["stats"]["prefix_cache_queries"], w["stats"]["prefix_cache_hits"]) for w in workers}


async def _windows(client: Client, stop: asyncio.Event, out: list[tuple[float, float | None]]) -> None:
    """Every WINDOW_S: (its end, the fleet's hit rate in it), from the counters' growth (a worker
    new since the last look counts from zero)."""
    last = await _cache_counters(client)
    while not stop.is_set():
        await asyncio.sleep(WINDOW_S)
        now = await _cache_counters(client)
        queries = sum(q - last.get(w, (0, 0))[0] for w, (q, _h) in now.items())
        hits = sum(h - last.get(w, (0, 0))[1] for w, (_q, h) in now.items())
        out.append((time.time(), hits / queries if queries > 0 else None))
        last = now


async def cache_restart(fleet: Fleet, client: Client, sessions: int = 8, warm_s: float = 30.0,
                        after_s: float = 70.0, max_tokens: int = 16, think_s: float = 0.5) -> dict[str, Any]:
    run, prompts = uuid.uuid4().hex[:8], _starts(sessions)
    outcomes: list[Outcome] = []
    where: dict[int, str] = {}  # session -> the worker its last turn ran on
    turns = [0] * sessions
    kill_at: list[float] = []
    stop = asyncio.Event()

    async def converse(i: int) -> None:
        while not stop.is_set():
            job_id = await client.submit({"prompt": prompts[i], "max_tokens": max_tokens, "temperature": 0},
                                         f"cache-{run}-{i}-{turns[i]}")
            o = await client.outcome(job_id, await client.follow(job_id, 600))
            outcomes.append(o)
            final = o.final or {}
            where[i] = str(final.get("worker"))
            prompts[i] += str(final.get("text", "")) + f"\n# turn {turns[i]}\n"
            turns[i] += 1
            await asyncio.sleep(think_s)  # (the user reads the answer)

    async def kill_then_wait() -> str:
        await asyncio.sleep(warm_s)
        counts: dict[str, int] = {}
        for w in where.values():
            counts[w] = counts.get(w, 0) + 1
        wid = max(counts, key=lambda w: counts[w])
        kill_at.append(time.time())
        await asyncio.to_thread(fleet.kill_worker, wid, signal.SIGKILL)
        fleet.start_worker(wait=False)
        await asyncio.sleep(after_s)
        stop.set()
        return wid

    windows: list[tuple[float, float | None]] = []
    sampler = asyncio.create_task(_windows(client, stop, windows))
    killed, *_ = await asyncio.gather(kill_then_wait(), *(converse(i) for i in range(sessions)))
    await sampler
    for wid in fleet.live():
        await asyncio.to_thread(fleet.wait_worker, wid)
    report = figures(outcomes)
    before = [r for t, r in windows if t <= kill_at[0] and r is not None][2:]  # past the first turns' misses
    steady = statistics.median(before) if before else None
    after = [(round(t - kill_at[0], 1), r) for t, r in windows if t - WINDOW_S >= kill_at[0] - 0.5]  # whole windows
    low = [t for t, r in after if r is None or not steady or r < 0.9 * steady]
    back = next((t for t, _ in after if not low or t > max(low)), None)  # from then on, every window at 90 %
    report.update(killed=killed, steady_hit_rate=steady, recovered_after_s=back,
                  lowest_after=min((r for _, r in after if r is not None), default=None),
                  windows_after=[(t, None if r is None else round(r, 3)) for t, r in after])
    return report


def problems(r: dict[str, Any]) -> list[str]:
    bad = []
    if r.get("steady_hit_rate") is None:
        bad.append("no steady hit rate before the kill")
    if r.get("recovered_after_s") is None or r["recovered_after_s"] > 60:
        bad.append(f"the hit rate was not back to 90 % of {r.get('steady_hit_rate')} within 60 s")
    if r.get("succeeded", 0) + sum(r.get("failed", {}).values()) != r.get("submitted", 0):
        bad.append("not every job ended")
    return bad


def cell(r: dict[str, Any]) -> str:
    steady = r.get("steady_hit_rate")
    low = r.get("lowest_after")
    return (f"killed {r.get('killed')}, the worker holding the most conversations; hit rate before "
            f"{steady:.0%}" if steady is not None else "no hit rate before") + \
        (f", lowest after {low:.0%}" if low is not None else "") + \
        f", every {WINDOW_S:g} s window at 90 % of it from {r.get('recovered_after_s')} s after the kill"
