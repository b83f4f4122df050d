"""Interactive and batch work on one fleet, and two tenants sharing it (docs/design.md, "Service classes").

    python -m bench.classes bench/configs/classes/cpu-classes.json --out results/classes [--only STACK ...]

**Classes.** Interactive traffic from ``vllm bench serve`` at a fixed request rate, ``load`` (about
half) of the fleet's capacity, while a Batch API job of ``batch_lines`` lines runs beside it; every
repeat also runs the interactive traffic alone. Three fleets, started one after the other:
``classes`` (the defaults: service classes on), ``today`` (INFERQ_SERVICE_CLASSES=false: batch lines
at priority 9, a worker takes any job into any slot) and ``fifo`` (classes and fair share off, batch
lines at the interactive priority: everything one class). Capacity is the rate the batch's lines are
answered at with nothing else running (output tokens/s), measured on the first fleet; the
interactive rate is ``load x capacity / output_len`` for every fleet. Per run: interactive TTFT and
ITL p50/p99 (vLLM's figures), the batch's output tokens/s over the interactive run, and the share
of the capacity interactive work left idle that batch used (against the capacity measured last:
``--capacity`` measures it again, on a quieter host, keeping the rate). On ``classes`` the batch then runs to
its end and is audited: every line answered once, with all its tokens.

**Tenants.** Two keys of equal weight run closed loops (``vllm bench serve``); ``heavy`` asks
``heavy_factor`` times the output tokens per request. Fleets: ``fair`` (running-slot fair share on),
``tenants-fifo`` (fair share off), ``tenants-queue`` (the defaults: fair share in the queue, the
tenant reserve, rooms for a tenant that runs nothing), ``tenants-prompt-full`` (the same with prompt
tokens charged in full, ``INFERQ_FAIR_PROMPT_WEIGHT=1``) and ``tenants-no-reserve`` (the same with
the interactive reserve open to any tenant's job, ``INFERQ_TENANT_RESERVE=false``) and ``tenants-no-keep``
(a tenant's sequence kept only while it holds a job, ``INFERQ_TENANT_RESERVE_KEEP_S=0``) and ``tenants-no-room``
(no room made for a tenant that runs nothing, ``INFERQ_TENANT_ROOM_FOR_NEW=false``). Per repeat: both backlogged
(``tenant_concurrency`` clients each): each tenant's output tokens in every ``window_s`` window
(sliding by ``step_s``) while both run, the largest weighted service ratio of any window (of output
tokens, and counted as fair share charges: prompt tokens at INFERQ_FAIR_PROMPT_WEIGHT too), the total
output tokens/s; then the heavy one backlogged beside the light one with ``light_concurrency``
clients (fewer than its share of the slots): the light one's TTFT p90 (and p99) over the requests
it sent while the heavy one ran, against its run alone (on ``fair``, ``tenants-queue``,
``tenants-no-keep`` and ``tenants-no-room``).

Results: ``OUT/classes.json`` (every run, each invocation adding its stacks: a GPU run may be split
across calls with ``--only``) and ``OUT/summary.json`` (medians of the repeats with min and max).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx

from bench.classes_load import Batch, Load, finish_client, run_client, start_client
from bench.classes_tenants import service_windows
from bench.config import StackSpec, Workload
from bench.stack import Procs, start_inferq
from bench.sysinfo import cpu_model

STACKS = {  # name -> environment over the config's (every worker and the gateway)
    "classes": {},
    "targets": {},  # classes with the config's interactive latency targets (``targets_env``)
    "today": {"INFERQ_SERVICE_CLASSES": "false"},
    "fifo": {"INFERQ_SERVICE_CLASSES": "false", "INFERQ_FAIR_SHARE": "false", "INFERQ_BATCH_PRIORITY": "5"},
    "fair": {"INFERQ_RUNNING_FAIR_SHARE": "true"},  # fair share in the queue and in running slots
    "tenants-fifo": {"INFERQ_FAIR_SHARE": "false"},
    "tenants-queue": {},  # fair share in the queue only (the default)
    "tenants-prompt-full": {"INFERQ_FAIR_PROMPT_WEIGHT": "1"},  # the same, prompt tokens charged in full
    "tenants-no-reserve": {"INFERQ_TENANT_RESERVE": "false"},  # the same, any tenant's job takes the reserve
    "tenants-no-keep": {"INFERQ_TENANT_RESERVE_KEEP_S": "0"},  # the reserve only for tenants holding a job
    "tenants-no-room": {"INFERQ_TENANT_ROOM_FOR_NEW": "false"},  # a newcomer waits for a backlog job to end
}
TENANT_STACKS = ("fair", "tenants-fifo", "tenants-queue", "tenants-prompt-full", "tenants-no-reserve",
                 "tenants-no-keep", "tenants-no-room")
TENANT_KEYS = {"heavy": "bench-key-heavy", "light": "bench-key-light"}


@dataclass
class ClassesConfig:
    name: str = "classes"
    model: str | None = None  # None: the built-in tiny model
    load_format: str = "auto"
    max_model_len: int | None = None
    max_num_seqs: int = 8
    kv_cache_gib: float = 1.0
    gpu_memory_utilization: float = 0.9
    env: dict[str, str] = field(default_factory=dict)
    targets_env: dict[str, str] = field(default_factory=dict)  # the "targets" fleet's latency targets
    # or, when set, targets this many times the classes fleet's interactive-alone p99s of the same run
    targets_factor: float | None = None
    stacks: list[str] = field(default_factory=lambda: list(STACKS))
    repeats: int = 3
    startup_timeout_s: float = 600.0
    input_len: int = 128  # interactive requests
    output_len: int = 64
    load: float = 0.5  # the interactive rate, as a fraction of the capacity
    interactive_s: float = 60.0  # how long each interactive run lasts (at its rate)
    batch_lines: int = 2000
    batch_prompt_words: int = 32
    batch_max_tokens: int = 128
    capacity_s: float = 30.0
    warmup: int = 32  # requests sent to each fleet before its first run (not counted)
    tenant_concurrency: int = 20  # each tenant's clients when both are backlogged
    light_concurrency: int = 4  # the light tenant's clients beside the heavy backlog (fewer than its share)
    heavy_factor: int = 10
    tenant_tokens: int = 100_000  # output tokens each tenant asks for in a run
    window_s: float = 60.0
    step_s: float = 10.0


def load_config(path: Path) -> ClassesConfig:
    """A config file: ClassesConfig's fields (and a ``comment``)."""
    raw = json.loads(path.read_text())
    raw.pop("comment", None)
    return ClassesConfig(**raw)


