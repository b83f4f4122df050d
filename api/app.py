"""The gateway application: ``create_app()`` builds it; its lifespan owns Redis and the hub."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI

from api import errors
from api.limits import BodyLimit
from api.routes import health, jobs, openai, stream
from api.service import JobService
from api.streams import StreamHub
from shared.redis import make_redis
from shared.settings import Settings, get_settings
from shared.store import JobStore
from worker.celery_app import make_celery


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or get_settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        redis = make_redis(settings.redis_url, max_connections=128)
        store = JobStore(redis, settings.job_ttl_s)
        hub = StreamHub(redis, store)
        await hub.start()
        app.state.settings = settings
        app.state.service = JobService(settings, redis, store, make_celery(settings))
        app.state.hub = hub
        try:
            yield
        finally:
            await hub.stop()
            await redis.aclose()

    app = FastAPI(title="inferq", version="0.1.0", lifespan=lifespan,
                  description="Queue-based LLM inference: REST, WebSocket and OpenAI-compatible APIs.")
    errors.install(app)
    for module in (jobs, stream, openai, health):
        app.include_router(module.router)
    app.add_middleware(BodyLimit, max_bytes=settings.max_body_bytes)
    return app
