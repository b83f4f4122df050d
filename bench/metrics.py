"""Per-level summaries from raw request results (one per repeat, then the median over repeats),
and ratios against the in-process ceiling and against vLLM's own server."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from bench.load import STAGES

SUMMARY_KEYS = ("ttft", "itl", "tpot", "e2e", *STAGES)


def _pct(values: Sequence[float], q: float) -> float | None:
    return float(np.percentile(np.asarray(values, dtype=float), q)) if len(values) else None


def summarize_level(results: Sequence[dict[str, Any]], wall_s: float, streaming: bool) -> dict[str, Any]:
    """Throughput and latency percentiles (seconds) of one level; failed requests are only counted."""
    ok = [r for r in results if r["ok"]]
    tokens = sum(int(r["out_tokens"]) for r in ok)
    s: dict[str, Any] = {
        "requests": len(results),
        "ok": len(ok),
        "failed": len(results) - len(ok),
        "errors": sorted({str(r["error"]) for r in results if not r["ok"]})[:5],
        "wall_s": wall_s,
        "output_tokens": tokens,
        "output_tok_s": tokens / wall_s if wall_s > 0 else 0.0,
        "req_s": len(ok) / wall_s if wall_s > 0 else 0.0,
    }
    samples = {
        "ttft": [r["ttft"] for r in ok if r["ttft"] is not None],
        "e2e": [r["e2e"] for r in ok if r["e2e"] is not None],
        "itl": [x for r in ok for x in r["itl"]] if streaming else [],
        # time per output token after the first, per request (as vllm bench serve reports it)
        "tpot": [(r["e2e"] - r["ttft"]) / (int(r["out_tokens"]) - 1) for r in ok
                 if streaming and int(r["out_tokens"]) > 1 and r["e2e"] is not None and r["ttft"] is not None],
        **{k: [r[k] for r in ok if r.get(k) is not None] for k in STAGES},
    }
    for key in SUMMARY_KEYS:
        s[f"{key}_p50"] = _pct(samples[key], 50)
        s[f"{key}_p99"] = _pct(samples[key], 99)
    s["prompt_tokens"] = sorted({int(r["prompt_tokens"]) for r in ok if r.get("prompt_tokens") is not None})
    chunks = sum(int(r["chunks"]) for r in ok)
    s["tokens_per_chunk"] = tokens / chunks if streaming and chunks else None
    return s


COUNTS = ("requests", "ok", "failed", "output_tokens")
SPREAD = ("output_tok_s", "ttft_p50", "itl_p50")


def combine_runs(runs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """A level's summary over its repeats: counts summed, every other figure the median of the
    repeats' figures, and the lowest and highest value (``KEY_min``/``KEY_max``) of the main ones."""
    s: dict[str, Any] = {"repeats": len(runs)}
    for key in runs[0]:
        values: list[Any] = [r.get(key) for r in runs]
        if key in COUNTS:
            s[key] = sum(values)
        elif key == "busiest_thread":  # a name: the one most repeats saw
            names = [v for v in values if v]
            s[key] = max(set(names), key=names.count) if names else None
        elif key == "cpu_by_role_per_1k_tokens":  # per role, the median of the repeats that have it
            roles = [v for v in values if v]
            s[key] = {r: float(np.median([v[r] for v in roles if r in v]))
                      for r in sorted({r for v in roles for r in v})} if roles else None
        elif key in ("errors", "prompt_tokens"):
            s[key] = sorted({x for v in values for x in v})[:5 if key == "errors" else None]
        else:
            nums = [v for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)]
            s[key] = float(np.median(nums)) if nums else None
    for key in SPREAD:
        nums = [r[key] for r in runs if r.get(key) is not None]
        s[f"{key}_min"], s[f"{key}_max"] = (min(nums), max(nums)) if nums else (None, None)
    return s


#: (reference target kind, prefix of the figures): the ceiling, and what a user would run instead.
REFERENCES = (("inprocess", ""), ("vllm-serve", "vllm_serve_"))


def reference(targets: dict[str, dict[str, Any]], kind: str, client: str) -> str | None:
    """The target of ``kind`` an inferq target is compared with: one that ran, with one API server
    where there is a choice, then measured by the same load client, then the first."""
    ran = [name for name, t in targets.items() if t["kind"] == kind and t.get("levels")]
    return min(ran, key=lambda n: (targets[n].get("api_servers", 1) != 1,
                                   targets[n].get("client", "harness") != client), default=None)


def add_ratios(targets: dict[str, dict[str, Any]]) -> None:
    """For every inferq target and level, against each reference that ran the level (see
    :func:`reference`, named in ``reference_inprocess``/``reference_vllm_serve``): throughput
    ratio (``throughput_vs_inprocess``, ``throughput_vs_vllm_serve``) and TTFT p50 added
    (``added_ttft_p50``, ``vllm_serve_added_ttft_p50``), from the medians over repeats."""
    for ref_kind, prefix in REFERENCES:
        for t in targets.values():
            if not t["kind"].startswith("inferq"):
                continue
            ref_name = reference(targets, ref_kind, t.get("client", "harness"))
            if ref_name is None:
                continue
            base = targets[ref_name]
            for label, lv in t.get("levels", {}).items():
                ref = base["levels"].get(label, {}).get("summary")
                s = lv["summary"]
                if not ref or not ref["output_tok_s"] or not s["ok"]:
                    continue
                s["reference_" + ref_kind.replace("-", "_")] = ref_name
                s["throughput_vs_" + (ref_kind.replace("-", "_"))] = s["output_tok_s"] / ref["output_tok_s"]
                if s["ttft_p50"] is not None and ref["ttft_p50"] is not None:
                    s[prefix + "added_ttft_p50"] = s["ttft_p50"] - ref["ttft_p50"]
                if ref_kind == "vllm-serve":  # CPU per token: the stack's, and its busiest thread's
                    for key in ("cpu_s_per_1k_tokens", "busiest_thread_cpu_s_per_1k_tokens"):
                        if s.get(key) and ref.get(key):
                            s[key + "_vs_vllm_serve"] = s[key] / ref[key]


def summary_rows(targets: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """One flat row per target and level (the JSON's ``summary`` and the markdown table)."""
    rows = []
    for name, t in targets.items():
        who = {"client": t.get("client", "harness"),
               **({"api_servers": t.get("api_servers", 1)} if t["kind"] == "vllm-serve" else {})}
        if t.get("error") and not t.get("levels"):
            rows.append({"target": name, "kind": t["kind"], **who, "level": "-", "error": t["error"]})
        for label, lv in t.get("levels", {}).items():
            rows.append({"target": name, "kind": t["kind"], **who, "level": label, "mode": lv["mode"],
                         "value": lv["value"], **lv["summary"]})
    return rows