def spread(values: list[float]) -> dict[str, float] | None:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)} if values else None


def capacity(http: httpx.Client, cfg: ClassesConfig, model: str) -> float:
    """Output tokens/s the fleet answers batch lines at with nothing else running."""
    b = Batch(http, model, cfg.batch_lines, cfg.batch_prompt_words, cfg.batch_max_tokens, "capacity")
    b.wait(lambda s: s["request_counts"]["completed"] >= cfg.max_num_seqs, 900, "its first lines answered")
    got = b.rate(cfg.capacity_s)
    b.cancel()
    return got


def classes_run(http: httpx.Client, cfg: ClassesConfig, stack: str, ctx: dict[str, Any], repeat: int,
                out: Path) -> dict[str, Any]:
    """One repeat on a fleet: interactive alone, then beside a batch job."""
    seed = 100 * repeat + list(STACKS).index(stack)
    load = Load(cfg.input_len, cfg.output_len, max(10, round(ctx["rate"] * cfg.interactive_s)), rate=ctx["rate"])
    alone = run_client(load, ctx["base"], ctx["model"], ctx["tokenizer"], seed, out, f"{stack}-{repeat}-alone")
    b = Batch(http, ctx["model"], cfg.batch_lines, cfg.batch_prompt_words, cfg.batch_max_tokens, f"{stack}{repeat}")
    b.wait(lambda s: s["request_counts"]["completed"] >= 1, 900, "its first line answered")
    n0, t0 = b.done_lines(), time.monotonic()
    mixed = finish_client(start_client(load, ctx["base"], ctx["model"], ctx["tokenizer"], seed + 50, out,
                                       f"{stack}-{repeat}-mixed"), out, f"{stack}-{repeat}-mixed", 3600)
    batch_tps = (b.done_lines() - n0) * cfg.batch_max_tokens / (time.monotonic() - t0)
    if stack == "classes":  # the batch runs to its end: every line answered once
        b.wait(lambda s: s["status"] in ("completed", "failed", "expired", "cancelled"), 7200, "to end")
    else:
        b.cancel()
    idle = ctx["capacity"] - (mixed["output_throughput"] or 0.0)
    for run in (alone, mixed):
        run.pop("requests")
    return {"alone": alone, "mixed": mixed, "batch_tok_s": batch_tps, "idle_tok_s": idle,
            "idle_used": batch_tps / idle if idle > 0 else None, "batch": b.audit()}


