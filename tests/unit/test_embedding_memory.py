"""What an embedding request leaves in Redis: its vectors sit in its job's log (and the request's
record beside it), megabytes for 2,048 inputs; once a waiting endpoint has answered with them they
stay ``INFERQ_ANSWERED_EMBEDDING_TTL_S``, not a whole job TTL. A real gateway app and Redis; the
worker's part (claim, end with the vectors) is played here through the job store."""

from __future__ import annotations

import asyncio
import threading
import uuid

import numpy as np
import redis
from fastapi.testclient import TestClient

from inferq.api.app import create_app
from inferq.shared import keys
from inferq.shared.redis import make_redis
from inferq.shared.schemas import DoneEvent, JobStatus, Usage
from inferq.shared.settings import Settings
from inferq.shared.store import JobStore
from inferq.worker.jobs.pooling import pack_vector
from tests.wait import eventually_async

INPUTS, DIMS = 2048, 256  # one request's inputs, the built-in embedding model's vector size


async def _play_worker(url: str, jobs: int) -> None:
    """Take each queued job and end it with one vector per input, as a pooling worker does."""
    r = make_redis(url)
    store = JobStore(r, 3600)
    vector = pack_vector(np.linspace(-1, 1, DIMS, dtype="float32"))
    try:
        for _ in range(jobs):
            [job_id] = await eventually_async(lambda: r.zrange(keys.QUEUED, 0, 0), 60, "a queued job")
            await store.claim(job_id, "w")
            rec = await store.get(job_id)
            assert rec is not None and rec.request.embed is not None
            n = len(rec.request.embed)
            await store.finish(job_id, "w", 1, DoneEvent(seq=1, embeddings=[vector] * n, usage=Usage(
                prompt_tokens=n)), status=JobStatus.succeeded)
    finally:
        await r.aclose()


def test_an_answered_embedding_requests_vectors_leave_redis_soon(own_redis: str) -> None:
    model = f"embed-{uuid.uuid4().hex[:6]}"
    settings = Settings(redis_url=own_redis, served_model_name=model, api_keys="", answered_embedding_ttl_s=30)
    worker = threading.Thread(target=asyncio.run, args=(_play_worker(own_redis, 1),), daemon=True)
    worker.start()
    with TestClient(create_app(settings)) as c:
        got = c.post("/v1/embeddings", json={"model": model, "input": ["x"] * INPUTS, "encoding_format": "base64"})
    worker.join(60)
    assert got.status_code == 200 and len(got.json()["data"]) == INPUTS, got.text[:300]
    job_id = got.headers.get("x-request-id") or got.json()["id"]
    with redis.Redis.from_url(own_redis) as r:
        assert r.memory_usage(keys.job_log(job_id)) > INPUTS * DIMS * 4  # the vectors: megabytes
        for key in (keys.job(job_id), keys.job_log(job_id)):
            assert 0 < r.ttl(key) <= 30, (key, r.ttl(key))
