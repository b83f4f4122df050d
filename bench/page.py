"""The current tables of docs/benchmarks.md and its two plots, from docs/results/current.json.

    .venv/bin/python -m bench.page            # rewrite the tables and docs/img/bench-*.png
    .venv/bin/python -m bench.page --check    # exit 1 when the page's tables are out of date

current.json names, per hardware class, each row's figures: a run summary in docs/results (a
``python -m bench.merge`` or ``*.summary.json`` document, a target and a level) for the harness's
figures, or the figures themselves (``tok_s``: one per run; ``ttft``, ``itl``: text) for a
``vllm bench serve`` run. Each table sits in docs/benchmarks.md between ``<!-- table:ID -->`` and
``<!-- /table:ID -->``; a re-run replaces current.json's entries and runs this script.
"""

from __future__ import annotations

import json
import re
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.sessions import summary as sessions_summary

HERE = Path(__file__).resolve().parent.parent / "docs" / "results"
PAGE = HERE.parent / "benchmarks.md"
IMG = HERE.parent / "img"
HEADER = ("| target | measured by | out tok/s | TTFT p50 / p99 ms | ITL p50 ms | CPU-s / 1k tok |\n"
          "|---|---|---|---|---|---|")


def harness(src: dict[str, Any] | list[dict[str, Any]]) -> dict[str, Any]:
    """One target and level of one or more run summaries: medians over all their repeats, tok/s
    with the lowest and highest repeat."""
    reps = []
    for one in src if isinstance(src, list) else [src]:
        doc = json.loads((HERE / one["file"]).read_text())
        level = doc["targets"][one["target"]]["levels"][one["level"]]
        reps += [r["summary"] for r in level.get("runs") or [{"summary": level["summary"]}]]

    def med(key: str) -> float | None:
        vals = [r[key] for r in reps if r.get(key) is not None]
        return statistics.median(vals) if vals else None

    def serving(r: dict[str, Any]) -> float:  # CPU outside the engine, the load client left out
        roles = r.get("cpu_by_role_per_1k_tokens") or {}
        return sum(v for k, v in roles.items() if k not in ("engine", "load client"))

    tok = [r["output_tok_s"] for r in reps]
    cpu = [serving(r) for r in reps if r.get("cpu_by_role_per_1k_tokens")]
    return {"tok": statistics.median(tok), "lo": min(tok), "hi": max(tok), "repeats": len(reps),
            "ttft": med("ttft_p50"), "ttft99": med("ttft_p99"), "itl": med("itl_p50"),
            "cpu": statistics.median(cpu) if cpu else None}


def _n(v: float) -> str:
    return f"{v:,.0f}"


def _ms(v: float | None) -> str:
    if v is None:
        return "-"
    ms = v * 1000
    return f"{ms:,.0f}" if ms >= 100 else f"{ms:.1f}"


def cells(row: dict[str, Any]) -> list[str]:
    """The row's cells after its target and its "measured by"."""
    if "text" in row:  # not measured, or withheld: one reason across the row
        return [row["text"], "", "", row.get("cpu", "")]
    if "from" in row:
        h = harness(row["from"])
        tok = f"{_n(h['tok'])} ({_n(h['lo'])}–{_n(h['hi'])})"
        cpu = f"{h['cpu']:.3f}" if h["cpu"] is not None else "-"
        return [tok, f"{_ms(h['ttft'])} / {_ms(h['ttft99'])}", _ms(h["itl"]), cpu]
    return [row.get("tok_text") or " · ".join(_n(v) for v in row["tok_s"]), row.get("ttft", "not recorded"),
            row.get("itl", "not recorded"), row.get("cpu", "-")]


def table(spec: dict[str, Any]) -> str:
    lines = [spec["line"], "", HEADER]
    for row in spec["rows"]:
        target = f"**{row['target']}**" if row.get("bold") else row.get("target", "")
        lines.append("| " + " | ".join([target, row["by"], *cells(row)]) + " |")
    lines += ["", "Runs: " + "; ".join(f"**{k}** {v}" for k, v in spec["runs"].items()) + "."]
    return "\n".join(lines)


