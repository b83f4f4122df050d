"""``bench run``: build the prompts, run every target at every level, write the results.

Order: the in-process engine first (its own subprocess, so its memory is freed), then each inferq
stack variant (started, measured through every client path that uses it, stopped), then vLLM's own
OpenAI server (one per setting: targets that differ only in their load client share one), then the
naive servers. Every level runs ``repeats`` times, each with fresh prompts. A target that fails is
recorded with its error; the others still run. An OpenAI HTTP target is driven by the harness's own
client or by vLLM's ``vllm bench serve`` (a target's ``client``: bench/vllm_bench.py).
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench import clients, cpu, vllm_bench
from bench.clientprocs import ClientPool
from bench.config import INFERQ_KINDS, SSE_KINDS, STREAMING_KINDS, Target, Workload
from bench.load import drive
from bench.metrics import add_ratios, combine_runs, summarize_level, summary_rows
from bench.prompts import PromptBuilder, load_tokenizer, resolve_model_path
from bench.stack import ROOT, Procs, base_env, start_inferq, start_naive
from bench.sysinfo import environment
from bench.vllm_serve import settings_for, start_vllm_serve


class Prompts:
    """Index layout shared by all targets: warm-up prompts, then one distinct slice per level and
    repeat (a repeat never meets a prompt its target has seen: no prefix-cache hits across runs)."""

    def __init__(self, w: Workload, builder: PromptBuilder) -> None:
        self.w, self.b = w, builder
        self.offsets: dict[str, int] = {}
        self.widths: dict[str, int] = {}
        n = w.warmup_requests
        for lv in w.all_levels():
            self.offsets[lv.label] = n
            self.widths[lv.label] = max(w.requests_for(t, lv) for t in w.targets if lv in w.levels(t))
            n += self.widths[lv.label] * w.repeats

    def indices(self, t: Target) -> tuple[list[int], list[tuple[Any, list[list[int]]]]]:
        plan = []
        for lv in self.w.levels(t):
            starts = [self.offsets[lv.label] + k * self.widths[lv.label] for k in range(self.w.repeats)]
            plan.append((lv, [list(range(s, s + self.w.requests_for(t, lv))) for s in starts]))
        return list(range(self.w.warmup_requests)), plan

    def payloads(self, t: Target, salt: int, make: Any) -> tuple[list[tuple[int, Any]], Any]:
        """(warm-up requests, plan) with ``make(index, text)`` as each request's payload."""
        chat = t.kind in SSE_KINDS and t.endpoint == "chat"
        text = self.b.chat_content if chat else self.b.text
        warm, plan = self.indices(t)
        build = lambda ids: [(i, make(i, text(i, salt))) for i in ids]  # noqa: E731
        return build(warm), [(lv, [build(ids) for ids in repeats]) for lv, repeats in plan]


def _log(msg: str) -> None:
    print(msg, flush=True)


def _levels_json(levels: dict[str, dict[str, Any]], streaming: bool) -> dict[str, Any]:
    """Per level: each repeat's summary and raw requests, and the level's summary over repeats
    (and, of a repeat that vLLM's client ran, that client's own figures)."""
    out = {}
    for label, lv in levels.items():
        runs = []
        for run in lv["runs"]:
            raw = [r if isinstance(r, dict) else r.to_json() for r in run["results"]]
            summary = summarize_level(raw, run["wall_s"], streaming)
            summary.update({k: run.get(k) for k in ("cpu_own", "cpu_others", "busiest_thread")})
            summary.update(cpu.per_1k_tokens(run, summary["output_tok_s"] * run["wall_s"]))
            extra = {}
            if run.get("vllm_bench"):
                summary["vllm_bench_own_tok_s"] = run["vllm_bench"]["output_tok_s_sum"]
                extra["vllm_bench"] = run["vllm_bench"]
            runs.append({"wall_s": run["wall_s"], "summary": summary, "requests": raw, **extra})
        out[label] = {"mode": lv["mode"], "value": lv["value"],
                      "summary": combine_runs([r["summary"] for r in runs]), "runs": runs}
    return out


