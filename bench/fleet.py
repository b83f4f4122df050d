"""The fleet benchmark: plain pull against cache-affine pull, driven by vLLM's own client
(``vllm bench serve``) on the workloads it makes.

    python -m bench.fleet bench/configs/fleet/cpu-fleet.json --out results/fleet [--cases NAME ...]

One fleet (``workers`` workers and a gateway) is started once; every case runs on it ``repeats``
times in each mode (``off``: plain pull, ``prefix``: cache-affine pull, switched for the whole fleet
at run time through ``inferq:affinity:{model}``), the modes taking turns repeat by repeat, each run
with fresh prompts (a new seed); a case may first stop workers down to its ``workers`` (they drain):

- ``prefix_repetition``: ``num_prefixes`` shared prefixes, each repeated, shuffled (the workload's
  ideal hit rate is prefix / (prefix + suffix) of the prompt tokens, less the first of each prefix);
- ``random``: prompts that share nothing (placement can only cost); with ``request_rate``, sent at
  that rate (Poisson arrivals, ``--request-rate``) instead of a closed loop of ``concurrency``;
- either with LoRA adapters: ``adapters`` of them, one per request, drawn uniformly
  (``--lora-modules``, as users run it) or Zipf-like (``zipf``: each name repeated in proportion to
  1/rank, the same flag);
- ``num_prefixes`` 1: one hot prefix (how evenly the workers share it);
- ``kill_at_s``: the last worker is SIGKILLed that long into each run and started again at once,
  the fleet's hit rate read every 2 s (bench/fleet_restart.py: how soon it is back, nothing lost).

Around each run every worker's vLLM counters are read: prefix-cache hits, requests served, busy
time. With ``vllm_serve`` set, the same cases also run against ``vllm serve`` started with the
fleet's total sequences, adapter slots and memory, after the fleet has stopped (a reference row
for the adapter mix).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import re
import signal
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx

from bench.config import StackSpec, Workload
from bench.fleet_restart import Restarter
from bench.sessions import metric_sum, spread
from bench.stack import Procs, base_env, free_port, start_inferq, start_redis
from inferq.shared import keys

COUNTERS = ("prefix_cache_hits_total", "prefix_cache_queries_total", "request_success_total",
            "request_inference_time_seconds_sum")
ADAPTER_JOBS = re.compile(r'^inferq_worker_adapter_jobs_total\{[^}]*adapter="([^"]+)"[^}]*\} (\S+)$', re.M)
KEPT = ("output_throughput", "completed", "failed", "mean_ttft_ms", "median_ttft_ms", "p90_ttft_ms", "p99_ttft_ms",
        "median_itl_ms", "p99_itl_ms", "duration")


@dataclass
class Case:
    name: str
    dataset: str = "random"  # random | prefix_repetition
    input_len: int = 512  # random: prompt tokens
    output_len: int = 64
    prefix_len: int = 512  # prefix_repetition
    suffix_len: int = 64
    num_prefixes: int = 16
    num_prompts: int = 256
    concurrency: int = 32
    request_rate: float | None = None  # requests/s, Poisson arrivals (None: a closed loop of ``concurrency``)
    adapters: int = 0  # n > 0: each request on one of the first n adapters
    zipf: bool = False
    warmup: int = 0  # prompts run once before the repeats, not measured (kernels compiled, adapters loaded)
    modes: list[str] | None = None  # None: the config's
    workers: int | None = None  # stop workers down to this many first (None: as many as run)
    kill_at_s: float = 0.0  # > 0: the last worker is SIGKILLed this long into each run and started again


@dataclass
class FleetConfig:
    name: str = "fleet"
    comment: str = ""  # what the config is for (the page quotes the run, not this)
    model: str | None = None  # None: the built-in tiny model
    load_format: str = "auto"
    max_model_len: int | None = None
    workers: int = 2
    max_num_seqs: int = 64
    kv_cache_gib: float = 1.0
    gpu_memory_utilization: float = 0.9
    max_loras: int = 4
    max_cpu_loras: int | None = None
    adapters: int = 0  # adapters built for the cases (the most any case uses)
    modes: list[str] = field(default_factory=lambda: ["off", "prefix"])
    cases: list[Case] = field(default_factory=list)
    repeats: int = 3
    env: dict[str, str] = field(default_factory=dict)
    startup_timeout_s: float = 900.0
    staggered: bool = False
    vllm_serve: list[str] = field(default_factory=list)  # cases also run against one `vllm serve` of the fleet's size


def lora_names(case: Case, names: list[str]) -> list[str]:
    """The ``--lora-modules`` list: uniform, or each name repeated about 1/rank times (Zipf, s=1)."""
    names = names[:case.adapters]
    if not case.zipf:
        return names
    return [n for k, n in enumerate(names) for _ in range(max(1, round(len(names) / (k + 1))))]


def client(argv: list[str]) -> None:
    """vllm bench serve with ``argv``, run in this process (vLLM is imported once for every run;
    the CPU build's ``vllm`` command does not start); a flag the installed version does not know is
    left out and said so (``--temperature``: sent in the request body instead)."""
    from vllm.benchmarks.serve import add_cli_args
    from vllm.benchmarks.serve import main as bench_main

    parser = argparse.ArgumentParser()
    add_cli_args(parser)
    known = {o for action in parser._actions for o in action.option_strings}
    kept: list[str] = []
    i = 0
    while i < len(argv):
        j = i + 1
        while j < len(argv) and not argv[j].startswith("--"):
            j += 1
        if argv[i] in known:
            kept += argv[i:j]
        elif argv[i] == "--temperature" and "--extra-body" in known:
            kept += ["--extra-body", json.dumps({"temperature": float(argv[i + 1])})]
        else:
            print(f"vllm bench serve: {argv[i]} left out (this version has no such flag)", file=sys.stderr)
        i = j
    bench_main(parser.parse_args(kept))


def client_args(case: Case, base: str, model: str, tokenizer: str, loras: list[str], seed: int,
                out: Path, name: str) -> list[str]:
    args = ["--backend", "openai", "--endpoint", "/v1/completions", "--base-url", base, "--model", model,
            "--tokenizer", tokenizer, "--num-prompts", str(case.num_prompts), "--max-concurrency",
            str(case.concurrency), "--request-rate", str(case.request_rate or "inf"), "--ignore-eos",
            "--seed", str(seed),
            "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,90,99",
            "--save-result", "--result-dir", str(out), "--result-filename", name, "--disable-tqdm",
            "--temperature", "0"]
    if case.dataset == "prefix_repetition":
        args += ["--dataset-name", "prefix_repetition", "--prefix-repetition-prefix-len", str(case.prefix_len),
                 "--prefix-repetition-suffix-len", str(case.suffix_len), "--prefix-repetition-num-prefixes",
                 str(case.num_prefixes), "--prefix-repetition-output-len", str(case.output_len)]
    else:
        args += ["--dataset-name", "random", "--random-input-len", str(case.input_len), "--random-output-len",
                 str(case.output_len), "--random-range-ratio", "0"]
    return args + (["--lora-modules", *loras] if loras else [])


def scrape(ports: list[int]) -> list[dict[str, float]]:
    """Each worker's vLLM counters, the jobs it passed on, and the jobs it ran per adapter."""
    out = []
    for port in ports:
        text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=30).text
        got = {k: metric_sum(text, f"vllm:{k}") for k in COUNTERS}
        got["passed"] = metric_sum(text, "inferq_worker_jobs_passed_total")
        for name, n in ADAPTER_JOBS.findall(text):
            got[f"adapter:{name}"] = float(n)
        out.append(got)
    return out