SESSIONS_HEADER = ("| stack | follow-up prefix-cache hit rate | of the ideal | follow-up TTFT p50 / p90 ms | "
                   "out tok/s | busy time max/min | requests max/min |\n|---|---|---|---|---|---|---|")


def _range(s: dict[str, float] | None, fmt: str, scale: float = 1.0) -> str:
    if s is None:
        return "—"
    return f"{s['median'] * scale:{fmt}} ({s['min'] * scale:{fmt}}–{s['max'] * scale:{fmt}})"


def _files(file: str | list[str]) -> list[str]:
    return [file] if isinstance(file, str) else file


def _pooled(results: list[dict[str, Any]]) -> dict[str, Any]:
    """Several runs' stacks as one: each stack's repeats pooled, its summary made again of them all."""
    if len(results) == 1:
        return results[0]
    out: dict[str, Any] = {}
    for stacks in results:
        for label, st in stacks.items():
            runs = out.get(label, {}).get("runs", []) + st["runs"]
            out[label] = {**st, "runs": runs, "summary": sessions_summary(runs)}
    return out


def sessions_table(spec: dict[str, Any]) -> str:
    """A ``python -m bench.sessions`` result (or several runs', pooled): one row per stack, medians
    of its repeats (range)."""
    stacks = _pooled([json.loads((HERE / f).read_text())["stacks"] for f in _files(spec["file"])])
    ideal = stacks.get("single", {}).get("summary", {}).get("follow_up_hit_rate")
    lines = [spec["line"], "", SESSIONS_HEADER]
    for label, st in stacks.items():
        s = st["summary"]
        hit = s["follow_up_hit_rate"]
        share = f"{hit['median'] / ideal['median']:.0%}" if hit and ideal else "—"
        name = "1 worker (the ideal)" if label == "single" else \
            f"{st['workers']} workers, {'cache-affine pull' if st['affinity'] == 'prefix' else 'plain pull'}"
        if st.get("adapters"):
            name += f", {st['adapters']} LoRA adapter{'s' if st['adapters'] > 1 else ''}"
        ttft = f"{s['follow_up_ttft_p50_ms']['median']:,.0f} / {s['follow_up_ttft_p90_ms']['median']:,.0f}"
        lines.append(f"| {name} | {_range(hit, '.1f', 100)} % | {share} | {ttft} | {_range(s['output_tok_s'], ',.0f')} "
                     f"| {_range(s['busy_spread'], '.2f')} | {_range(s.get('requests_spread'), '.2f')} |")
    lines += ["", "Runs: " + "; ".join(f"**{k}** {v}" for k, v in spec["runs"].items()) + "."]
    return "\n".join(lines)


EMBED_HEADER = ("| target | inputs a request | in flight | inputs/s | input tokens/s | request latency p50 / p90 ms "
                "| vs vllm serve |\n| --- | --- | --- | --- | --- | --- | --- |")
#: the labels of bench.embeddings' inferq stacks (others by their name)
EMBED_TARGETS = {"inferq": "inferq", "inferq-solo": "inferq, a job per request"}


def embeddings_table(spec: dict[str, Any]) -> str:
    """A ``python -m bench.embeddings`` result: per batch size, each target's medians (range) of
    vLLM's client's figures, and inferq's inputs/s as a share of vllm serve's."""
    result = json.loads((HERE / spec["file"]).read_text())
    targets = result["targets"]
    conc = result["config"]["concurrency"]
    lines = [spec["line"], "", EMBED_HEADER]
    for level in targets["vllm-serve"]:
        batch, _, c = level.partition("@")
        ref = targets["vllm-serve"][level]["summary"]["inputs_s"]["median"]
        for name in ["vllm-serve", *(t for t in targets if t != "vllm-serve")]:
            s = targets[name][level]["summary"]
            lat = f"{s['e2el_p50_ms']['median']:,.0f} / {s['e2el_p90_ms']['median']:,.0f}"
            share = "1.00×" if name == "vllm-serve" else f"{s['inputs_s']['median'] / ref:.2f}×"
            label = "vllm serve" if name == "vllm-serve" else EMBED_TARGETS.get(name, name)
            lines.append(f"| {label} | {batch} | {c or conc} | {_range(s['inputs_s'], ',.0f')} "
                         f"| {_range(s['input_tok_s'], ',.0f')} | {lat} | {share} |")
    lines += ["", "Runs: " + "; ".join(f"**{k}** {v}" for k, v in spec["runs"].items()) + "."]
    return "\n".join(lines)


