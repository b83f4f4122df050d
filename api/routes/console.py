"""The browser console (``GET /console``, static files in api/console/) and ``GET /v1/queue``, the
queue depth it shows.

The page holds no data, so it loads without an API key; everything it shows comes from the API
with the key the user types in (kept in the browser's localStorage).
"""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter, HTTPException
from fastapi.responses import FileResponse, RedirectResponse
from pydantic import BaseModel, Field

from inferq.api import queue_metrics
from inferq.api.deps import Caller, Service
from inferq.api.standby import swappers
from inferq.shared import keys
from inferq.shared.redis import texts
from inferq.shared.schemas import SwapperInfo

router = APIRouter()
CONSOLE_DIR = Path(__file__).resolve().parent.parent / "console"
#: The page's files and their media types; nothing else under CONSOLE_DIR is served.
ASSETS = {"console.js": "text/javascript", "console.css": "text/css"}
#: No inline script or style, no other origin: a key in localStorage is only read by our own script.
HEADERS = {
    "Cache-Control": "no-cache",
    "Content-Security-Policy": "default-src 'self'; connect-src 'self'; img-src 'self' data:; "
                               "object-src 'none'; base-uri 'none'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}


@router.get("/", include_in_schema=False)
async def root() -> RedirectResponse:
    return RedirectResponse("console", status_code=307)  # relative: works behind a path prefix too


@router.get("/console", include_in_schema=False)
async def console() -> FileResponse:
    return FileResponse(CONSOLE_DIR / "index.html", media_type="text/html", headers=HEADERS)


@router.get("/console/{name}", include_in_schema=False)
async def console_asset(name: str) -> FileResponse:
    if name not in ASSETS:
        raise HTTPException(404)
    return FileResponse(CONSOLE_DIR / name, media_type=ASSETS[name], headers=HEADERS)


class Load(BaseModel):
    queued: int = 0
    running: int = 0


class ModelQueue(BaseModel):
    model: str
    queued: int = Field(description="Jobs waiting in the model's queue, all priorities.")
    running: int = Field(description="Jobs its live workers hold.")
    by_priority: dict[int, int] = Field(description="Jobs waiting, by priority (0 most urgent).")
    oldest_age_s: float | None = Field(description="Seconds since the oldest waiting job was (re)queued; "
                                       "null when none waits.")
    workers: int = Field(description="Live workers (not draining).")
    draining: int = Field(description="Workers finishing their jobs before they stop.")
    asleep: int = Field(default=0, description="Multi-model workers holding the model asleep (a job waits for "
                        "one of them to wake it).")
    classes: dict[str, Load] = Field(default_factory=dict, description="Each service class's jobs: queued "
                                     "(batch: the batch lane's) and held by live workers.")
    tenants: dict[str, Load] = Field(default_factory=dict, description="Each tenant's jobs queued and running "
                                     "(fair share).")


class QueueView(BaseModel):
    """Body of ``GET /v1/queue``: the queue metrics of ``/metrics``, as JSON."""

    at: float = Field(description="Unix time Redis was read.")
    models: list[ModelQueue]
    swappers: list[SwapperInfo] = Field(default_factory=list, description="The multi-model workers: each "
                                        "model's state on them and their recent swaps.")


def queue_view(snap: queue_metrics.QueueSnapshot) -> QueueView:
    models = []
    for model in sorted({m for m, _ in snap.depth}):
        depth = {p: snap.depth.get((model, p), 0) for p in keys.PRIORITIES}
        oldest = snap.oldest.get(model)
        models.append(ModelQueue(
            model=model, queued=sum(depth.values()), running=snap.running.get(model, 0), by_priority=depth,
            oldest_age_s=None if oldest is None else max(0.0, snap.now - oldest),
            workers=snap.workers.get((model, "live"), 0), draining=snap.workers.get((model, "draining"), 0),
            asleep=snap.workers.get((model, "asleep"), 0),
            classes=_loads(snap.classes, model), tenants=_loads(snap.tenants, model)))
    return QueueView(at=snap.now, models=models)


def _loads(counts: dict[tuple[str, str, str], int], model: str) -> dict[str, Load]:
    """(model, name, status) -> jobs, as name -> its queued and running jobs, for one model."""
    out: dict[str, Load] = {}
    for (m, name, status), n in sorted(counts.items()):
        if m == model and status in ("queued", "running"):
            setattr(out.setdefault(name, Load()), status, n)
    return out


@router.get("/v1/queue", response_model=QueueView, tags=["health"])
async def queue(service: Service, _: Caller) -> QueueView:
    """Queued and running jobs of the default model and of every model served lately, the depth of
    each priority, and each service class's and tenant's jobs: what ``/metrics`` exports as
    ``inferq_queue_jobs``, ``inferq_jobs``, ``inferq_class_jobs`` and ``inferq_tenant_jobs``; and the
    multi-model workers, with their models' states and recent swaps."""
    s = service.settings
    view = queue_view(await queue_metrics.snapshot(service.redis, s.model_name, s.worker_ttl_s, s.job_ttl_s,
                                                   s.batch_priority))
    ids = texts(await service.redis.zrangebyscore(keys.SWAPPERS, view.at - s.worker_ttl_s, "+inf"))
    view.swappers = sorted(await swappers(service.redis, ids), key=lambda w: w.id)
    return view
