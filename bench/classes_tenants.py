"""Each tenant's service over time, from ``vllm bench serve``'s per-request data (bench/classes.py).

A request's output tokens are spread evenly over the time they streamed (from its first token to its
end; vLLM's start times are the monotonic clock every process on the host shares, so two clients'
requests line up). Windows of ``window_s`` slide by ``step_s`` over the time both tenants ran.
Counted as fair share charges (``prompt_weight``, INFERQ_FAIR_PROMPT_WEIGHT), a request's prompt
tokens at that weight are served at its first token."""

from __future__ import annotations

from typing import Any

#: vLLM's per-request lists: ttfts, output_lens, input_lens, start_times, latencies
Requests = dict[str, list[Any] | None]


def streams(req: Requests, prompt_weight: float = 0.0) -> list[tuple[float, float, float]]:
    """(first token, end, output tokens) of each request that produced any; with ``prompt_weight``,
    also (first token, first token, its prompt tokens x that weight)."""
    out: list[tuple[float, float, float]] = []
    prompts = req.get("input_lens") or []
    for k, (start, ttft, lat, n) in enumerate(zip(req.get("start_times") or [], req.get("ttfts") or [],
                                                  req.get("latencies") or [], req.get("output_lens") or [],
                                                  strict=False)):
        if n and lat:
            first = start + (ttft or 0.0)
            out.append((first, start + lat, float(n)))
            if prompt_weight and k < len(prompts) and prompts[k]:
                out.append((first, first, prompt_weight * prompts[k]))
    return out


def served(spans: list[tuple[float, float, float]], lo: float, hi: float) -> float:
    """Output tokens streamed in [lo, hi)."""
    total = 0.0
    for a, b, n in spans:
        if b <= a:
            total += n if lo <= a < hi else 0
            continue
        overlap = max(0.0, min(b, hi) - max(a, lo))
        total += n * overlap / (b - a)
    return total


def service_windows(by_tenant: dict[str, Requests], window_s: float, step_s: float,
                    weights: dict[str, float] | None = None, prompt_weight: float = 0.0) -> dict[str, Any]:
    """Each tenant's tokens per window while all ran, the largest weighted service ratio of any
    window, and the total tokens/s from the first request to the last (output tokens; with
    ``prompt_weight``, prompt tokens at that weight too)."""
    spans = {t: streams(r, prompt_weight) for t, r in by_tenant.items()}
    if not all(spans.values()):
        return {"windows": [], "ratio_max": None, "total_tok_s": 0.0, "overlap_s": 0.0}
    start = max(min(a for a, _, _ in s) for s in spans.values())
    end = min(max(b for _, b, _ in s) for s in spans.values())
    first = min(a for s in spans.values() for a, _, _ in s)
    last = max(b for s in spans.values() for _, b, _ in s)
    total = sum(n for s in spans.values() for _, _, n in s)
    width = min(window_s, max(0.0, end - start))
    windows, ratios = [], []
    t = start
    while width > 0 and t + width <= end + 1e-9:
        got = {name: served(s, t, t + width) / (weights or {}).get(name, 1.0) for name, s in spans.items()}
        windows.append({"from_s": round(t - start, 1), **{k: round(v) for k, v in got.items()}})
        if min(got.values()) > 0:
            ratios.append(max(got.values()) / min(got.values()))
        t += step_s
    return {"windows": windows, "ratio_max": max(ratios) if ratios else None, "window_s": width,
            "total_tok_s": total / (last - first) if last > first else 0.0, "overlap_s": round(end - start, 1)}