def run_case(case: Case, base: str, model: str, tokenizer: str, loras: list[str], ports: list[int], seed: int,
             out: Path, label: str, procs: Procs | None = None) -> dict[str, Any]:
    """One run of ``case``: vLLM's figures and, per worker, what its counters moved by (``procs``:
    the fleet's, for a case that kills and restarts a worker)."""
    name = f"{label}-{case.name}-{seed}.json"
    before = scrape(ports)
    restarter = None
    if case.kill_at_s > 0 and procs is not None:
        restarter = Restarter(procs, ports, len(ports) - 1, case.kill_at_s, base, "fleet")
        restarter.start()
    log = out / "logs" / f"client-{label}.log"
    try:
        with log.open("a") as f, contextlib.redirect_stdout(f), contextlib.redirect_stderr(f):
            client(client_args(case, base, model, tokenizer, loras, seed, out, name))  # (vLLM imported once)
    finally:
        if restarter is not None:
            restarter.done.set()
            restarter.join()
    after = scrape(ports)
    got = json.loads((out / name).read_text())
    (out / name).unlink()  # the per-request data stay out of the results
    moved = [{k: a[k] - b.get(k, 0.0) if a["request_success_total"] >= b.get("request_success_total", 0.0)
              else a[k] for k in a} for a, b in zip(after, before, strict=True)]  # (a restarted worker: from 0)
    hits = sum(m["prefix_cache_hits_total"] for m in moved)
    queries = sum(m["prefix_cache_queries_total"] for m in moved)
    served = [m["request_success_total"] for m in moved]
    busy = [m["request_inference_time_seconds_sum"] for m in moved]
    run = {k: got.get(k) for k in KEPT}
    adapters = [sorted(k[8:] for k, v in m.items() if k.startswith("adapter:") and v > 0) for m in moved]
    run.update(hit_rate=hits / queries if queries else None, requests=served, busy_s=busy,
               passed=[m["passed"] for m in moved], adapters_per_worker=[len(a) for a in adapters],
               busiest_over_mean=max(served) / statistics.mean(served) if served and sum(served) else None)
    if restarter is not None:
        run["restart"] = restarter.report()
    return run


def summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Median, min and max over the repeats of each figure."""
    out: dict[str, Any] = {"repeats": len(runs), "failed": sum(r.get("failed") or 0 for r in runs)}
    out.update(spread(runs, ("output_throughput", "median_ttft_ms", "mean_ttft_ms", "p90_ttft_ms", "p99_ttft_ms",
                             "p99_itl_ms", "hit_rate", "busiest_over_mean")))
    restarts = [r["restart"] for r in runs if "restart" in r]
    if restarts:
        out["restart"] = spread(restarts, ("steady", "lowest_after_kill", "recovered_after_ready_s",
                                           "recovered_after_kill_s"))
        starts = [x["ready_at_s"] - x["kill_at_s"] for x in restarts if x.get("ready_at_s") and x.get("kill_at_s")]
        out["restart"]["start_s"] = statistics.median(starts) if starts else None
    return out


def adapters(cfg: FleetConfig, out: Path) -> dict[str, str]:
    from bench.sessions import SessionsConfig, adapters_for

    return adapters_for(SessionsConfig(model=cfg.model, adapters=[cfg.adapters]), out) if cfg.adapters else {}


def run_fleet(cfg: FleetConfig, out: Path, lora: dict[str, str],
              saved: Callable[[dict[str, Any]], None] = lambda _: None) -> dict[str, Any]:
    """Start the fleet, run every case in each of its modes (``saved`` gets the results so far
    after each case), stop it."""
    import redis

    ports = [free_port() for _ in range(cfg.workers)]
    env = {"INFERQ_MAX_LORAS": str(cfg.max_loras), **cfg.env}
    if cfg.max_cpu_loras:
        env["INFERQ_MAX_CPU_LORAS"] = str(cfg.max_cpu_loras)
    if lora:
        env["INFERQ_LORA_MODULES"] = ",".join(f"{k}={v}" for k, v in lora.items())
    spec = StackSpec(workers=cfg.workers, max_num_seqs=cfg.max_num_seqs, kv_cache_gib=cfg.kv_cache_gib,
                     gpu_memory_utilization=cfg.gpu_memory_utilization, env=env,
                     worker_env=[{"INFERQ_METRICS_PORT": str(p)} for p in ports],
                     startup_timeout_s=cfg.startup_timeout_s, staggered=cfg.staggered)
    w = Workload(name=cfg.name, model=cfg.model, load_format=cfg.load_format, max_model_len=cfg.max_model_len)
    (out / "logs" / "fleet").mkdir(parents=True, exist_ok=True)
    result: dict[str, Any] = {"workers": cfg.workers, "cases": {}}
    with Procs(out / "logs" / "fleet") as procs:
        url = procs.add(start_redis(free_port(), procs.logdir, name="redis", env=base_env())).url
        r = redis.Redis.from_url(url, decode_responses=True)
        base = start_inferq(procs, w, spec, "fleet", url)
        model = httpx.get(f"{base}/v1/models", timeout=30).json()["data"][0]["id"]
        tokenizer = cfg.model or httpx.get(f"{base}/v1/workers", timeout=30).json()[0]["tokenizer"]
        for index, case in enumerate(cfg.cases):
            if case.workers is not None and case.workers < len(ports):
                shrink(procs, ports, case.workers)
            modes = case.modes or cfg.modes
            runs: dict[str, list[dict[str, Any]]] = {m: [] for m in modes}
            if case.warmup:
                warm = Case(**{**asdict(case), "num_prompts": case.warmup})
                run_case(warm, base, model, tokenizer, lora_names(case, list(lora)), ports, 999_999 - index, out,
                         "warmup")
            for repeat in range(cfg.repeats):
                for k, mode in enumerate(modes):
                    r.set(keys.affinity_mode(model), mode)
                    time.sleep(1.5)  # (workers read the switch once a second)
                    seed = 1000 * index + len(modes) * repeat + k  # prompts no other run sent: no stray hits
                    runs[mode].append(run_case(case, base, model, tokenizer, lora_names(case, list(lora)), ports,
                                               seed, out, mode, procs))
            result["cases"][case.name] = {"workers": len(ports), **{
                m: {"runs": got, "summary": summary(got)} for m, got in runs.items()}}
            for m in modes:
                print(case.name, m, json.dumps(result["cases"][case.name][m]["summary"]), flush=True)
            saved(result)
    return result


def shrink(procs: Procs, ports: list[int], n: int) -> None:
    """Stop the fleet's last workers (SIGTERM: they drain) until ``n`` are left."""
    while len(ports) > n:
        ports.pop()
        proc = next(p for p in procs.procs if p.name == f"worker-fleet-{len(ports)}")
        proc.stop(grace=60)
        procs.procs.remove(proc)


