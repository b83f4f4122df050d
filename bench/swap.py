"""``python -m bench.swap CONFIG [--out DIR] [--only cold swap bursts]``: a multi-model worker's swaps.

Two models on one worker (INFERQ_MODELS; the GPU configs: two 7B-shape models, dummy weights, vLLM's
sleep mode), driven through the gateway's REST API; every time is the job record's own (created,
started, first token, finished: the gateway's and the worker's clocks, one host). Cases:

- ``cold``: a worker started from nothing (the gateway and Redis up, weights on local disk) and one
  job for the first model queued at the worker's spawn: spawn to first token; and when every model
  is started (with INFERQ_SWAP_PREPARE the others start while the first is idle): what the rest of
  the start-up costs. Each repeat a new worker.
- ``swap``: both models started, one awake and idle; a job for the other arrives: its time to first
  token from its submission (the swap included), then ``steady`` jobs for the same model, one after
  the other, once awake: the first of them is the first job after the wake, whose TTFT must be within
  1.2x of the others' median (steady state); then the same for the
  other model, ``samples`` times each way. Every first job after a wake is a fixed prompt at
  temperature 0, whose text must equal the model's text before its sleep (vLLM's sleep mode has had
  bugs there).
- ``bursts``: the two models' clients in alternating bursts (``burst_s`` each, a closed loop of
  ``concurrency`` clients) through the one worker, then through two dedicated workers (one per model,
  each half the GPU): total tokens (target: the one worker at 90 % of the two) and the longest wait of
  a job in the queue (target: a swap and one job).

Writes swap.json (every sample and the medians of the repeats) into --out.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import httpx

from bench.stack import Procs, base_env, free_port, http_ok, start_redis
from bench.swap_summary import merge, summary
from bench.sysinfo import environment

TERMINAL = {"succeeded", "failed", "cancelled"}


@dataclass
class SwapConfig:
    name: str
    models: list[dict[str, Any]]
    env: dict[str, str] = field(default_factory=dict)  # every process's INFERQ_* settings
    dedicated_env: dict[str, str] = field(default_factory=dict)  # over env, for a dedicated worker (half the GPU)
    startup_timeout_s: float = 900.0
    repeats: int = 3
    cold: dict[str, Any] = field(default_factory=dict)
    swap: dict[str, Any] = field(default_factory=lambda: {"samples": 5, "steady": 5, "max_tokens": 16})
    bursts: dict[str, Any] = field(default_factory=lambda: {"burst_s": 60, "bursts": 4, "concurrency": 32,
                                                             "max_tokens": 128})
    prompt_words: int = 200

    @classmethod
    def load(cls, path: Path) -> SwapConfig:
        """The config; a model given as ``"tiny_seed": N`` is the tiny model with weights drawn from N."""
        raw = json.loads(path.read_text())
        for m in raw["models"]:
            if "tiny_seed" in m:
                from inferq.shared.settings import Settings
                from inferq.worker.engine.models import tiny_variant_dir

                m["model"] = str(tiny_variant_dir(Settings(), m.pop("tiny_seed")))
        return cls(**raw)

    def prompt(self, tag: str) -> str:
        return f"{tag} " + " ".join(f"word{i % 97}" for i in range(self.prompt_words))


class Fleet:
    """Redis, a gateway, and the workers a case starts (multi-model, or one per model)."""

    def __init__(self, cfg: SwapConfig, procs: Procs) -> None:
        self.cfg, self.procs = cfg, procs
        self.redis = procs.add(start_redis(free_port(), procs.logdir, name="redis", env=base_env())).url
        self.env = {"INFERQ_REDIS_URL": self.redis, "INFERQ_MODELS": json.dumps(cfg.models), **cfg.env}
        port = free_port()
        self.base = f"http://127.0.0.1:{port}"
        procs.start("gateway", [sys.executable, "-m", "inferq.cli", "api", "--port", str(port)], base_env(**self.env))
        procs.wait(lambda: http_ok(f"{self.base}/healthz"), 60, "gateway")
        self.spawned = 0
        self.multi_up = False  # a multi-model worker runs, every model started (the next case may use it)

    def worker(self, model: dict[str, Any] | None = None) -> float:
        """Start a multi-model worker (or, with ``model``, a dedicated worker of it); its spawn time."""
        self.spawned += 1
        env = dict(self.env)
        if model is not None:
            env.pop("INFERQ_MODELS")
            env.update({k: str(v) for k, v in {"INFERQ_SERVED_MODEL_NAME": model["name"],
                                                 "INFERQ_MODEL": model.get("model")}.items() if v})
            env.update({f"INFERQ_{k.upper()}": str(v) for k, v in model.get("settings", {}).items()})
            env.update(self.cfg.dedicated_env)
        t = time.time()
        self.procs.start(f"worker-{self.spawned}", [sys.executable, "-m", "inferq.cli", "worker"],
                         base_env(**env, INFERQ_WORKER_ID=f"swap-bench-{self.spawned}"))
        return t

    def stop_workers(self) -> None:
        self.multi_up = False
        while self.procs.procs and self.procs.procs[-1].name.startswith("worker"):
            self.procs.procs.pop().stop(grace=60)


async def run_job(http: httpx.AsyncClient, model: str, prompt: str, max_tokens: int,
                  temperature: float = 0.0) -> dict[str, Any]:
    """Submit a job and poll it to its end; its view (the record's times)."""
    r = await http.post("/v1/jobs", json={"model": model, "prompt": prompt, "max_tokens": max_tokens,
                                          "temperature": temperature, "ignore_eos": True})
    r.raise_for_status()
    job_id = r.json()["id"]
    while True:
        v = (await http.get(f"/v1/jobs/{job_id}")).json()
        if v["status"] in TERMINAL:
            return dict(v)
        await asyncio.sleep(0.05)


def ttft(v: dict[str, Any]) -> float | None:
    return v["first_token_at"] - v["created_at"] if v.get("first_token_at") else None


async def swappers(http: httpx.AsyncClient) -> list[dict[str, Any]]:
    return list((await http.get("/v1/queue")).json().get("swappers", []))


async def until(probe: Any, timeout: float, what: str, interval: float = 0.2) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = await probe()
        if got:
            return got
        await asyncio.sleep(interval)
    raise TimeoutError(what)


async def case_cold(cfg: SwapConfig, fleet: Fleet, http: httpx.AsyncClient,
                    out: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each repeat a new worker; the last one is left running for the swap case."""
    first = cfg.models[0]["name"]
    for k in range(cfg.repeats):
        t0 = fleet.worker()
        v = await asyncio.wait_for(run_job(http, first, cfg.prompt("cold"), 8), cfg.startup_timeout_s)

        async def all_started() -> list[dict[str, Any]] | None:  # without sleep mode, a model starts when woken
            sws = await swappers(http)
            done = sws and sws[0]["recent"] and (not sws[0]["sleep_mode"]  # each one started, none starting
                                                 or all(m["state"] in ("awake", "asleep") for m in sws[0]["models"]))
            return sws if done else None
        sws = await until(all_started, cfg.startup_timeout_s, "every model started")
        starts = [s for s in sws[0]["recent"] if s["cold"]]
        out.append({"spawn_to_first_token_s": v["first_token_at"] - t0, "first_job_ttft_s": ttft(v),
                    "spawn_to_decision_s": starts[0]["at"] - t0 if starts else None,
                    "all_models_started_s": time.time() - t0 if sws[0]["sleep_mode"] else None,
                    "starts": starts, "swaps": sws[0]["recent"]})
        if k < cfg.repeats - 1 or not sws[0]["sleep_mode"]:
            fleet.stop_workers()
        else:
            fleet.multi_up = True
    return out


async def _wake_sample(cfg: SwapConfig, http: httpx.AsyncClient, model: str, before: str | None) -> dict[str, Any]:
    s = cfg.swap
    first = await run_job(http, model, cfg.prompt("same"), s["max_tokens"])

    async def its_swap() -> list[dict[str, Any]]:  # (the worker publishes its swaps with its heartbeat)
        return [r for sw in await swappers(http) for r in sw.get("recent", [])
                if r["to_model"] == model and r["at"] >= first["created_at"] - 1.0]
    try:
        rec = min(await until(its_swap, 10.0, "the swap's record", interval=0.1), key=lambda r: r["at"])
    except TimeoutError:
        rec = None
    # where the time went: submission to the decision, the swap's steps, its end to the job's start
    steps = {"decided_after_s": rec["at"] - first["created_at"] if rec else None,
             "swap": {k: rec.get(k) for k in ("drain_s", "sleep_s", "wake_s", "total_s", "overlapped")}
             if rec else None,
             "awake_to_started_s": first["started_at"] - rec["at"] - rec["total_s"]
             if rec and first.get("started_at") else None,
             "started_to_first_token_s": first["first_token_at"] - first["started_at"]
             if first.get("first_token_at") and first.get("started_at") else None}
    steady = [await run_job(http, model, cfg.prompt(f"steady {i}"), s["max_tokens"]) for i in range(s["steady"])]
    ttfts = [ttft(v) for v in steady]  # the first is the first job after the wake, the rest steady state
    rest = [t for t in ttfts[1:] if t is not None]
    steady_ttft = statistics.median(rest) if rest else None
    after = ttfts[0] if ttfts else None
    return {"model": model, "swap_ttft_s": ttft(first), **steps, "first_after_wake_ttft_s": after,
            "steady_ttft_s": steady_ttft, "steady_ttfts_s": ttfts,
            "ratio": after / steady_ttft if after is not None and steady_ttft else None,
            "text": first["text"], "same_text": before is None or first["text"] == before}


async def case_swap(cfg: SwapConfig, fleet: Fleet, http: httpx.AsyncClient,
                    out: list[dict[str, Any]]) -> list[dict[str, Any]]:
    names = [m["name"] for m in cfg.models[:2]]
    if not fleet.multi_up:
        fleet.worker()
    for m in names:  # both started (a cold start is not a swap), the first one awake at the end
        await asyncio.wait_for(run_job(http, m, cfg.prompt("warm"), 4), cfg.startup_timeout_s)
    texts: dict[str, str | None] = dict.fromkeys(names)
    for i in range(2 * cfg.swap["samples"] + 1):
        model = names[i % 2]
        sample = await _wake_sample(cfg, http, model, texts[model])
        texts[model] = sample["text"]
        if i:  # the first wakes a model that may not have slept yet
            out.append(sample)
    fleet.multi_up = True  # left running: the bursts' one worker, if they come next
    return out


async def _client(cfg: SwapConfig, http: httpx.AsyncClient, model: str, end: float, tag: str,
                  views: list[dict[str, Any]]) -> None:
    """One client of a burst: a job at a time until the burst's end."""
    while time.monotonic() < end:
        views.append(await run_job(http, model, cfg.prompt(tag), cfg.bursts["max_tokens"], 1.0))


async def _bursts(cfg: SwapConfig, http: httpx.AsyncClient) -> dict[str, Any]:
    b, names = cfg.bursts, [m["name"] for m in cfg.models[:2]]
    views: list[dict[str, Any]] = []
    t0 = time.time()
    for k in range(b["bursts"]):
        end = time.monotonic() + b["burst_s"]
        await asyncio.gather(*(_client(cfg, http, names[k % 2], end, f"burst {k} {c}", views)
                               for c in range(b["concurrency"])))
    ok = [v for v in views if v["status"] == "succeeded"]
    waits = [v["started_at"] - v["created_at"] for v in ok]
    runs = [v["finished_at"] - v["started_at"] for v in ok]
    return {"wall_s": time.time() - t0, "jobs": len(views), "failed": len(views) - len(ok),
            "tokens": sum(v["usage"]["completion_tokens"] for v in ok), "max_wait_s": max(waits, default=None),
            "job_run_s_p50": statistics.median(runs) if runs else None}


async def case_bursts(cfg: SwapConfig, fleet: Fleet, http: httpx.AsyncClient, out: list[dict[str, Any]],
                      sides: tuple[str, ...] = ("one", "dedicated")) -> list[dict[str, Any]]:
    """``repeats`` runs of the bursts on each side (``one``: the multi-model worker; ``dedicated``: a
    worker per model), each side's workers started once; the two sides may run in separate calls
    (``--side``) and be merged."""
    for side in sides:
        if side == "dedicated" or not fleet.multi_up:
            fleet.stop_workers()
            for m in cfg.models[:2] if side == "dedicated" else [None]:
                fleet.worker(m)
        for m in cfg.models[:2]:
            await asyncio.wait_for(run_job(http, m["name"], cfg.prompt("warm"), 4), cfg.startup_timeout_s)
        for k in range(cfg.repeats):
            t0 = time.time()
            one = await _bursts(cfg, http)
            if side == "one":
                one["swaps"] = [s for sw in await swappers(http) for s in sw["recent"]
                                if not s["cold"] and s["at"] >= t0]
            out.append({"side": side, "repeat": k, **one})
        fleet.stop_workers()
    return out


async def _save_every(doc: dict[str, Any], path: Path, every_s: float = 5.0) -> None:
    """The samples so far, every few seconds: a run cut at the GPU call's limit keeps what it measured."""
    while True:
        await asyncio.sleep(every_s)
        doc["summary"] = summary(doc)
        path.write_text(json.dumps(doc, indent=1))


async def run(cfg: SwapConfig, out: Path, only: list[str],
              sides: tuple[str, ...] = ("one", "dedicated")) -> dict[str, Any]:
    doc: dict[str, Any] = {"config": cfg.__dict__, "started_at": time.time(), "environment": environment()}
    with Procs(out / "logs") as procs:
        fleet = Fleet(cfg, procs)
        saver = asyncio.create_task(_save_every(doc, out / "swap.json"))
        async with httpx.AsyncClient(base_url=fleet.base, timeout=60) as http:
            cases: dict[str, Callable[..., Awaitable[Any]]] = {
                "cold": case_cold, "swap": case_swap, "bursts": partial(case_bursts, sides=sides)}
            for name, case in cases.items():
                if name in only:
                    doc[name] = []  # filled as the case goes (saved every few seconds)
                    await case(cfg, fleet, http, doc[name])
        saver.cancel()
        doc["summary"] = summary(doc)
        (out / "swap.json").write_text(json.dumps(doc, indent=1))
    return doc


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("config", type=Path, nargs="?")
    p.add_argument("--out", type=Path, default=Path("/tmp/bench-swap"))
    p.add_argument("--only", nargs="+", default=["cold", "swap", "bursts"], choices=["cold", "swap", "bursts"])
    p.add_argument("--repeats", type=int, help="override the config's repeats (cold, bursts)")
    p.add_argument("--side", choices=["one", "dedicated"], help="bursts: only this side (merge the two runs)")
    p.add_argument("--merge", type=Path, nargs="+", help="merge these swap.json files into --out/swap.json")
    a = p.parse_args(argv)
    a.out.mkdir(parents=True, exist_ok=True)
    if a.merge:
        doc = merge(a.merge)
        (a.out / "swap.json").write_text(json.dumps(doc, indent=1))
    else:
        (a.out / "logs").mkdir(parents=True, exist_ok=True)
        cfg = SwapConfig.load(a.config)
        cfg.repeats = a.repeats or cfg.repeats
        doc = asyncio.run(run(cfg, a.out, a.only, (a.side,) if a.side else ("one", "dedicated")))
    print(json.dumps(doc.get("summary"), indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
