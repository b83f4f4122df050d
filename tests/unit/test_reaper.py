"""The reaper (real Redis): it requeues a silent worker's jobs, and never its own worker's."""

from __future__ import annotations

import time
import uuid

from inferq.cli.procs import free_port, start_redis
from inferq.shared import keys
from inferq.shared.redis import make_redis
from inferq.shared.schemas import JobRecord, JobRequest, JobStatus
from inferq.shared.settings import Settings
from inferq.shared.store import JobStore
from inferq.shared.celery_app import make_celery
from inferq.worker.runtime import WorkerRuntime


async def test_reaper_requeues_a_silent_worker_but_never_itself(tmp_path) -> None:
    # a Redis of its own: the session's serves live workers whose reapers would take the lock
    server = start_redis(free_port(), tmp_path, name="redis-reaper")
    url = server.url
    model = f"m-{uuid.uuid4().hex[:6]}"
    settings = Settings(redis_url=url, worker_id="me", served_model_name=model, worker_ttl_s=3)
    rt = WorkerRuntime(settings, make_celery(settings))
    rt.redis = make_redis(url)
    rt.store = JobStore(rt.redis, 120)
    try:
        jobs = {}
        for wid in ("me", "gone"):
            rec = JobRecord(id=f"job-{uuid.uuid4().hex}", model=model, request=JobRequest(prompt="p"))
            await rt.store.create(rec)
            await rt.store.claim(rec.id, wid)
            jobs[wid] = rec.id
        stale = time.time() - 60  # both look silent: "me" just waited out a Redis outage in a retry
        await rt.redis.zadd(keys.MODELS, {model: time.time()})
        await rt.redis.zadd(keys.workers(model), {"me": stale, "gone": stale})
        await rt.redis.delete(keys.REAPER_LOCK)
        await rt._reap()
        mine, theirs = await rt.store.get(jobs["me"]), await rt.store.get(jobs["gone"])
        assert mine.status is JobStatus.running and mine.worker == "me"
        assert theirs.status is JobStatus.queued and theirs.worker is None
        assert await rt.redis.zscore(keys.workers(model), "me") is not None
        assert await rt.redis.zscore(keys.workers(model), "gone") is None
    finally:
        await rt.redis.aclose()
        server.stop()
