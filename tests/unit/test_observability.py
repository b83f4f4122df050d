"""Queue metrics read from a real Redis, the cluster counters the store's scripts keep, the
gateway's token counting, and JSON log lines."""

from __future__ import annotations

import json
import logging
import time

import redis.asyncio
from prometheus_client.parser import text_string_to_metric_families

from inferq.api import queue_metrics
from inferq.api.metrics import token_count
from inferq.shared import keys, logs
from inferq.shared.errors import DeadlineExceeded, EngineError, InvalidRequest
from inferq.shared.schemas import DoneEvent, ErrorEvent, ErrorInfo, JobRecord, JobRequest, JobStatus, WorkerInfo
from inferq.shared.settings import Settings
from inferq.shared.store import JobStore


def _samples(body: bytes) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(body.decode()) for s in fam.samples}


def _kombu_message(job_id: str) -> str:
    return json.dumps({"body": "e30=", "headers": {"id": job_id, "task": keys.TASK_NAME}, "properties": {}})


async def _job(store: JobStore, model: str = "m") -> JobRecord:
    rec = JobRecord(id=f"job-{time.time_ns():032x}"[:36], model=model, request=JobRequest(prompt="x"))
    await store.create(rec)
    return rec


async def test_queue_depth_oldest_age_workers_and_running(store: JobStore, r: redis.asyncio.Redis) -> None:
    old, new = await _job(store), await _job(store)
    now = time.time()
    await r.zadd(keys.QUEUED, {old.id: now - 30, new.id: now - 5})
    # kombu pushes on the left: the oldest message is the rightmost; priorities 0 and 7
    await r.lpush(keys.queue_lists("m")[0], _kombu_message(new.id))
    await r.lpush(keys.queue_lists("m")[7], _kombu_message(old.id))
    await r.lpush(keys.queue_lists("m")[7], "not json")  # a stranger's message is skipped, not fatal
    info = WorkerInfo(id="w1", model="m", host="h", pid=1, max_model_len=64, max_num_seqs=4, started_at=now,
                      last_seen=now, draining=True)
    await r.zadd(keys.workers("m"), {"w1": now})
    await r.set(keys.worker("w1"), info.model_dump_json())
    await r.sadd(keys.worker_jobs("w1"), "job-a", "job-b")

    snap = await queue_metrics.snapshot(r, "m", ttl_s=10, window_s=3600)
    got = _samples(queue_metrics.exposition(snap))
    assert got[("inferq_queue_jobs", (("model", "m"), ("priority", "0")))] == 1
    assert got[("inferq_queue_jobs", (("model", "m"), ("priority", "7")))] == 2
    assert got[("inferq_jobs", (("model", "m"), ("status", "queued")))] == 3
    assert got[("inferq_jobs", (("model", "m"), ("status", "running")))] == 2
    assert 29 < got[("inferq_queue_oldest_job_age_seconds", (("model", "m"),))] < 40
    assert got[("inferq_workers", (("model", "m"), ("state", "draining")))] == 1
    assert got[("inferq_workers", (("model", "m"), ("state", "live")))] == 0
    assert got[("inferq_jobs_submitted_total", (("model", "m"),))] == 2


async def test_an_empty_queue_is_age_zero_for_the_default_model(r: redis.asyncio.Redis) -> None:
    got = _samples(queue_metrics.exposition(await queue_metrics.snapshot(r, "default", 10, 3600)))
    assert got[("inferq_queue_oldest_job_age_seconds", (("model", "default"),))] == 0
    assert got[("inferq_jobs", (("model", "default"), ("status", "queued")))] == 0


async def test_each_terminal_transition_counts_once(store: JobStore, r: redis.asyncio.Redis) -> None:
    ok, late, cancelled, lost = [await _job(store) for _ in range(4)]
    for rec in (ok, late, lost):
        await store.claim(rec.id, "w")
    await store.finish(ok.id, "w", 1, DoneEvent(seq=1), status=JobStatus.succeeded)
    await store.finish(ok.id, "w", 1, DoneEvent(seq=1), status=JobStatus.succeeded)  # fenced: not counted
    err = ErrorInfo.of(DeadlineExceeded("too late"))
    await store.finish(late.id, "w", 1, ErrorEvent(seq=1, error=err), check_log=False, status=JobStatus.failed,
                       error=err)
    await store.request_cancel(cancelled.id)
    assert await store.requeue(lost.id, "w", 1, "worker_lost", max_attempts=3) == "requeued"

    got = _samples(queue_metrics.exposition(await queue_metrics.snapshot(r, "m", 10, 3600)))
    assert got[("inferq_jobs_finished_total", (("code", ""), ("model", "m"), ("status", "succeeded")))] == 1
    assert got[("inferq_jobs_finished_total", (("code", "deadline_exceeded"), ("model", "m"),
                                               ("status", "failed")))] == 1
    assert got[("inferq_jobs_finished_total", (("code", ""), ("model", "m"), ("status", "cancelled")))] == 1
    assert got[("inferq_job_redeliveries_total", (("model", "m"), ("reason", "worker_lost")))] == 1
    assert got[("inferq_job_deadline_expiries_total", (("model", "m"),))] == 1
    assert got[("inferq_jobs_submitted_total", (("model", "m"),))] == 4


