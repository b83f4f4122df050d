"""JobStore.queue_depth counts a model's Celery messages across every priority list."""

from __future__ import annotations

import signal
import time

from inferq.cli.procs import free_port, start_redis
from inferq.shared.celery_app import make_celery, send_job
from inferq.shared.redis import make_redis
from inferq.shared.schemas import JobMessage, JobRequest
from inferq.shared.settings import Settings
from inferq.shared.store import JobStore


async def test_queue_depth_sums_all_priorities(tmp_path) -> None:
    server = start_redis(free_port(), tmp_path, name="redis-depth")
    redis = make_redis(server.url)
    try:
        store = JobStore(redis, 60)
        celery = make_celery(Settings(redis_url=server.url))
        assert await store.queue_depth("m") == 0
        for i, priority in enumerate((0, 5, 5, 9)):
            send_job(celery, JobMessage(id=f"job-{i}", model="m", created_at=time.time(),
                                        request=JobRequest(prompt="p", priority=priority)))
        assert await store.queue_depth("m") == 4 and await store.queue_depth("other") == 0
    finally:
        await redis.aclose()
        server.stop(signal.SIGKILL)
