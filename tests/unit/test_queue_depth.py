"""queue_depths (summed by tests.helpers.queue_depth) counts a model's Celery messages across every
priority list."""

from __future__ import annotations

import signal
import time

from inferq.cli.procs import start_redis
from inferq.shared.celery_app import make_celery, send_job
from inferq.shared.redis import make_redis
from inferq.shared.schemas import JobMessage, JobRequest
from inferq.shared.settings import Settings
from inferq.shared.store import JobStore
from tests.helpers import queue_depth
from tests.procs import free_port


async def test_queue_depth_sums_all_priorities(tmp_path) -> None:
    server = start_redis(free_port(), tmp_path, name="redis-depth")
    redis = make_redis(server.url)
    try:
        store = JobStore(redis, 60)
        celery = make_celery(Settings(redis_url=server.url))
        assert await queue_depth(store.redis, "m") == 0
        for i, priority in enumerate((0, 5, 5, 9)):
            send_job(celery, JobMessage(id=f"job-{i}", model="m", created_at=time.time(),
                                        request=JobRequest(prompt="p", priority=priority)))
        assert await queue_depth(store.redis, "m") == 4 and await queue_depth(store.redis, "other") == 0
    finally:
        await redis.aclose()
        server.stop(signal.SIGKILL)
