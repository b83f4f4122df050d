"""Per-level summaries from raw request results, and ratios against the in-process ceiling."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

SUMMARY_KEYS = ("ttft", "itl", "e2e", "queued")


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
        "queued": [r["queued"] for r in ok if r.get("queued") is not None],
    }
    for key in SUMMARY_KEYS:
        s[f"{key}_p50"] = _pct(samples[key], 50)
        s[f"{key}_p99"] = _pct(samples[key], 99)
    s["prompt_tokens"] = sorted({int(r["prompt_tokens"]) for r in ok if r.get("prompt_tokens") is not None})
    chunks = sum(int(r["chunks"]) for r in ok)
    s["tokens_per_chunk"] = tokens / chunks if streaming and chunks else None
    return s


def add_ratios(targets: dict[str, dict[str, Any]], baseline: str = "inprocess") -> None:
    """For every inferq target and level: throughput / in-process throughput, TTFT p50 added."""
    base = targets.get(baseline)
    if not base:
        return
    for name, t in targets.items():
        if not t["kind"].startswith("inferq"):
            continue
        for label, lv in t.get("levels", {}).items():
            ref = base.get("levels", {}).get(label, {}).get("summary")
            s = lv["summary"]
            if not ref or not ref["output_tok_s"] or not s["ok"]:
                continue
            s["throughput_vs_inprocess"] = s["output_tok_s"] / ref["output_tok_s"]
            if s["ttft_p50"] is not None and ref["ttft_p50"] is not None:
                s["added_ttft_p50"] = s["ttft_p50"] - ref["ttft_p50"]


def summary_rows(targets: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """One flat row per target and level (the JSON's ``summary`` and the markdown table)."""
    rows = []
    for name, t in targets.items():
        if t.get("error") and not t.get("levels"):
            rows.append({"target": name, "kind": t["kind"], "level": "-", "error": t["error"]})
        for label, lv in t.get("levels", {}).items():
            rows.append({"target": name, "kind": t["kind"], "level": label, "mode": lv["mode"],
                         "value": lv["value"], **lv["summary"]})
    return rows