async def test_a_job_failed_for_its_input_is_counted_apart(store: JobStore, r: redis.asyncio.Redis) -> None:
    """A job the worker refused for what the client sent (an unsupported ``dimensions``, an empty
    input: an invalid_request_error) is the client's doing, not the service's: it counts as
    ``invalid``, so that the InferqJobsFailing alert (``status="failed"``) counts only the
    service's own failures. Its record still says failed."""
    bad, broken = [await _job(store) for _ in range(2)]
    for rec, error in ((bad, InvalidRequest("dimensions 100 is not one of the model's", param="dimensions")),
                       (broken, EngineError("the engine died"))):
        await store.claim(rec.id, "w")
        info = ErrorInfo.of(error)
        await store.finish(rec.id, "w", 1, ErrorEvent(seq=1, error=info), check_log=False, status=JobStatus.failed,
                           error=info)
    got = _samples(queue_metrics.exposition(await queue_metrics.snapshot(r, "m", 10, 3600)))
    assert got[("inferq_jobs_finished_total", (("code", "invalid_value"), ("model", "m"), ("status", "invalid")))] == 1
    assert got[("inferq_jobs_finished_total", (("code", "engine_error"), ("model", "m"), ("status", "failed")))] == 1
    assert not any(k[0] == "inferq_jobs_finished_total" and ("code", "invalid_value") in k[1] and
                   ("status", "failed") in k[1] for k in got)
    stored = await store.get(bad.id)
    assert stored is not None and stored.status is JobStatus.failed


def test_token_count_reads_the_field_not_the_text() -> None:
    assert token_count('{"type":"token","seq":3,"index":0,"text":"a\\"n_tokens\\":9","n_tokens":2}') == 2
    assert token_count('{"type":"token","seq":1,"text":"x"}') == 0


def test_json_lines_carry_the_job_model_and_worker(capsys: object) -> None:
    logs.set_process_fields(component="worker", worker_id="w7", model="m")
    handler = logging.StreamHandler()
    handler.setFormatter(logs.formatter("json"))
    handler.addFilter(logs.JobFields())
    log = logging.getLogger("inferq.test.json")
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    log.propagate = False
    try:
        with logs.job_context("job-1"):
            log.info("inside %s", "a job")
        log.info("outside")
        log.info("explicit", extra={"job_id": "job-2"})
    finally:
        log.removeHandler(handler)
    lines = [json.loads(x) for x in capsys.readouterr().err.splitlines()]  # type: ignore[attr-defined]
    assert [(x["message"], x["job_id"]) for x in lines] == [("inside a job", "job-1"), ("outside", None),
                                                            ("explicit", "job-2")]
    assert all(x["worker_id"] == "w7" and x["model"] == "m" and x["level"] == "INFO" for x in lines)


def test_log_format_is_a_setting() -> None:
    assert Settings(log_format="json").log_format == "json"
    assert Settings().log_format == "plain"


def test_api_keys_in_query_strings_never_reach_the_log() -> None:
    """uvicorn prints request paths; a socket's ?api_key= must come out hidden."""
    from inferq.shared.logs import RedactKeys, redact_keys

    redact_keys()
    for name in ("uvicorn.error", "uvicorn.access"):  # where uvicorn prints paths
        assert any(isinstance(f, RedactKeys) for f in logging.getLogger(name).filters)
    socket = logging.LogRecord("uvicorn.error", logging.INFO, __file__, 1, '%s - "WebSocket %s" [accepted]',
                               ("127.0.0.1:5", "/v1/generate?api_key=sk-secret-1&x=1"), None)
    http = logging.LogRecord("uvicorn.access", logging.INFO, __file__, 1, '%s - "%s %s HTTP/%s" %d',
                             ("1.2.3.4:5", "GET", "/v1/queue?api_key=sk-secret-2", "1.1", 200), None)
    for record in (socket, http):
        assert RedactKeys().filter(record)
    assert socket.getMessage() == '127.0.0.1:5 - "WebSocket /v1/generate?api_key=***&x=1" [accepted]'
    assert http.getMessage() == '1.2.3.4:5 - "GET /v1/queue?api_key=*** HTTP/1.1" 200'
