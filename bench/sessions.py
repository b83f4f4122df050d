"""Multi-turn sessions: where a fleet's prefix caches pay off, plain pull against cache-affine pull.

Each session has a long prefix of its own (a system prompt and a document, ``prefix_tokens``
random token ids), and every turn appends ``turn_tokens`` more to the one before, so a follow-up
shares its whole prompt but the new part with the turn before. Turns go in waves: wave 1 is every
session's first turn, wave 2 every second turn, and so on (``sessions`` requests in flight), each
a streamed ``/v1/completions`` request (TTFT at the first token). Between waves each worker's vLLM
counters are read: the prefix cache's hit rate of the follow-up waves, and each engine's busy time
(``vllm:request_inference_time_seconds``) and requests served, for their spread across workers.
With ``adapters`` > 0 each session runs on one of that many LoRA adapters, drawn Zipf-like (the
built-in model only; a list of counts runs each).

    python -m bench.sessions bench/configs/sessions/cpu-sessions.json --out results/sessions

Stacks: a single worker (the cache ideal: every follow-up lands on the cache that holds it), then
for each worker count each INFERQ_AFFINITY mode; each stack runs ``repeats`` times with fresh
sessions. ``--base URL --metrics PORT,PORT`` runs one repeat against a running stack instead.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import re
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx

from bench.config import StackSpec, Workload
from bench.stack import Procs, free_port, start_inferq


@dataclass
class SessionsConfig:
    name: str = "sessions"
    model: str | None = None  # None: the built-in tiny model
    load_format: str = "auto"
    dtype: str = "auto"
    max_model_len: int | None = None
    workers: list[int] = field(default_factory=lambda: [2])
    modes: list[str] = field(default_factory=lambda: ["off", "prefix"])
    single: bool = True  # also a one-worker stack: the cache ideal
    sessions: int = 16
    turns: int = 4
    prefix_tokens: int = 1024
    turn_tokens: int = 32
    output_tokens: int = 16
    repeats: int = 3
    vocab: int = 4000  # token ids drawn from [100, vocab)
    adapters: list[int] = field(default_factory=lambda: [0])  # n > 0: each session on one of n LoRA adapters
    max_loras: int = 4
    max_num_seqs: int = 64
    kv_cache_gib: float = 1.0
    gpu_memory_utilization: float = 0.9
    env: dict[str, str] = field(default_factory=dict)
    startup_timeout_s: float = 900.0
    staggered: bool = False  # workers started one at a time (several engines on one GPU)


def metric_sum(text: str, name: str) -> float:
    return sum(float(v) for v in re.findall(rf"^{re.escape(name)}(?:\{{[^}}]*\}})? (\S+)$", text, re.M))


async def scrape(client: httpx.AsyncClient, ports: list[int]) -> list[dict[str, float]]:
    """Each worker's prefix-cache and busy-time counters."""
    out = []
    for port in ports:
        text = (await client.get(f"http://127.0.0.1:{port}/metrics")).text
        out.append({k: metric_sum(text, f"vllm:{k}") for k in (
            "prefix_cache_hits_total", "prefix_cache_queries_total", "request_inference_time_seconds_sum",
            "request_success_total")})
    return out


async def turn(client: httpx.AsyncClient, base: str, model: str, prompt: list[int], output: int) -> dict[str, Any]:
    """One streamed completion: its TTFT and output tokens (from the usage chunk)."""
    body = {"model": model, "prompt": prompt, "max_tokens": output, "min_tokens": output, "temperature": 0,
            "stream": True, "stream_options": {"include_usage": True}}
    start, ttft, tokens = time.perf_counter(), None, 0
    async with client.stream("POST", f"{base}/v1/completions", json=body) as r:
        if r.status_code != 200:
            return {"status": r.status_code, "ttft": None, "tokens": 0}
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if ttft is None and chunk.get("choices") and chunk["choices"][0].get("text"):
                ttft = time.perf_counter() - start
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
    return {"status": 200, "ttft": ttft, "tokens": tokens}


def delta(after: list[dict[str, float]], before: list[dict[str, float]], key: str) -> list[float]:
    return [a[key] - b[key] for a, b in zip(after, before, strict=True)]


