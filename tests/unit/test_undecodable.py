"""A job message the worker cannot decode ends its job ``failed`` (real Redis, the real Celery
task run in place): it does not stay queued forever for the reaper to re-send."""

from __future__ import annotations

import asyncio
import json
import uuid

import pytest

from inferq.shared import keys
from inferq.shared.schemas import JobMessage, JobRecord, JobRequest, JobStatus
from inferq.shared.store import JobStore
from inferq.worker import tasks
from inferq.worker.jobs import undecodable
from tests.unit.workerkit import GatedEngine, start_runtime


@pytest.fixture(autouse=True)
def runtime(own_redis, monkeypatch):
    """A real WorkerRuntime (scripted engine) behind the task, as a worker process has."""
    rig = start_runtime(own_redis, GatedEngine(), job_ttl_s=180, max_timeout_s=120, default_timeout_s=120)
    monkeypatch.setattr(tasks, "_runtime", rig.runtime)
    yield rig.runtime
    rig.stop()


async def queued_job(store: JobStore) -> str:
    rec = JobRecord(id=f"job-{uuid.uuid4().hex}", model="m", request=JobRequest(prompt="p"))
    await store.create(rec)
    return rec.id


def poison(job_id: str, levels: int = 230) -> str:
    """A job message whose json_schema nests deeper than the worker's JSON parser goes."""
    schema = '{"type":"object","properties":{"a":' * levels + '{"type":"string"}' + "}}" * levels
    return '{"id":"%s","model":"m","request":{"prompt":"x","json_schema":%s},"created_at":0}' % (job_id, schema)


async def run_task(payload: object, task_id: str) -> str | None:
    """The generate task, run here as a Celery worker thread would (its task id is the job id)."""
    result = await asyncio.to_thread(tasks.generate.apply, args=[payload], task_id=task_id)
    return result.get(disable_sync_subtasks=False)


async def test_an_undecodable_message_fails_its_queued_job_with_a_reason(store) -> None:
    job = await queued_job(store)
    with pytest.raises(ValueError):
        JobMessage.model_validate_json(poison(job))  # what the worker used to drop
    assert await run_task(poison(job), job) == "failed"
    rec = await store.get(job)
    assert rec.status is JobStatus.failed and rec.finished_at is not None
    assert (rec.error.type, rec.error.code) == ("invalid_request_error", "undecodable_job")
    assert "recursion limit" in rec.error.message and "properties" not in rec.error.message  # no payload
    log = await store.read_log(job)
    assert [e.type for e in log] == ["error"] and log[0].seq == 1 and log[0].error == rec.error
    assert await store.redis.zscore(keys.QUEUED, job) is None  # the reaper no longer re-sends it
    assert 0 < await store.redis.ttl(keys.job(job)) <= 180 and 0 < await store.redis.ttl(keys.job_log(job)) <= 180


async def test_the_job_id_comes_from_the_task_id_or_else_the_raw_payload(store) -> None:
    by_payload = await queued_job(store)
    assert await run_task(poison(by_payload), "not-a-job-id") == "failed"
    assert (await store.get(by_payload)).status is JobStatus.failed
    by_task = await queued_job(store)
    assert await run_task({"not": "a string"}, by_task) == "failed"
    assert (await store.get(by_task)).error.code == "undecodable_job"
    assert undecodable.undecodable_job_id(None, json.dumps({"id": "job-1"})) is None


async def test_a_job_that_is_not_queued_is_left_alone(store) -> None:
    running = await queued_job(store)
    await store.claim(running, "w")
    assert await run_task(poison(running), running) is None
    rec = await store.get(running)
    assert rec.status is JobStatus.running and rec.error is None and await store.read_log(running) == []
    unknown = f"job-{uuid.uuid4().hex}"
    assert await run_task(poison(unknown), unknown) is None
    assert not await store.redis.exists(keys.job(unknown), keys.job_log(unknown))


async def test_a_message_that_names_no_job_is_dropped(store) -> None:
    assert await run_task("{broken", "not-a-job-id") is None
