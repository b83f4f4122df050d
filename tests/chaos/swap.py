"""Chaos scenarios ``swap_kill_drain`` and ``swap_kill_sleep``: a multi-model worker killed in the
middle of a swap (a fleet of its own each).

One worker of two models (the tiny model and a second tiny model, INFERQ_MODELS; on CPU a swap stops
one engine and starts the other). Long jobs of the awake model run; jobs for the sleeping model
arrive, so the worker swaps: its model's running jobs get ``INFERQ_SWAP_GRACE_S`` to end, then go
back to the queue. The worker (its supervisor, both models' processes, their engines) is SIGKILLed

- ``drain``: while the awake model's jobs run in their grace (30 s): a new worker's reaper takes them
  back a TTL after the last beat;
- ``sleep``: once they were handed back (grace 1 s), while its engine stops or the other's starts.

A new worker of the same two models is started, and serves both in turn. Every job must end once,
succeeded, with the text its stream gave (lost, corrupted: 0)."""

from __future__ import annotations

import asyncio
import json
import signal
import time
from pathlib import Path
from typing import Any

import httpx

from inferq.shared.settings import Settings
from inferq.worker.engine.models import tiny_variant_dir
from tests.chaos.client import Client, figures
from tests.fleet import Fleet
from tests.wait import WaitTimeout, eventually_async

SCENARIOS = ["swap_kill_drain", "swap_kill_sleep"]
GRACE_S = {"swap_kill_drain": 30, "swap_kill_sleep": 1}
A, B = "tiny-a", "tiny-b"
SWAP_S = 600.0  # an engine stopped and another started, on a busy 2-core machine


async def _state(client: Client) -> dict[str, str]:
    """Model -> its state on the (one) multi-model worker, {} while none heartbeats."""
    sws = (await client.http.get("/v1/queue")).json().get("swappers", [])
    return {m["name"]: m["state"] for m in sws[0]["models"]} if sws else {}


async def _submit(client: Client, n: int, body: dict[str, Any]) -> list[str]:
    return [await client.submit({**body, "prompt": f"{body['prompt']} {i}"}) for i in range(n)]


async def _statuses(client: Client, ids: list[str]) -> set[str]:
    return {(await client.http.get(f"/v1/jobs/{j}")).json()["status"] for j in ids}


async def _swap_caught(client: Client, ids: list[str], handed_back: bool) -> str | None:
    """Wait until the awake model goes to sleep (and, with ``handed_back``, its jobs are back in the
    queue); the models' states then (None: not seen)."""
    async def now() -> tuple[dict[str, str], set[str]]:
        return await _state(client), await _statuses(client, ids) if handed_back else set()

    def caught(got: tuple[dict[str, str], set[str]]) -> bool:
        states, statuses = got
        if not handed_back:
            return states.get(A) == "sleeping"
        return states.get(A) in ("sleeping", "asleep") and statuses == {"queued"}
    try:
        states, _ = await eventually_async(now, 120, f"{A} going to sleep", until=caught, interval=0.05,
                                          ignore=(httpx.HTTPError,))
    except WaitTimeout:
        return None
    return f"{A} {states.get(A)}, {B} {states.get(B)}"


async def scenario(fleet: Fleet, client: Client, name: str, a_jobs: int = 6, b_jobs: int = 6,
                   tokens: int = 0) -> dict[str, Any]:
    tokens = tokens or (400 if name == "swap_kill_drain" else 3000)  # within the grace, or far past it
    first = fleet.start_worker(wait=False)
    await eventually_async(lambda: _state(client), SWAP_S, f"{A} awake", until=lambda s: s.get(A) == "awake",
                           interval=0.5, ignore=(httpx.HTTPError, KeyError, IndexError))
    ids = await _submit(client, a_jobs, {"model": A, "prompt": "long", "max_tokens": tokens, "ignore_eos": True})
    followers = {j: asyncio.create_task(client.follow(j, 3 * SWAP_S)) for j in ids}
    for j in ids:
        await client.wait_running(j, 120)
    ids_b = await _submit(client, b_jobs, {"model": B, "prompt": "short", "max_tokens": 32, "ignore_eos": True})
    followers.update({j: asyncio.create_task(client.follow(j, 3 * SWAP_S)) for j in ids_b})
    killed_in = await _swap_caught(client, ids, handed_back=name == "swap_kill_sleep")
    t_kill = time.time()
    fleet.kill_worker(first, signal.SIGKILL)  # its process group: the supervisor, both models, their engines
    fleet.start_worker(wait=False)
    outcomes = [await client.outcome(j, await f, 3 * SWAP_S) for j, f in followers.items()]
    r = figures(outcomes)
    r.update(killed_in=killed_in, tokens=tokens, a_jobs=a_jobs, b_jobs=b_jobs, grace_s=GRACE_S[name],
             after_kill_s=round(max((o.final or {}).get("finished_at", t_kill) for o in outcomes) - t_kill, 1),
             workers_alive=len(fleet.live()), workers=len(fleet.workers))
    return r


def problems(r: dict[str, Any]) -> list[str]:
    bad = []
    if not r.get("killed_in"):
        bad.append("the worker was not caught in a swap (its model never seen going to sleep)")
    if r.get("succeeded") != r.get("submitted"):
        bad.append(f"not every job succeeded: {r.get('failed')}")
    return bad


def cell(r: dict[str, Any]) -> str:
    return (f"{r['a_jobs']} jobs of {r['tokens']} tokens of {A} running, {r['b_jobs']} of {B} queued, grace "
            f"{r['grace_s']} s; SIGKILLed while {r.get('killed_in')}; a new worker ended the last "
            f"{round(r['after_kill_s'])} s after the kill")


def run(name: str, logdir: Path, extra_env: dict[str, str], key: str, sizes: dict[str, Any]) -> dict[str, Any]:
    """The scenario on a fleet of its own (Redis, a gateway, multi-model workers), started and stopped here."""
    folder = logdir / name
    folder.mkdir(parents=True, exist_ok=True)
    second = tiny_variant_dir(Settings(), seed=7)
    models = [{"name": A, "settings": {"dtype": "float32"}},
              {"name": B, "model": str(second), "settings": {"dtype": "float32"}}]
    env = {**extra_env, "INFERQ_MODELS": json.dumps(models), "INFERQ_MAX_NUM_SEQS": "8",
           "INFERQ_SWAP_MIN_AWAKE_S": "1", "INFERQ_SWAP_GRACE_S": str(GRACE_S[name])}
    fleet = Fleet(folder, extra_env=env, api_key=key)

    async def go() -> dict[str, Any]:
        client = Client(fleet.base, fleet.ws, key)
        try:
            return await scenario(fleet, client, name, **sizes)
        finally:
            await client.aclose()
    try:
        fleet.start_redis()
        fleet.start_gateway()
        return asyncio.run(go())
    finally:
        fleet.stop()