def run_inprocess(w: Workload, t: Target, prompts: Prompts, salt: int, model_path: str, out: Path) -> dict:
    spec_stack = w.stack_for(t)
    settings = settings_for(w, spec_stack)
    warm, plan = prompts.payloads(t, salt, lambda _i, text: prompts.b.ids(text))
    spec = {"model_path": model_path, "settings": settings, "output_len": w.output_len,
            "temperature": w.temperature, "timeout_s": w.request_timeout_s, "seed": w.seed, "warmup": warm,
            "plan": [{"mode": lv.mode, "value": lv.value, "repeats": reps} for lv, reps in plan]}
    spec_path, res_path = out / f"{t.name}.spec.json", out / f"{t.name}.raw.json"
    spec_path.write_text(json.dumps(spec))
    env = base_env(**{k: v for k, v in spec_stack.env.items() if k.startswith("INFERQ_")},
                   **w.inprocess_env, **t.env)
    cmd = [sys.executable, "-m", "bench.inprocess", str(spec_path), str(res_path)]
    with open(out / "logs" / f"{t.name}.log", "w") as log:
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, cwd=ROOT,
                             text=True, process_group=0)  # see cli.procs.Proc
        try:
            assert p.stdout is not None
            for line in p.stdout:
                log.write(line)
                if line.startswith("    "):
                    _log(line.rstrip())
            p.wait()
        finally:
            if p.poll() is None:
                p.kill()
                p.wait()
    if p.returncode != 0:
        raise RuntimeError(f"in-process engine exited with code {p.returncode}; see {log.name}")
    return _levels_json(json.loads(res_path.read_text())["levels"], True)


async def _fill_stages(base: str, levels: dict[str, dict[str, Any]], headers: dict[str, str]) -> None:
    """After a level: read each job's record for its queue time and TTFT stages (outside the
    measured window)."""
    sem = asyncio.Semaphore(32)
    async with clients.http_client(base, headers) as http:
        async def one(r: Any) -> None:
            async with sem:
                try:
                    await clients.job_stages(http, r)
                except Exception:
                    r.queued = None
        await asyncio.gather(*(one(r) for lv in levels.values() for run in lv["runs"] for r in run["results"]
                               if r.ok and r.job_id and r.queued is None))


async def run_vllm_bench(w: Workload, t: Target, prompts: Prompts, salt: int, base: str, model_path: str,
                         out: Path, about: dict[str, Any], api_key: str | None = None) -> dict:
    """An OpenAI HTTP target driven by vLLM's own client (bench/vllm_bench.py); what to say about
    the client goes into ``about``."""
    headers = clients.auth_headers(api_key) if t.kind in INFERQ_KINDS else {}
    async with clients.http_client(base, headers) as http:
        model = await _served_model(http, t.kind)
    spec = vllm_bench.BenchSpec(
        base=base, endpoint=t.endpoint, model=model, tokenizer=model_path,
        input_len=vllm_bench.random_input_len(prompts.b.tok, w.prompt_len, t.endpoint == "chat"),
        output_len=w.output_len, temperature=w.temperature, result_dir=str(out / "vllm-bench"),
        tag=f"{w.seed}/{salt}", env={"OPENAI_API_KEY": api_key} if api_key and t.kind in INFERQ_KINDS else {})
    warm, plan = prompts.indices(t)
    levels, info = await vllm_bench.drive_target(spec, w.client_processes, w.output_len, warm, plan,
                                                 w.request_timeout_s, w.seed, out / "logs", t.name, _log)
    about.update(info)
    return _levels_json(levels, True)


