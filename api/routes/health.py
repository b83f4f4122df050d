"""Liveness and readiness."""

from __future__ import annotations

import asyncio
import logging
from importlib.metadata import PackageNotFoundError, version

from fastapi import APIRouter, Response
from fastapi.responses import JSONResponse

from inferq.api.deps import Caller, Service
from inferq.shared.redis import RedisTarget
from inferq.shared.schemas import WorkerInfo

router = APIRouter(tags=["health"])
log = logging.getLogger(__name__)
#: How long a probe waits for Redis before it says unreachable: under a probe's own timeout (Kubernetes'
#: default is 1 s), instead of the Redis client's retries through a restart (seconds), which a probe
#: would only see as its own timeout
PROBE_S = 0.8


def _why(e: Exception, service: Service) -> str:
    """Where Redis is and what went wrong, for the log (no password)."""
    what = f"no answer in {PROBE_S:g} s" if isinstance(e, TimeoutError) and not str(e) else f"{type(e).__name__}: {e}"
    return f"{RedisTarget.of(service.settings)}: {what}"


@router.get("/healthz")
async def healthz() -> dict[str, str]:
    """The process is alive (no dependency is checked)."""
    return {"status": "ok"}


@router.get("/readyz")
async def readyz(service: Service) -> JSONResponse:
    """Redis answers and at least one live worker serves the default model; 503 otherwise. Anyone
    may ask (no key): why Redis cannot be reached, and where it is, goes to the log only."""
    model = service.settings.model_name
    try:
        async with asyncio.timeout(PROBE_S):
            await service.redis.ping()
            workers = [w for w in await service.live_workers(model) if not w.draining]
    except Exception as e:
        log.warning("not ready: Redis unreachable at %s", _why(e, service))
        return JSONResponse({"status": "unavailable", "redis": "unreachable", "model": model}, 503)
    body = {"status": "ready" if workers else "unavailable", "redis": "ok", "model": model,
            "workers": len(workers)}
    return JSONResponse(body, 200 if workers else 503)


@router.get("/readyz/gateway")
async def readyz_gateway(service: Service) -> JSONResponse:
    """This gateway can take jobs: Redis answers; 503 otherwise. Workers are not counted (jobs for
    the default model wait in the queue for them): the probe that keeps a gateway in its load
    balancer while workers are scaled to zero, so that queued jobs can bring them back."""
    try:
        async with asyncio.timeout(PROBE_S):
            await service.redis.ping()
    except Exception as e:
        log.warning("gateway not ready: Redis unreachable at %s", _why(e, service))
        return JSONResponse({"status": "unavailable", "redis": "unreachable"}, 503)
    return JSONResponse({"status": "ready", "redis": "ok"}, 200)


@router.get("/health")
async def health(service: Service) -> Response:
    """vLLM's health route, for clients and load balancers written against ``vllm serve``: an
    empty 200 when this gateway can serve the default model (:func:`readyz`), else 503."""
    return Response(status_code=(await readyz(service)).status_code)


@router.get("/version")
async def server_version() -> dict[str, str]:
    """The inferq version (vLLM's server answers its own version here)."""
    try:
        return {"version": version("inferq")}
    except PackageNotFoundError:  # run from a checkout that was not installed
        return {"version": "unknown"}


@router.get("/v1/workers", response_model=list[WorkerInfo])
async def workers(service: Service, _: Caller, model: str | None = None) -> list[WorkerInfo]:
    """Live workers of a model (default: the default model), with their engine statistics."""
    return await service.live_workers(model or service.settings.model_name)