async def run_once(cfg: SessionsConfig, base: str, ports: list[int], models: list[str], seed: int) -> dict[str, Any]:
    """One repeat: fresh sessions, wave by wave; what each wave measured, and the run's totals."""
    rng = random.Random(seed)
    prompts = [[rng.randrange(100, cfg.vocab) for _ in range(cfg.prefix_tokens)] for _ in range(cfg.sessions)]
    weights = [1 / (k + 1) for k in range(len(models))]
    picked = rng.choices(models, weights, k=cfg.sessions)
    waves: list[dict[str, Any]] = []
    out_tokens, errors = 0, 0
    async with httpx.AsyncClient(timeout=600, limits=httpx.Limits(max_connections=cfg.sessions + 8)) as client:
        first = await scrape(client, ports)
        t0 = time.perf_counter()
        for t in range(cfg.turns):
            if t:
                for p in prompts:
                    p.extend(rng.randrange(100, cfg.vocab) for _ in range(cfg.turn_tokens))
            before = await scrape(client, ports)
            got = await asyncio.gather(*(turn(client, base, m, p, cfg.output_tokens) for m, p in zip(picked, prompts,
                                                                                              strict=True)))
            after = await scrape(client, ports)
            hits = sum(delta(after, before, "prefix_cache_hits_total"))
            queries = sum(delta(after, before, "prefix_cache_queries_total"))
            ttfts = sorted(g["ttft"] for g in got if g["ttft"] is not None)
            errors += sum(g["status"] != 200 for g in got)
            out_tokens += sum(g["tokens"] for g in got)
            waves.append({"turn": t + 1, "hit_rate": hits / queries if queries else 0.0,
                          "ttft_p50_ms": 1000 * statistics.median(ttfts) if ttfts else None,
                          "ttft_p90_ms": 1000 * ttfts[int(0.9 * (len(ttfts) - 1))] if ttfts else None})
        wall = time.perf_counter() - t0
        last = await scrape(client, ports)
    busy = delta(last, first, "request_inference_time_seconds_sum")
    served = delta(last, first, "request_success_total")
    follow = waves[1:]
    follow_ttfts = [w["ttft_p50_ms"] for w in follow if w["ttft_p50_ms"] is not None]
    hits = sum(delta(last, first, "prefix_cache_hits_total"))
    return {"waves": waves, "errors": errors, "output_tok_s": out_tokens / wall, "wall_s": wall,
            "hit_rate_all": hits / max(1.0, sum(delta(last, first, "prefix_cache_queries_total"))),
            "follow_up_hit_rate": statistics.mean(w["hit_rate"] for w in follow) if follow else None,
            "follow_up_ttft_p50_ms": statistics.median(follow_ttfts) if follow_ttfts else None,
            "follow_up_ttft_p90_ms": max((w["ttft_p90_ms"] for w in follow if w["ttft_p90_ms"]), default=None),
            "busy_s": busy, "busy_spread": max(busy) / min(busy) if len(busy) > 1 and min(busy) > 0 else None,
            "requests": served,
            "requests_spread": max(served) / min(served) if len(served) > 1 and min(served) else None}


def adapters_for(cfg: SessionsConfig, out: Path) -> dict[str, str]:
    """``cfg.adapters`` random adapters for the config's model (its config.json gives the shapes;
    None: the built-in tiny model), written under ``out``."""
    from inferq.shared.settings import Settings
    from inferq.worker.engine.models import tiny_model_dir
    from tests.lora import build_tiny_adapter

    base = Path(cfg.model) if cfg.model else tiny_model_dir(Settings())
    scale = 0.01 if cfg.model else 0.5  # (a 7B shape's 32 layers would overflow at the tiny model's)
    return {f"lora-{k}": str(build_tiny_adapter(out / f"lora-{k}", base, seed=100 + k, scale=scale))
            for k in range(max(cfg.adapters))}


def stacks(cfg: SessionsConfig) -> list[tuple[str, int, str, int]]:
    """(label, workers, INFERQ_AFFINITY, adapters) of every stack the config runs."""
    out = [("single", 1, "off", a) for a in cfg.adapters] if cfg.single else []
    out += [(f"{n}w-{mode}", n, mode, a) for a in cfg.adapters for n in cfg.workers for mode in cfg.modes]
    return [(label + (f"-{a}a" if a else ""), n, mode, a) for label, n, mode, a in out]