def run_vllm_serve(cfg: FleetConfig, out: Path, lora: dict[str, str]) -> dict[str, Any]:
    """The reference: one ``vllm serve`` with the fleet's total sequences, adapter slots and memory."""
    from bench.inprocess import engine_args
    from bench.stack import ROOT, base_env, http_ok
    from bench.vllm_serve import flags
    from inferq.shared.settings import Settings
    from inferq.worker.engine.models import resolve_model

    n = cfg.workers
    settings = {"model": cfg.model, "load_format": cfg.load_format, "max_model_len": cfg.max_model_len,
                "max_num_seqs": cfg.max_num_seqs * n, "cpu_kv_cache_gib": cfg.kv_cache_gib * n,
                "gpu_memory_utilization": min(0.95, cfg.gpu_memory_utilization * n), "enable_lora": bool(lora),
                "max_loras": cfg.max_loras * n, "max_cpu_loras": max(cfg.max_cpu_loras or 0, cfg.max_loras * n),
                "affinity": "off"}
    model_path = str(resolve_model(Settings(model=cfg.model)))
    argv = flags(engine_args({"model_path": model_path, "settings": settings}))
    if lora:
        argv += ["--lora-modules", *(f"{k}={v}" for k, v in lora.items())]
    port = free_port()
    (out / "logs" / "vllm-serve").mkdir(parents=True, exist_ok=True)
    result: dict[str, Any] = {"vllm_serve": True, "cases": {}}
    with Procs(out / "logs" / "vllm-serve") as procs:
        env = base_env()
        procs.start("vllm-serve", [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--host", "127.0.0.1",
                                   "--port", str(port), "--disable-uvicorn-access-log", *argv], env, cwd=ROOT)
        base = f"http://127.0.0.1:{port}"
        procs.wait(lambda: http_ok(f"{base}/health"), cfg.startup_timeout_s, "vllm serve")
        model = httpx.get(f"{base}/v1/models", timeout=30).json()["data"][0]["id"]
        for case in (c for c in cfg.cases if c.name in cfg.vllm_serve):
            runs = [run_case(case, base, model, model_path, lora_names(case, list(lora)), [port], seed, out,
                             "vllm-serve") for seed in range(cfg.repeats)]
            result["cases"][case.name] = {"runs": runs, "summary": summary(runs)}
            print("vllm-serve", case.name, json.dumps(result["cases"][case.name]["summary"]), flush=True)
    return result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.fleet", description=__doc__.split("\n\n")[0])
    ap.add_argument("config", type=Path)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--no-vllm-serve", action="store_true", help="leave out the vllm serve reference")
    ap.add_argument("--vllm-serve-only", action="store_true",
                    help="only the vllm serve reference, added to OUT/fleet.json (a fleet run earlier)")
    ap.add_argument("--cases", nargs="+", default=None, help="run only these cases")
    args = ap.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # (a timeout's SIGTERM stops the fleet it started)
    raw = json.loads(args.config.read_text())
    cfg = FleetConfig(**{**raw, "cases": [Case(**c) for c in raw.get("cases", [])]})
    if args.cases:
        cfg.cases = [c for c in cfg.cases if c.name in args.cases]
    args.out.mkdir(parents=True, exist_ok=True)
    lora = adapters(cfg, args.out / "adapters")
    result: dict[str, Any] = {"config": asdict(cfg)}

    def save(fleet: dict[str, Any]) -> None:
        result["fleet"] = fleet
        (args.out / "fleet.json").write_text(json.dumps(result, indent=1))

    if args.vllm_serve_only:
        earlier = args.out / "fleet.json"
        result = json.loads(earlier.read_text()) if earlier.exists() else result
    else:
        save(run_fleet(cfg, args.out, lora, save))
    if cfg.vllm_serve and not args.no_vllm_serve:
        result["vllm_serve"] = run_vllm_serve(cfg, args.out, lora)
    (args.out / "fleet.json").write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
