"""Bulk embeddings: inferq's ``/v1/embeddings`` against ``vllm serve`` on the same pooling model,
both driven by vLLM's own client (``vllm bench serve --backend openai-embeddings``: random token
inputs of ``input_tokens``, ``batch`` inputs a request, ``concurrency`` requests in flight).

    python -m bench.embeddings bench/configs/embeddings/cpu-embeddings.json --out results/embeddings

Every stack is started once and stays up; each repeat runs every level (inputs a request x requests
in flight) on each target in turn (the inferq stacks, then vllm serve), so that a slow spell of the
host hits all of them. ``stacks``: inferq stacks by name, each its environment (the default config
runs ``inferq``, small requests of one key sharing jobs as they meet in the gateway, and
``inferq-solo``, a job per request). A level's figures are vLLM's client's: requests/s and input
tokens/s over its run, and the request latency (e2el). Levels are keyed by their batch size, with
``@`` and the concurrency when the config names several.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx

from bench.config import StackSpec, Workload
from bench.sessions import spread
from bench.stack import ROOT, Procs, base_env, free_port, http_ok, start_inferq


@dataclass
class EmbedConfig:
    name: str = "embeddings"
    model: str | None = None  # None: the built-in tiny embedding model
    max_model_len: int | None = 2048
    input_tokens: int = 128
    batches: list[int] = field(default_factory=lambda: [1, 32])  # inputs per request, one level each
    inputs: int = 4096  # inputs a level embeds (requests = inputs / batch)
    concurrency: int | list[int] = 16
    stacks: dict[str, dict[str, str]] = field(default_factory=lambda: {"inferq": {}})
    repeats: int = 3
    workers: int = 1
    max_num_seqs: int = 64
    kv_cache_gib: float = 1.0
    gpu_memory_utilization: float = 0.90
    startup_timeout_s: float = 600.0


def start_vllm(procs: Procs, cfg: EmbedConfig) -> str:
    """``vllm serve`` with a pooling worker's engine arguments; its base URL once it answers."""
    from bench.inprocess import engine_args
    from bench.vllm_serve import flags
    from inferq.shared.settings import Settings
    from inferq.worker.engine.models import resolve_model

    settings = {"runner": "pooling", "model": cfg.model, "max_model_len": cfg.max_model_len,
                "max_num_seqs": cfg.max_num_seqs, "cpu_kv_cache_gib": cfg.kv_cache_gib,
                "gpu_memory_utilization": cfg.gpu_memory_utilization}
    path = resolve_model(Settings.model_validate(settings))
    port = free_port()
    procs.start("vllm-serve", [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--host", "127.0.0.1",
                               "--port", str(port), "--disable-uvicorn-access-log",
                               *flags(engine_args({"model_path": path, "settings": settings}))], base_env(), cwd=ROOT)
    base = f"http://127.0.0.1:{port}"
    procs.wait(lambda: http_ok(f"{base}/health"), cfg.startup_timeout_s, "vllm serve")
    return base


def drive(base: str, model: str, tokenizer: str, cfg: EmbedConfig, batch: int, out: Path, seed: int,
          concurrency: int) -> dict[str, Any]:
    """One level through ``vllm bench serve``; vLLM's figures of it."""
    name = out / f"b{batch}-c{concurrency}-s{seed}.json"
    cmd = [sys.executable, "-m", "bench.vllm_serve", "bench", "serve", "--backend", "openai-embeddings",
           "--endpoint", "/v1/embeddings", "--base-url", base, "--model", model, "--tokenizer", tokenizer,
           "--dataset-name", "random", "--random-input-len", str(cfg.input_tokens), "--random-range-ratio", "0",
           "--random-batch-size", str(batch), "--num-prompts", str(cfg.inputs),  # inputs, in requests of `batch`
           "--max-concurrency", str(concurrency), "--seed", str(seed), "--save-result",
           "--result-dir", str(out), "--result-filename", name.name, "--percentile-metrics", "e2el",
           "--metric-percentiles", "50,90"]
    subprocess.run(cmd, check=True, cwd=ROOT, env=base_env(), stdout=subprocess.DEVNULL,
                   stderr=open(out / "vllm-bench.log", "a"))  # noqa: SIM115 (closed with the process)
    r = json.loads(name.read_text())
    return {"requests_s": r["request_throughput"], "inputs_s": r["request_throughput"] * batch,
            "input_tok_s": r["total_input_tokens"] / r["duration"], "e2el_p50_ms": r["median_e2el_ms"],
            "e2el_p90_ms": r.get("p90_e2el_ms"), "completed": r["completed"], "failed": r.get("failed", 0)}


def summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    return {"repeats": len(runs), "failed": sum(r["failed"] for r in runs),
            **spread(runs, ("inputs_s", "input_tok_s", "e2el_p50_ms", "e2el_p90_ms"))}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.embeddings", description=__doc__.split("\n\n")[0])
    ap.add_argument("config", type=Path)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    cfg = EmbedConfig(**json.loads(args.config.read_text()))
    (logs := args.out / "logs").mkdir(parents=True, exist_ok=True)
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {name: {} for name in [*cfg.stacks, "vllm-serve"]}
    conc = cfg.concurrency if isinstance(cfg.concurrency, list) else [cfg.concurrency]
    with Procs(logs) as procs:
        bases: dict[str, str] = {}
        for name, env in cfg.stacks.items():
            spec = StackSpec(workers=cfg.workers, max_num_seqs=cfg.max_num_seqs, kv_cache_gib=cfg.kv_cache_gib,
                             gpu_memory_utilization=cfg.gpu_memory_utilization,
                             env={"INFERQ_RUNNER": "pooling", **env}, startup_timeout_s=cfg.startup_timeout_s)
            bases[name] = start_inferq(procs, Workload(name=cfg.name, model=cfg.model,
                                                       max_model_len=cfg.max_model_len), spec, name)
        bases["vllm-serve"] = start_vllm(procs, cfg)
        model = httpx.get(f"{bases['vllm-serve']}/v1/models", timeout=30).json()["data"][0]
        tokenizer = model["root"]
        for seed in range(cfg.repeats):
            for batch in cfg.batches:
                for c in conc:
                    level = str(batch) if len(conc) == 1 else f"{batch}@{c}"
                    for target, base in bases.items():
                        got = drive(base, model["id"], tokenizer, cfg, batch, logs, seed, c)
                        runs[target].setdefault(level, []).append(got)
                        print(target, f"batch={batch} concurrency={c}", json.dumps(got), flush=True)
    result = {"config": asdict(cfg), "client": "vllm bench serve --backend openai-embeddings",
              "targets": {t: {b: {"runs": rs, "summary": summary(rs)} for b, rs in levels.items()}
                          for t, levels in runs.items()}}
    (args.out / "embeddings.json").write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