async def run_http_target(w: Workload, t: Target, prompts: Prompts, salt: int, base: str,
                          api_key: str | None = None) -> dict:
    """An inferq client path, vLLM's own server or a naive server, driven from this process by the
    harness's own client."""
    common = {"max_tokens": w.output_len, "temperature": w.temperature, "ignore_eos": True}
    headers = clients.auth_headers(api_key) if t.kind in INFERQ_KINDS else {}
    path = ""
    async with clients.http_client(base, headers) as http:
        if t.kind in SSE_KINDS:
            model = await _served_model(http, t.kind)
            path = "/v1/chat/completions" if t.endpoint == "chat" else "/v1/completions"
            extra = {"model": model, "stream": True, "stream_options": {"include_usage": True}, **common}
            if t.endpoint == "chat":
                make = lambda _i, text: {"messages": [{"role": "user", "content": text}], **extra}  # noqa: E731
            else:
                make = lambda _i, text: {"prompt": text, **extra}  # noqa: E731
        else:
            make = lambda _i, text: {"prompt": text, **common}  # noqa: E731
        warm, plan = prompts.payloads(t, salt, make)
        spec = clients.SendSpec(t.kind, base, path, w.output_len, headers, t.poll_interval_ms / 1000)
        send = clients.sender(spec, http)
        if w.client_processes > 1:
            async with ClientPool(w.client_processes, spec, w.request_timeout_s) as pool:
                levels = await drive(send, warm, plan, w.request_timeout_s, w.seed, _log, run=pool.run_level)
        else:
            levels = await drive(send, warm, plan, w.request_timeout_s, w.seed, _log)
    if t.kind in ("inferq-ws", "inferq-sse"):
        await _fill_stages(base, levels, headers)
    return _levels_json(levels, t.kind in STREAMING_KINDS)


async def _served_model(http: Any, kind: str) -> str:
    """The model name to ask for: inferq's ``/readyz`` says it; vLLM's server lists it."""
    if kind == "inferq-sse":
        return str((await http.get("/readyz")).json().get("model"))
    return str((await http.get("/v1/models")).json()["data"][0]["id"])


def _same_server(a: Target, b: Target) -> bool:
    """Whether ``b`` is measured on the stack or server started for ``a``."""
    if a.kind in INFERQ_KINDS and b.kind in INFERQ_KINDS:
        return a.stack == b.stack
    return a.kind == b.kind == "vllm-serve" and (a.stack, a.api_servers, a.env) == (b.stack, b.api_servers, b.env)


def _start_server(procs: Procs, w: Workload, t: Target, base_url: str | None, model_path: str) -> str:
    """Start the stack or server ``t`` is measured on (or take ``base_url``'s); its base URL."""
    if t.kind in INFERQ_KINDS:
        spec = w.stack_for(t)
        _log(f"[stack {t.stack}] starting redis + {spec.workers} worker(s) + gateway"
             if base_url is None else f"[stack] using {base_url}")
        return base_url or start_inferq(procs, w, spec, t.stack)
    if t.kind == "vllm-serve":
        _log(f"[{t.name}] starting vLLM's OpenAI server"
             + (f" ({t.api_servers} API servers)" if t.api_servers > 1 else ""))
        return start_vllm_serve(procs, w, w.stack_for(t), model_path, t.name, t.env, t.api_servers)
    mode = "static" if t.kind == "naive-hf-static" else "serial"
    _log(f"[{t.name}] starting the naive HF server ({mode})")
    return start_naive(procs, w, model_path, mode, t.batch_size or w.naive_batch_size, t.env, t.name)


def _measure(w: Workload, g: Target, prompts: Prompts, salt: int, base: str, model_path: str, out: Path,
             api_key: str | None, result: dict[str, Any]) -> None:
    """Drive target ``g`` against ``base``; its levels (or its error) go into ``result``."""
    client = w.client_for(g)
    _log(f"[{g.name}]" + (f" driven by {vllm_bench.LABEL}" if client == "vllm-bench" else ""))
    try:
        if client == "vllm-bench":
            about: dict[str, Any] = {}
            result["vllm_bench"] = about
            result["levels"] = asyncio.run(run_vllm_bench(w, g, prompts, salt, base, model_path, out, about,
                                                          api_key))
            return
        result["levels"] = asyncio.run(run_http_target(w, g, prompts, salt, base, api_key))
    except Exception as e:
        result["error"] = f"{type(e).__name__}: {e}"
        _log(f"[{g.name}] FAILED: {result['error']}")