def run_stack(cfg: SessionsConfig, out: Path, label: str, workers: int, mode: str,
              lora: dict[str, str]) -> list[dict[str, Any]]:
    ports = [free_port() for _ in range(workers)]
    env = {"INFERQ_AFFINITY": mode, "INFERQ_MAX_LORAS": str(cfg.max_loras), **cfg.env}
    if lora:
        env["INFERQ_LORA_MODULES"] = ",".join(f"{k}={v}" for k, v in lora.items())
    spec = StackSpec(workers=workers, max_num_seqs=cfg.max_num_seqs, kv_cache_gib=cfg.kv_cache_gib,
                     gpu_memory_utilization=cfg.gpu_memory_utilization, env=env,
                     worker_env=[{"INFERQ_METRICS_PORT": str(p)} for p in ports],
                     startup_timeout_s=cfg.startup_timeout_s, staggered=cfg.staggered)
    w = Workload(name=cfg.name, model=cfg.model, load_format=cfg.load_format, dtype=cfg.dtype,
                 max_model_len=cfg.max_model_len)
    logdir = out / "logs" / label
    logdir.mkdir(parents=True, exist_ok=True)
    with Procs(logdir) as procs:
        base = start_inferq(procs, w, spec, label)
        model = httpx.get(f"{base}/v1/models", timeout=30).json()["data"][0]["id"]
        models = list(lora) or [model]
        asyncio.run(run_once(SessionsConfig(**{**asdict(cfg), "sessions": 2, "turns": 1}), base, ports, models, 9))
        return [asyncio.run(run_once(cfg, base, ports, models, seed=r)) for r in range(cfg.repeats)]


def spread(runs: list[dict[str, Any]], keys: tuple[str, ...]) -> dict[str, Any]:
    """Median and range over the repeats of each of ``keys`` (None where no repeat has it)."""
    out: dict[str, Any] = {}
    for key in keys:
        vals = [r[key] for r in runs if r.get(key) is not None]
        out[key] = {"median": statistics.median(vals), "min": min(vals), "max": max(vals)} if vals else None
    return out


def summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Median and range of each total over the repeats."""
    return {"repeats": len(runs), "errors": sum(r["errors"] for r in runs),
            **spread(runs, ("follow_up_hit_rate", "follow_up_ttft_p50_ms", "follow_up_ttft_p90_ms", "output_tok_s",
                            "busy_spread", "requests_spread"))}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.sessions", description=__doc__.split("\n\n")[0])
    ap.add_argument("config", type=Path)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--base", help="a running stack's gateway (one repeat against it)")
    ap.add_argument("--metrics", default="", help="its workers' metrics ports, comma-separated")
    ap.add_argument("--model", default=None, help="with --base: the model name to send")
    ap.add_argument("--only", nargs="+", default=None, help="run only these stacks (labels: single, 2w-off, ...)")
    args = ap.parse_args(argv)
    cfg = SessionsConfig(**json.loads(args.config.read_text()))
    args.out.mkdir(parents=True, exist_ok=True)
    result: dict[str, Any] = {"config": asdict(cfg), "stacks": {}}
    if args.base:
        ports = [int(p) for p in args.metrics.split(",") if p]
        run = asyncio.run(run_once(cfg, args.base, ports, [args.model or "inferq-tiny"], seed=0))
        result["stacks"]["given"] = {"runs": [run], "summary": summary([run])}
    else:
        lora = adapters_for(cfg, args.out / "adapters") if max(cfg.adapters) else {}
        for label, workers, mode, count in stacks(cfg):
            if args.only and label not in args.only:
                continue
            runs = run_stack(cfg, args.out, label, workers, mode, dict(list(lora.items())[:count]))
            result["stacks"][label] = {"workers": workers, "affinity": mode, "adapters": count, "runs": runs,
                                       "summary": summary(runs)}
            print(label, json.dumps(result["stacks"][label]["summary"]), flush=True)
            (args.out / "sessions.json").write_text(json.dumps(result, indent=1))  # each stack as it ends
    (args.out / "sessions.json").write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