FLEET_HEADER = ("| case | pull | out tok/s | vs plain pull | TTFT p50 / mean / p99 ms | prefix-cache hit rate "
                "| busiest worker / mean |\n|---|---|---|---|---|---|---|")
CASE_NAMES = {"lora-1": "1 LoRA adapter", "lora-16-uniform": "16 adapters, uniform",
              "lora-16-zipf": "16 adapters, Zipf", "lora-32-uniform": "32 adapters, uniform, 8 slots",
              "lora-1-8slots": "1 LoRA adapter, 8 slots",
              "lora-16-uniform-2w": "16 adapters, uniform, 2 workers",
              "random": "nothing shared", "random-rate": "nothing shared, fixed rate", "prefix": "shared prefixes",
              "hot-prefix": "one hot prefix"}


def _fleet_cells(s: dict[str, Any], plain: dict[str, float] | None) -> str:
    """tok/s, vs plain pull, TTFT p50 / mean / p99 and hit rate of one summary, as table cells."""
    vs = f"{s['output_throughput']['median'] / plain['median']:.2f}×" if plain else "—"
    ttft = " / ".join(f"{s[k]['median']:,.0f}" for k in ("median_ttft_ms", "mean_ttft_ms", "p99_ttft_ms"))
    hit = _range(s.get("hit_rate"), ".1f", 100) + " %" if s.get("hit_rate") else "—"
    return f"{_range(s['output_throughput'], ',.0f')} | {vs} | {ttft} | {hit}"


def fleet_cases(doc: dict[str, Any]) -> dict[str, Any]:
    """The cases of a ``python -m bench.fleet`` result, or of its summary in docs/results."""
    return doc["cases"] if "cases" in doc else doc["fleet"]["cases"]


def fleet_table(spec: dict[str, Any]) -> str:
    """A ``python -m bench.fleet`` result (or its summary in docs/results): per case and pull, the
    medians (range) of vLLM's client's figures over the repeats; then ``vllm serve``'s, where run.
    ``cases``, where the spec names them, keeps those only (a run whose other cases a later one replaced)."""
    doc = json.loads((HERE / spec["file"]).read_text())
    keep = spec.get("cases")
    cases = {k: v for k, v in fleet_cases(doc).items() if keep is None or k in keep}
    refs = (doc.get("vllm_serve") or {}).get("cases", {})
    lines = [spec["line"], "", FLEET_HEADER]
    for name, case in cases.items():
        plain = case.get("off", {}).get("summary", {}).get("output_throughput")
        label = CASE_NAMES.get(name, name)
        for mode in ("off", "prefix"):
            if mode in case:
                s = case[mode]["summary"]
                lines.append(f"| {label} | {'cache-affine' if mode == 'prefix' else 'plain'} "
                             f"| {_fleet_cells(s, plain)} | {_range(s.get('busiest_over_mean'), '.2f')} |")
        if name in refs:
            lines.append(f"| {label} | `vllm serve`, one engine of the fleet's size "
                         f"| {_fleet_cells(refs[name]['summary'], plain)} | — |")
    lines += ["", "Runs: " + "; ".join(f"**{k}** {v}" for k, v in spec["runs"].items()) + "."]
    return "\n".join(lines)


RENDERERS = {"sessions": sessions_table, "embeddings": embeddings_table, "fleet": fleet_table}


def render(page: str, specs: list[dict[str, Any]]) -> str:
    for spec in specs:
        begin, end = f"<!-- table:{spec['id']} -->", f"<!-- /table:{spec['id']} -->"
        pattern = re.compile(re.escape(begin) + ".*?" + re.escape(end), re.S)
        if not pattern.search(page):
            raise SystemExit(f"{PAGE.name} has no {begin} ... {end}")
        text = f"{begin}\n{RENDERERS.get(spec.get('kind', ''), table)(spec)}\n{end}"
        page = pattern.sub(_literal(text), page)
    return page


