"""``GET /metrics``: the gateway's metrics (all its processes) and the cluster's queue metrics."""

from __future__ import annotations

import logging

from fastapi import APIRouter, Response

from inferq.api import metrics, queue_metrics, swap_metrics
from inferq.api.deps import Service

router = APIRouter(tags=["health"])
log = logging.getLogger(__name__)
_REDIS_DOWN = b"# HELP inferq_redis_up Whether this scrape could read the queue from Redis.\n" \
              b"# TYPE inferq_redis_up gauge\ninferq_redis_up 0.0\n"
_REDIS_UP = _REDIS_DOWN.replace(b"inferq_redis_up 0.0", b"inferq_redis_up 1.0")


@router.get("/metrics", include_in_schema=False)
async def prometheus_metrics(service: Service) -> Response:
    """Prometheus text format. Open to any caller, as vLLM's: no label holds a key, a prompt or
    a job id. Redis unreachable: the gateway's own metrics still come, with inferq_redis_up 0."""
    s = service.settings
    try:
        snap = await queue_metrics.snapshot(service.redis, s.model_name, s.worker_ttl_s, s.job_ttl_s, s.batch_priority)
        extra = queue_metrics.exposition(snap) + await swap_metrics.exposition(service.redis) + _REDIS_UP
    except Exception as e:  # a scrape must still say something: that the queue could not be read
        log.warning("queue metrics unavailable: %s", e)
        extra = _REDIS_DOWN
    body, content_type = metrics.exposition(extra)
    return Response(body, media_type=content_type)
