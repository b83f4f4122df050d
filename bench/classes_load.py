"""The two loads of bench/classes.py: ``vllm bench serve`` for interactive traffic (run from Python in a
process of its own, as bench/fleet.py runs it: the CPU build's ``vllm`` command does not start), and
a Batch API job beside it, followed by its lines' progress."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

#: vllm bench serve, run from Python (``python -c CLIENT ARGS``)
CLIENT = ("import argparse, sys\nfrom vllm.benchmarks.serve import add_cli_args, main\n"
          "p = argparse.ArgumentParser(); add_cli_args(p); main(p.parse_args(sys.argv[1:]))")
#: vLLM's figures kept from each run
KEPT = ("completed", "failed", "duration", "output_throughput", "total_token_throughput", "request_throughput",
        "median_ttft_ms", "p90_ttft_ms", "p99_ttft_ms", "median_itl_ms", "p99_itl_ms", "median_tpot_ms")


@dataclass(frozen=True)
class Load:
    """One ``vllm bench serve`` run: the shape of its requests and how they come."""

    input_len: int
    output_len: int
    num_prompts: int
    rate: float | None = None  # requests/s (Poisson); None: a closed loop of ``concurrency``
    concurrency: int | None = None


def client_args(load: Load, base: str, model: str, tokenizer: str, seed: int, out: Path, name: str) -> list[str]:
    args = ["--backend", "openai", "--endpoint", "/v1/completions", "--base-url", base, "--model", model,
            "--tokenizer", tokenizer, "--dataset-name", "random", "--random-input-len", str(load.input_len),
            "--random-output-len", str(load.output_len), "--random-range-ratio", "0", "--num-prompts",
            str(load.num_prompts), "--ignore-eos", "--seed", str(seed), "--percentile-metrics", "ttft,tpot,itl,e2el",
            "--metric-percentiles", "50,90,99", "--save-result", "--save-detailed", "--result-dir", str(out),
            "--result-filename", name, "--disable-tqdm", "--temperature", "0"]
    if load.rate is not None:
        args += ["--request-rate", f"{load.rate:g}", "--burstiness", "1.0"]
    else:
        args += ["--request-rate", "inf", "--max-concurrency", str(load.concurrency or 1)]
    return args


def start_client(load: Load, base: str, model: str, tokenizer: str, seed: int, out: Path, name: str,
                 api_key: str | None = None) -> subprocess.Popen[bytes]:
    env = dict(os.environ, OPENAI_API_KEY=api_key or "none", TOKENIZERS_PARALLELISM="false")
    log = (out / "logs" / f"client-{name}.log").open("ab")
    return subprocess.Popen([sys.executable, "-c", CLIENT, *client_args(load, base, model, tokenizer, seed, out,
                                                                       f"{name}.json")],
                            stdout=log, stderr=subprocess.STDOUT, env=env)


def finish_client(proc: subprocess.Popen[bytes], out: Path, name: str, timeout: float) -> dict[str, Any]:
    """vLLM's figures of a run that was started, and its per-request data (``requests``)."""
    if proc.wait(timeout) != 0:
        raise RuntimeError(f"vllm bench serve {name} failed (exit {proc.returncode}); see logs/client-{name}.log")
    path = out / f"{name}.json"
    got = json.loads(path.read_text())
    path.unlink()  # the per-request data stay out of the results but what is drawn from them
    run = {k: got.get(k) for k in KEPT}
    run["requests"] = {k: got.get(k) for k in ("ttfts", "output_lens", "input_lens", "start_times", "latencies")}
    if not run["requests"]["latencies"] and got.get("itls"):  # older vLLM keeps no latencies: first token + gaps
        run["requests"]["latencies"] = [(t or 0.0) + sum(g or []) for t, g in zip(got["ttfts"], got["itls"],
                                                                                 strict=False)]
    return run


def run_client(load: Load, base: str, model: str, tokenizer: str, seed: int, out: Path, name: str,
               api_key: str | None = None) -> dict[str, Any]:
    proc = start_client(load, base, model, tokenizer, seed, out, name, api_key)
    return finish_client(proc, out, name, timeout=3600)


class Batch:
    """A Batch API job of ``lines`` completions of ``max_tokens`` tokens each (distinct prompts)."""

    def __init__(self, http: httpx.Client, model: str, lines: int, prompt_words: int, max_tokens: int,
                 tag: str) -> None:
        self.http, self.lines, self.max_tokens = http, lines, max_tokens
        body = "".join(json.dumps({"custom_id": f"{tag}-{i}", "method": "POST", "url": "/v1/completions", "body": {
            "model": model, "prompt": f"{tag} line {i}: " + " ".join(f"w{(i * 7 + k) % 997}" for k in
                                                                     range(prompt_words)),
            "max_tokens": max_tokens, "ignore_eos": True, "temperature": 0}}) + "\n" for i in range(lines))
        f = http.post("/v1/files", files={"file": (f"{tag}.jsonl", body.encode())}, data={"purpose": "batch"})
        f.raise_for_status()
        b = http.post("/v1/batches", json={"input_file_id": f.json()["id"], "endpoint": "/v1/completions",
                                           "completion_window": "24h"})
        b.raise_for_status()
        self.id: str = b.json()["id"]
        self.created = time.time()

    def state(self) -> dict[str, Any]:
        return dict(self.http.get(f"/v1/batches/{self.id}").json())

    def done_lines(self) -> int:
        counts = self.state()["request_counts"]
        return int(counts["completed"]) + int(counts["failed"])

    def wait(self, pred: Any, timeout: float, what: str) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            s = self.state()
            if pred(s):
                return s
            time.sleep(0.5)
        raise TimeoutError(f"batch {self.id}: {what} within {timeout:.0f} s")

    def rate(self, seconds: float) -> float:
        """Output tokens per second its lines were answered at over the next ``seconds``."""
        n0, t0 = self.done_lines(), time.monotonic()
        time.sleep(seconds)
        n1, t1 = self.done_lines(), time.monotonic()
        return (n1 - n0) * self.max_tokens / (t1 - t0)

    def cancel(self) -> None:
        self.http.post(f"/v1/batches/{self.id}/cancel")
        self.wait(lambda s: s["status"] in ("cancelled", "completed", "failed", "expired"), 600, "to end")

    def audit(self) -> dict[str, Any]:
        """Once ended: its counts, and whether every line was answered exactly once with its tokens."""
        s = self.state()
        out: dict[str, Any] = {"status": s["status"], "request_counts": s["request_counts"],
                               "seconds": round(time.time() - self.created, 1)}
        if s.get("output_file_id"):
            rows = [json.loads(x) for x in self.http.get(f"/v1/files/{s['output_file_id']}/content").text.splitlines()
                    if x.strip()]
            ids = [r["custom_id"] for r in rows]
            out["answered"], out["answered_twice"] = len(rows), len(ids) - len(set(ids))
            usage = [r["response"]["body"]["usage"]["completion_tokens"] for r in rows]
            out["short"] = sum(1 for n in usage if n != self.max_tokens)
        out["error_lines"] = 0
        if s.get("error_file_id"):
            out["error_lines"] = len([x for x in self.http.get(f"/v1/files/{s['error_file_id']}/content").text
                                      .splitlines() if x.strip()])
        return out
