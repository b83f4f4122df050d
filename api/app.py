"""The gateway application: ``create_app()`` builds it; its lifespan owns Redis and the hub."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from typing import Any

from fastapi import FastAPI
from starlette.middleware.cors import CORSMiddleware

from inferq.api import errors
from inferq.api.admission import Admission
from inferq.api.auth import KeyBeforeBody, KeyRing
from inferq.api.batches.files import FileStore
from inferq.api.batches.runner import BatchRunner
from inferq.api.batches.service import BatchService
from inferq.api.deps import Caller
from inferq.api.embed_coalesce import EmbedCoalescer
from inferq.api.limits import BodyLimit
from inferq.api.metrics import RequestMetrics, process_exit
from inferq.api.routes import (
    batches,
    chat,
    console,
    docs,
    embeddings,
    files,
    health,
    jobs,
    metrics,
    models,
    responses,
    stream,
    tokenize,
)
from inferq.api.service import JobService
from inferq.api.streams import StreamHub
from inferq.shared import logs, tracing
from inferq.shared.celery_app import make_celery
from inferq.shared.redis import make_redis
from inferq.shared.settings import Settings, get_settings
from inferq.shared.store import JobStore


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or get_settings()
    logs.setup(settings, "gateway")  # each of several gateway processes configures its own
    tracing.setup(settings, "inferq-gateway")
    keyring = KeyRing.from_settings(settings)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        redis = make_redis(settings, max_connections=128)
        store = JobStore(redis, settings.job_ttl_s)
        hub = StreamHub(settings, store)  # its pub/sub connection is its own
        await hub.start()
        app.state.settings = settings
        app.state.service = JobService(settings, redis, store, make_celery(settings))
        app.state.admission = Admission(settings, redis, app.state.service, shares=keyring.share)
        app.state.hub = hub
        app.state.embed = EmbedCoalescer(app.state.admission, partial(embeddings.delivered, app.state.service, hub),
                                         settings.embed_coalesce_inflight, settings.embed_coalesce_max_inputs)
        app.state.files = FileStore(settings, redis)
        runner = BatchRunner(settings, redis, app.state.admission, app.state.files)
        app.state.batches = BatchService(redis, app.state.files, runner.me, settings.batch_lease_s)
        runner.start()
        try:
            yield
        finally:
            await runner.stop()
            await app.state.embed.stop()
            await hub.stop()
            await app.state.service.settle()
            await redis.aclose()
            process_exit()

    # With API keys, the schema needs a key too and the browser docs (which cannot send one) are off;
    # without, the docs are api/routes/docs.py's (their assets served here, not from a CDN).
    app = FastAPI(title="inferq", version="0.1.0", lifespan=lifespan,
                  description="Queue-based LLM inference: REST, WebSocket and OpenAI-compatible APIs.",
                  docs_url=None, redoc_url=None, openapi_url=None if keyring.enabled else "/openapi.json")
    app.state.keyring = keyring
    if keyring.enabled:
        @app.get("/openapi.json", include_in_schema=False)
        async def openapi(_: Caller) -> dict[str, Any]:
            return app.openapi()

    errors.install(app)
    for module in (jobs, stream, chat, embeddings, models, responses, health, tokenize, metrics, files, batches,
                   console):
        app.include_router(module.router)
    if not keyring.enabled:
        app.include_router(docs.router)
    # uploads may be larger: up to a file's limit, plus room for the multipart framing
    uploads = {"/v1/files": settings.max_file_bytes + (64 << 10)}
    app.add_middleware(BodyLimit, max_bytes=settings.max_body_bytes, routes=uploads,
                       body_timeout_s=settings.http_body_timeout_s)
    if keyring.enabled:  # outside BodyLimit: an upload without a valid key gets 401 before any of its body is read
        app.add_middleware(KeyBeforeBody, keyring=keyring, paths=uploads)
    if settings.origins:  # browser pages on these origins may call the API (keys go in headers)
        app.add_middleware(CORSMiddleware, allow_origins=settings.origins, allow_methods=["*"],
                           allow_headers=["*"], expose_headers=["Retry-After", "Location"])
    app.add_middleware(RequestMetrics)  # outermost: sees every answer, 413s and CORS refusals too
    return app