def _literal(text: str) -> Callable[[re.Match[str]], str]:
    """A replacement for :meth:`re.Pattern.sub` that puts ``text`` in as it is (no backslash escapes)."""
    return lambda _m: text


def plot_points(spec: dict[str, Any]) -> list[tuple[str, str, float, float, float, float | None]]:
    """(target, client, tok/s, lowest, highest, TTFT p50 s) for each measured row."""
    out, target = [], ""
    for row in spec["rows"]:
        target = row.get("target") or target
        client = "vllm bench serve" if row["by"].startswith("vllm bench serve") else "harness"
        run = re.search(r"\(([A-Z])\)", row["by"])
        label = _short(target) + (f" ({run[1]})" if run else "")
        if "from" in row:
            h = harness(row["from"])
            out.append((label, client, h["tok"], h["lo"], h["hi"], h["ttft"]))
        elif "tok_s" in row:
            v = row["tok_s"]
            ttft = statistics.median(row["ttft_s"]) if row.get("ttft_s") else None
            out.append((label, client, statistics.median(v), min(v), max(v), ttft))
    return out


def _short(target: str) -> str:
    t = target.strip("*").replace("vLLM in-process", "in-process").replace(" (OpenAI API)", "")
    return t.replace(", 1 API server", " ×1").replace(", 4 API servers", " ×4")


def plots(specs: list[dict[str, Any]]) -> None:
    """bench-throughput.png and bench-ttft.png: one panel per table, one bar per measured row."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, LogLocator, MaxNLocator, NullFormatter

    colors = {"vllm bench serve": "#1f77b4", "harness": "#ff7f0e"}
    for key, fname, xlabel in (("tok", "bench-throughput.png", "output tokens/s (bars: lowest–highest)"),
                               ("ttft", "bench-ttft.png", "TTFT p50, ms (log scale)")):
        fig, axes = plt.subplots(1, len(specs), figsize=(10, 2.9))
        for ax, spec in zip(axes, specs, strict=True):
            pts = [p for p in plot_points(spec) if key == "tok" or p[5] is not None][::-1]
            ys = list(range(len(pts)))
            for y, (_t, client, tok, lo, hi, ttft) in zip(ys, pts, strict=True):
                if key == "tok":
                    ax.barh(y, tok, color=colors[client], xerr=[[tok - lo], [hi - tok]], capsize=2, height=0.7)
                elif ttft is not None:  # every point has one here (pts keeps those alone)
                    ax.barh(y, ttft * 1000, color=colors[client], height=0.7)
            ax.set_yticks(ys, [p[0] for p in pts], fontsize=7)
            ax.set_title(spec["short"], fontsize=8)
            ax.tick_params(axis="x", labelsize=6.5)
            if key == "ttft":
                ax.set_xscale("log")
                ax.set_xlim(left=min(p[5] for p in pts if p[5] is not None) * 1000 / 2)
                ax.xaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
                ax.xaxis.set_minor_formatter(NullFormatter())
            else:
                ax.xaxis.set_major_locator(MaxNLocator(4))
            ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _p: f"{v:,.0f}"))
            ax.set_xlabel(xlabel, fontsize=7)
            ax.grid(True, axis="x", alpha=0.3)
        handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in colors.values()]
        fig.legend(handles, list(colors), loc="lower center", fontsize=7, ncol=2, frameon=False)
        fig.tight_layout(rect=(0, 0.07, 1, 1))
        fig.savefig(IMG / fname, dpi=90)
        plt.close(fig)


def main(argv: list[str]) -> int:
    specs = json.loads((HERE / "current.json").read_text())["tables"]
    page = PAGE.read_text()
    new = render(page, specs)
    if "--check" in argv:
        if new != page:
            print(f"{PAGE} is out of date: .venv/bin/python -m bench.page")
            return 1
        return 0
    PAGE.write_text(new)
    plots([s for s in specs if s.get("kind") not in RENDERERS])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