def tenants_run(cfg: ClassesConfig, stack: str, ctx: dict[str, Any], repeat: int, out: Path) -> dict[str, Any]:
    """One repeat: both tenants backlogged (service over time); the heavy one backlogged beside a
    light one asking less than its share (the light one's TTFT); on ``fair`` the light one alone too."""
    seed, c = 1000 + 100 * repeat + list(STACKS).index(stack), cfg.tenant_concurrency
    heavy_out = cfg.output_len * cfg.heavy_factor
    heavy = Load(cfg.input_len, heavy_out, max(c, cfg.tenant_tokens // heavy_out), concurrency=c)
    light = Load(cfg.input_len, cfg.output_len, max(c, cfg.tenant_tokens // cfg.output_len), concurrency=c)
    few = Load(cfg.input_len, cfg.output_len, max(cfg.light_concurrency, cfg.tenant_tokens // cfg.output_len // 2),
               concurrency=cfg.light_concurrency)
    args = (ctx["base"], ctx["model"], ctx["tokenizer"])

    def together(name: str, loads: dict[str, Load]) -> dict[str, dict[str, Any]]:
        procs = {t: start_client(load, *args, seed + k, out, f"{stack}-{repeat}-{name}-{t}", TENANT_KEYS[t])
                 for k, (t, load) in enumerate(loads.items())}
        return {t: finish_client(p, out, f"{stack}-{repeat}-{name}-{t}", 7200) for t, p in procs.items()}

    both = together("backlogged", {"heavy": heavy, "light": light})
    reqs = {t: r.pop("requests") for t, r in both.items()}
    got: dict[str, Any] = {"service": service_windows(reqs, cfg.window_s, cfg.step_s), "backlogged": both}
    # the same windows counted as fair share charges them (prompt tokens at the fleet's weight)
    charged = service_windows(reqs, cfg.window_s, cfg.step_s, prompt_weight=prompt_weight(cfg, stack))
    got["service"]["charged_ratio_max"] = charged["ratio_max"]
    beside = together("beside", {"heavy": heavy, "light": few})
    light_req, heavy_req = beside["light"].pop("requests"), beside["heavy"].pop("requests")
    got["light_beside_p90_ttft_ms"] = ttft_while(light_req, heavy_req)
    got["light_beside_p99_ttft_ms"] = ttft_while(light_req, heavy_req, 0.99)
    got["beside"] = beside
    if stack in ("fair", "tenants-queue", "tenants-no-keep", "tenants-no-room"):
        solo = run_client(few, *args, seed + 7, out, f"{stack}-{repeat}-solo", TENANT_KEYS["light"])
        got["light_solo_p90_ttft_ms"] = ttft_while(solo.pop("requests"), None)
        got["light_solo"] = solo
    return got


def ttft_while(req: dict[str, Any], other: dict[str, Any] | None, q: float = 0.9) -> float | None:
    """The TTFT quantile ``q`` (ms) of the requests that started while ``other``'s ran (all without ``other``)."""
    starts, ttfts = req.get("start_times") or [], req.get("ttfts") or []
    if other is not None and other.get("start_times"):
        lo = min(other["start_times"])
        hi = max(s + (lat or 0.0) for s, lat in zip(other["start_times"], other.get("latencies") or [], strict=False))
        ttfts = [t for s, t in zip(starts, ttfts, strict=False) if lo <= s <= hi]
    ttfts = sorted(t for t in ttfts if t)
    return 1000 * ttfts[min(len(ttfts) - 1, int(q * len(ttfts)))] if ttfts else None


def _keep(out: Path, stack: str, runs: list[dict[str, Any]], ctx: dict[str, Any] | None = None) -> None:
    """The repeats so far, written after each (a run cut short by a time limit keeps them)."""
    extra = {"capacity_tok_s": ctx.get("capacity"), "rate_rps": ctx.get("rate")} if ctx else {}
    (out / f"{stack}-runs.json").write_text(json.dumps({"runs": runs, **extra}, indent=1) + "\n")


def prompt_weight(cfg: ClassesConfig, stack: str) -> float:
    """What fair share charges a prompt token on this fleet (an output token: 1)."""
    from inferq.shared.settings import Settings

    env = {**cfg.env, **stack_env(cfg, stack)}
    default = Settings.model_fields["fair_prompt_weight"].default
    return float(env.get("INFERQ_FAIR_PROMPT_WEIGHT", default))


def stack_env(cfg: ClassesConfig, stack: str) -> dict[str, str]:
    """What a fleet sets over the config's environment."""
    return {**STACKS[stack], **(cfg.targets_env if stack == "targets" else {})}


def measured_targets(summary: dict[str, Any], factor: float) -> dict[str, str]:
    """The 'targets' fleet's latency targets: ``factor`` times the interactive-alone TTFT and ITL p99s
    (medians of the repeats) the classes fleet measured on this host."""
    alone = summary["stacks"].get("classes")
    if not alone:
        raise SystemExit("targets_factor: run the classes fleet first (in this call or an earlier one)")
    return {"INFERQ_INTERACTIVE_TTFT_P99_MS": f"{factor * alone['alone_p99_ttft_ms']['median']:.1f}",
            "INFERQ_INTERACTIVE_ITL_P99_MS": f"{factor * alone['alone_p99_itl_ms']['median']:.2f}"}


def run_stack(cfg: ClassesConfig, stack: str, out: Path, ctx: dict[str, Any]) -> dict[str, Any]:
    env = {**cfg.env, **stack_env(cfg, stack)}
    if stack in TENANT_STACKS:
        keys_file = out / "keys.txt"
        keys_file.write_text("".join(f"{k} {t} tenant={t}\n" for t, k in TENANT_KEYS.items()))
        env["INFERQ_API_KEYS_FILE"] = str(keys_file)
    spec = StackSpec(workers=1, max_num_seqs=cfg.max_num_seqs, kv_cache_gib=cfg.kv_cache_gib,
                     gpu_memory_utilization=cfg.gpu_memory_utilization, env=env,
                     startup_timeout_s=cfg.startup_timeout_s)
    w = Workload(name=cfg.name, model=cfg.model, load_format=cfg.load_format, max_model_len=cfg.max_model_len)
    (out / "logs" / stack).mkdir(parents=True, exist_ok=True)
    runs: list[dict[str, Any]] = []
    with Procs(out / "logs" / stack) as procs:
        ctx["base"] = start_inferq(procs, w, spec, stack)
        headers = {"Authorization": f"Bearer {TENANT_KEYS['light']}"} if "INFERQ_API_KEYS_FILE" in env else {}
        with httpx.Client(base_url=ctx["base"], timeout=60, headers=headers) as http:
            ctx["model"] = http.get("/v1/models").json()["data"][0]["id"]
            ctx["tokenizer"] = cfg.model or http.get("/v1/workers").json()[0]["tokenizer"]
            key = TENANT_KEYS["light"] if headers else None  # the first requests of a fleet pay for its start-up
            run_client(Load(cfg.input_len, cfg.output_len, cfg.warmup, concurrency=cfg.max_num_seqs), ctx["base"],
                       ctx["model"], ctx["tokenizer"], 999_999, out, f"{stack}-warmup", key)
            if stack in TENANT_STACKS:
                for k in range(cfg.repeats):
                    runs.append(tenants_run(cfg, stack, ctx, k, out))
                    _keep(out, stack, runs)
            else:
                if "capacity" not in ctx:
                    ctx["capacity"] = capacity(http, cfg, ctx["model"])
                    ctx.setdefault("rate", cfg.load * ctx["capacity"] / cfg.output_len)  # kept when re-measured
                    print(f"capacity {ctx['capacity']:.0f} output tok/s: interactive at {ctx['rate']:.2f} req/s",
                          flush=True)
                for k in range(cfg.repeats):
                    runs.append(classes_run(http, cfg, stack, ctx, k, out))
                    _keep(out, stack, runs, ctx)
    return {"env": stack_env(cfg, stack), "runs": runs}


def summarize(result: dict[str, Any]) -> dict[str, Any]:
    """Medians of the repeats (with min and max) of what the page shows."""
    out: dict[str, Any] = {"host": result.get("host"), "capacity_tok_s": result.get("capacity_tok_s"),
                           "rate_rps": result.get("rate_rps"), "stacks": {}}
    for name, stack in result.get("stacks", {}).items():
        runs = stack["runs"]
        if not runs:
            continue
        if "mixed" in runs[0]:
            pick = {f"{part}_{k}": [r[part][k] for r in runs if r[part].get(k) is not None]
                    for part in ("alone", "mixed") for k in ("median_ttft_ms", "p99_ttft_ms", "median_itl_ms",
                                                            "p99_itl_ms", "output_throughput")}
            cap = result.get("capacity_tok_s") or 0.0  # the last measured: a later --capacity call re-measures it
            pick.update(batch_tok_s=[r["batch_tok_s"] for r in runs],
                        idle_used=[r["batch_tok_s"] / (cap - r["mixed"]["output_throughput"]) for r in runs
                                   if cap > (r["mixed"]["output_throughput"] or 0.0)])
            s: dict[str, Any] = {k: spread(v) for k, v in pick.items()}
            s["batch_audits"] = [r["batch"] for r in runs]
        else:
            pick = {"ratio_max": [r["service"]["ratio_max"] for r in runs if r["service"]["ratio_max"]],
                    "charged_ratio_max": [r["service"]["charged_ratio_max"] for r in runs
                                          if r["service"].get("charged_ratio_max")],
                    "total_tok_s": [r["service"]["total_tok_s"] for r in runs],
                    **{k: [r[k] for r in runs if r.get(k) is not None]
                       for k in ("light_beside_p90_ttft_ms", "light_beside_p99_ttft_ms")}}
            if "light_solo" in runs[0]:
                pick["light_solo_p90_ttft_ms"] = [r["light_solo_p90_ttft_ms"] for r in runs
                                                  if r["light_solo_p90_ttft_ms"] is not None]
            s = {k: spread(v) for k, v in pick.items()}
            s["service_windows"] = runs[0]["service"]["windows"]
        out["stacks"][name] = s
    return out


def _fmt(v: dict[str, float] | None, digits: int = 0) -> str:
    if not v:
        return "—"
    f = f"{{:,.{digits}f}}"
    return f"{f.format(v['median'])} ({f.format(v['min'])}–{f.format(v['max'])})"


def table(summary: dict[str, Any]) -> str:
    """The page's tables (docs/benchmarks.md), from a summary: medians of the repeats (min–max)."""
    st = summary["stacks"]
    lines = ["| fleet | interactive alone: TTFT p99 / ITL p99 ms | beside the batch job: TTFT p50 / p99 ms | ITL p50 "
             "/ p99 ms | TTFT p99, ITL p99 vs alone | batch out tok/s | idle capacity batch used |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    # each fleet against its own interactive-alone runs (same fleet, same repeats): the fleets' settings
    # change how interactive work alone fares too (with classes off a worker takes no more than its slots)
    for name in ("classes", "targets", "today", "fifo"):
        s = st.get(name)
        if not s:
            continue
        vs = (f"{s['mixed_p99_ttft_ms']['median'] / s['alone_p99_ttft_ms']['median']:.2f}×, "
              f"{s['mixed_p99_itl_ms']['median'] / s['alone_p99_itl_ms']['median']:.2f}×")
        idle = f"{100 * s['idle_used']['median']:.0f} %" if s.get("idle_used") else "—"
        lines.append(f"| {name} | {_fmt(s['alone_p99_ttft_ms'])} / {_fmt(s['alone_p99_itl_ms'], 1)} | "
                     f"{_fmt(s['mixed_median_ttft_ms'])} / {_fmt(s['mixed_p99_ttft_ms'])} | "
                     f"{_fmt(s['mixed_median_itl_ms'], 1)} / {_fmt(s['mixed_p99_itl_ms'], 1)} | {vs} | "
                     f"{_fmt(s['batch_tok_s'])} | {idle} |")
    lines += ["", "| fleet | service ratio, worst window (both backlogged): output tokens / as charged | total out "
              "tok/s | light TTFT p90 beside the heavy backlog / alone ms | light TTFT p99 beside it ms |",
              "| --- | --- | --- | --- | --- |"]
    for name in TENANT_STACKS:
        s = st.get(name)
        if s:
            solo = f" / {_fmt(s['light_solo_p90_ttft_ms'])}" if s.get("light_solo_p90_ttft_ms") else ""
            lines.append(f"| {name} | {_fmt(s['ratio_max'], 2)} / {_fmt(s.get('charged_ratio_max'), 2)} | "
                         f"{_fmt(s['total_tok_s'])} | {_fmt(s['light_beside_p90_ttft_ms'])}{solo} | "
                         f"{_fmt(s.get('light_beside_p99_ttft_ms'))} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.classes", description=__doc__.split("\n\n")[0])
    ap.add_argument("config", type=Path)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--only", nargs="+", choices=list(STACKS), help="run only these fleets (results are added)")
    ap.add_argument("--capacity", action="store_true", help="measure the capacity again (on this call's first "
                    "fleet of the classes part), keeping the interactive rate of the runs before")
    ap.add_argument("--table", action="store_true", help="print the page's tables from OUT/classes.json (and write "
                    "its summary), run nothing")
    a = ap.parse_args(argv)
    if a.table:  # (the summary made again from the runs: summarize may be newer than the run)
        summary = summarize(json.loads((a.out / "classes.json").read_text()))
        (a.out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
        print(table(summary), end="")
        return 0
    cfg = load_config(a.config)
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "logs").mkdir(exist_ok=True)
    path = a.out / "classes.json"
    result = json.loads(path.read_text()) if path.exists() else {"config": asdict(cfg), "stacks": {}}
    result["host"] = cpu_model() if cfg.model is None else result.get("host")
    ctx: dict[str, Any] = {}
    if "capacity_tok_s" in result:
        ctx = {"capacity": result["capacity_tok_s"], "rate": result["rate_rps"]}
        if a.capacity:  # measured again on this call's first fleet; the interactive rate stays
            del ctx["capacity"]
    for stack in a.only or cfg.stacks:
        if stack == "targets" and cfg.targets_factor:
            cfg.targets_env = measured_targets(summarize(result), cfg.targets_factor)
        result["stacks"][stack] = run_stack(cfg, stack, a.out, ctx)
        if "capacity" in ctx:
            result["capacity_tok_s"], result["rate_rps"] = ctx["capacity"], ctx["rate"]
        path.write_text(json.dumps(result, indent=1) + "\n")
        (a.out / "summary.json").write_text(json.dumps(summarize(result), indent=1) + "\n")
        print(stack, json.dumps(summarize(result)["stacks"].get(stack), default=str)[:2000], flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
