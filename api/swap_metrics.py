"""Multi-model workers in ``/metrics``: their swaps (how many, how long) by the model woken, read
from ``inferq:swap-stats`` when scraped (cluster-wide, as the queue metrics: aggregate with ``max``
across gateways). Each model's awake and asleep workers are ``inferq_workers{state="live"|"asleep"}``
(api/queue_metrics.py)."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from redis.asyncio import Redis

from inferq.shared import keys
from inferq.shared.redis import text_map


def swap_families(stats: dict[str, int]) -> Iterator[Metric]:
    """``inferq_model_swap_seconds`` (a histogram: wakes of a model that had slept, the whole swap:
    the other model's drain and sleep included) and ``inferq_model_starts`` with their seconds (a
    model's first start on a worker, an engine start)."""
    by: dict[str, dict[str, int]] = {}
    for name, n in stats.items():
        kind, _, rest = name.partition(keys.STAT_SEP)
        model, _, bound = rest.rpartition(keys.STAT_SEP) if kind == "le" else (rest, "", "")
        by.setdefault(model, {})[f"{kind}|{bound}" if kind == "le" else kind] = n
    swaps = HistogramMetricFamily("inferq_model_swap_seconds", "Swaps of multi-model workers by the model woken: "
                                  "from the decision to the model taking jobs (the other model's drain and sleep "
                                  "included), for models that had slept before.", labels=["model"])
    starts = CounterMetricFamily("inferq_model_starts", "First starts of a model on a multi-model worker (its "
                                 "engine started, not woken).", labels=["model"])
    start_s = CounterMetricFamily("inferq_model_start_seconds", "Seconds those first starts took, in all.",
                                  labels=["model"])
    for model, f in sorted(by.items()):
        if f.get("n"):
            buckets = [(f"{b:g}", f.get(f"le|{b:g}", 0)) for b in keys.SWAP_BUCKETS] + [("+Inf", f["n"])]
            swaps.add_metric([model], buckets, f.get("nms", 0) / 1000)
        if f.get("cold"):
            starts.add_metric([model], f["cold"])
            start_s.add_metric([model], f.get("coldms", 0) / 1000)
    yield from (swaps, starts, start_s)


class SwapCollector(Collector):
    def __init__(self, stats: dict[str, int]) -> None:
        self.stats = stats

    def collect(self) -> Iterator[Metric]:
        yield from swap_families(self.stats)


async def exposition(redis: Redis) -> bytes:
    stats = {k: int(v) for k, v in text_map(await redis.hgetall(keys.SWAP_STATS)).items()}
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SwapCollector(stats))
    return generate_latest(registry)