def run(w: Workload, out: Path, base_url: str | None = None, api_key: str | None = None,
        only: set[str] | None = None) -> dict[str, Any]:
    """Run the whole workload; write ``results.json`` into ``out`` (after each stack or server, with
    ``partial`` true until the end) and return it.

    ``base_url``: measure this running gateway instead of starting stacks (``api_key`` for it).
    ``only``: run just these targets (each with the prompts it gets in a full run), e.g. to split
    one workload over several calls on the same machine; ``python -m bench.merge`` joins them."""
    (out / "logs").mkdir(parents=True, exist_ok=True)
    os.environ[cpu.ROOT_ENV] = str(os.getpid())  # the in-process subprocess counts CPU for our tree
    t_start = time.time()
    model_path = resolve_model_path(w.model)
    _log(f"bench {w.name}: model {model_path}, prompt {w.prompt_len} tokens, output {w.output_len} tokens")
    prompts = Prompts(w, PromptBuilder(load_tokenizer(model_path), w.prompt_len, w.seed))
    salts = {t.name: i for i, t in enumerate(w.targets)}
    order = sorted(w.targets, key=lambda t: (t.kind != "inprocess", t.kind.startswith("naive"),
                                             t.kind == "vllm-serve", t.stack, w.targets.index(t)))
    if only:
        order = [t for t in order if t.name in only]
    results: dict[str, dict[str, Any]] = {
        t.name: {"kind": t.kind, "stack": t.stack, "client": w.client_for(t), "error": None, "levels": {},
                 **({"api_servers": t.api_servers} if t.kind == "vllm-serve" else {})} for t in order}
    env = environment()

    def write(partial: bool) -> dict[str, Any]:  # after each stack or server: a call cut short keeps those done
        add_ratios(results)
        doc = {"workload": w.to_json(), "model_path": model_path, "environment": env, "started_at": t_start,
               "duration_s": time.time() - t_start, "base_url": base_url, "partial": partial, "targets": results,
               "summary": summary_rows(results)}
        (out / "results.json").write_text(json.dumps(doc, indent=1))
        return doc

    jobs: list[list[Target]] = []  # inferq targets of one stack variant share one stack, and vllm-serve
    for t in order:                # targets of the same settings one server (e.g. driven by two clients)
        same = [j for j in jobs if _same_server(j[0], t)]
        if same:
            same[0].append(t)
        else:
            jobs.append([t])
    for i, group in enumerate(jobs):
        if i:
            write(partial=True)  # the groups so far
        t = group[0]
        for g in group:  # other processes' load on this machine, for reading noisy numbers
            results[g.name]["loadavg_1m_before"] = round(os.getloadavg()[0], 2)
        try:
            with Procs(out / "logs") as procs:
                if t.kind == "inprocess":
                    _log(f"[{t.name}] vLLM AsyncLLM in-process")
                    results[t.name]["levels"] = run_inprocess(w, t, prompts, salts[t.name], model_path, out)
                    continue
                base = _start_server(procs, w, t, base_url, model_path)
                for g in group:
                    _measure(w, g, prompts, salts[g.name], base, model_path, out, api_key, results[g.name])
        except Exception as e:  # the stack or server did not start: every target in the group failed
            for g in group:
                results[g.name]["error"] = results[g.name]["error"] or f"{type(e).__name__}: {e}"
            _log(f"[{t.name}] FAILED: {type(e).__name__}: {str(e)[:2000]}")
    return write(partial=False)
