"""The summary of ``bench.swap``'s samples (medians, the bursts' ratio of the two sides) and the merge
of several runs' swap.json (a GPU call has 10 minutes: the cases and sides run in separate calls)."""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any


def _p(xs: list[float | None], q: float) -> float | None:
    got = sorted(x for x in xs if x is not None)
    return got[min(len(got) - 1, int(q * len(got)))] if got else None


def summary(doc: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if cold := doc.get("cold"):
        out["cold"] = {k: statistics.median(xs) if (xs := [r[k] for r in cold if r[k] is not None]) else None
                       for k in ("spawn_to_first_token_s", "all_models_started_s")}
        firsts = [r["starts"][0] for r in cold if r.get("starts")]  # the first model's start, each repeat
        out["cold"]["first_start"] = {
            "spawn_to_decision_s": _p([r.get("spawn_to_decision_s") for r in cold], 0.5),
            "start_s": _p([s["wake_s"] for s in firsts], 0.5),
            **{f"{k}_s": _p([s.get("phases", {}).get(k) for s in firsts], 0.5)
               for k in ("process", "setup", "engine", "consumer")}}
    if swap := doc.get("swap"):
        out["swap"] = {"swap_ttft_p50_s": _p([s["swap_ttft_s"] for s in swap], 0.5),
                       "swap_ttft_p99_s": _p([s["swap_ttft_s"] for s in swap], 0.99),
                       "submission_to_decision_p50_s": _p([s.get("decided_after_s") for s in swap], 0.5),
                       **{f"{k}_p50_s": _p([(s.get("swap") or {}).get(f"{k}_s") for s in swap], 0.5)
                          for k in ("drain", "sleep", "wake")},
                       "overlapped": sum(bool((s.get("swap") or {}).get("overlapped")) for s in swap),
                       "awake_to_started_p50_s": _p([s.get("awake_to_started_s") for s in swap], 0.5),
                       "started_to_first_token_p50_s": _p([s.get("started_to_first_token_s") for s in swap], 0.5),
                       "first_after_wake_vs_steady_p50": _p([s["ratio"] for s in swap], 0.5),
                       "steady_ttft_p50_s": _p([s["steady_ttft_s"] for s in swap], 0.5),
                       "same_text": all(s["same_text"] for s in swap), "samples": len(swap)}
    if bursts := doc.get("bursts"):
        one = [r for r in bursts if r["side"] == "one"]
        two = [r for r in bursts if r["side"] == "dedicated"]
        ded = statistics.median([r["tokens"] for r in two]) if two else None
        out["bursts"] = {
            "repeats": [len(one), len(two)],
            "one_worker_tokens_median": statistics.median([r["tokens"] for r in one]) if one else None,
            "dedicated_tokens_median": ded,
            # the median of the one worker's repeats over the median of the dedicated workers', and the range
            "tokens_ratio_median": statistics.median([r["tokens"] for r in one]) / ded if one and ded else None,
            "tokens_ratio_range": [min(r["tokens"] for r in one) / ded, max(r["tokens"] for r in one) / ded]
            if one and ded else None,
            "max_wait_s": max((r["max_wait_s"] or 0 for r in one), default=None),
            "longest_swap_s": max((s["total_s"] for r in one for s in r.get("swaps", [])), default=None),
            "job_run_s_p50": statistics.median([r["job_run_s_p50"] or 0 for r in one]) if one else None,
            "failed": sum(r["failed"] for r in bursts)}
    return out


def merge(paths: list[Path]) -> dict[str, Any]:
    """Several runs' swap.json as one (each case's samples and repeats together), summarised again:
    a GPU call has 10 minutes, so the two sides of the bursts run one call each."""
    doc: dict[str, Any] = {"merged": [str(p) for p in paths]}
    for p in paths:
        one = json.loads(p.read_text())
        for case in ("cold", "swap", "bursts"):
            doc.setdefault(case, []).extend(one.get(case, []))
    doc = {k: v for k, v in doc.items() if v}
    doc["summary"] = summary(doc)
    return doc
