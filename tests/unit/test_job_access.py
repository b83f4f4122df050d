"""Who may read a job, and what a job id must look like (docs/security.md), against a real
redis-server and an app with API keys: a job whose record is gone is not found for anybody,
whatever its log still holds; another key's job, an unknown id and a malformed one answer alike."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator

import pytest
import redis
from fastapi.testclient import TestClient
from starlette.websockets import WebSocketDisconnect

from inferq.api.app import create_app
from inferq.shared import keys
from inferq.shared.errors import InvalidRequest
from inferq.shared.redis import make_redis
from inferq.shared.schemas import DoneEvent, ErrorInfo, JobRecord, JobRequest, JobStatus, TokenEvent
from inferq.shared.settings import Settings
from inferq.shared.store import JobStore

ALICE, BOB = "sk-alice-access", "sk-bob-access"
UNKNOWN = "job-" + "0" * 32


@pytest.fixture(scope="module")
def app(unit_redis) -> Iterator[TestClient]:
    model = f"access-{uuid.uuid4().hex[:6]}"  # no worker serves it: submitted jobs stay queued
    settings = Settings(redis_url=unit_redis.url, served_model_name=model, api_keys=f"{ALICE},{BOB}")
    with TestClient(create_app(settings)) as client:
        yield client


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def submit(app: TestClient, key: str) -> str:
    r = app.post("/v1/jobs", json={"prompt": "mine", "max_tokens": 2}, headers=auth(key))
    assert r.status_code == 202, r.text
    return str(r.json()["id"])


def ws(app: TestClient, path: str, key: str) -> tuple[list[dict], int]:
    """Every event of a socket the server closes, and its close code."""
    events: list[dict] = []
    with app.websocket_connect(path, headers=auth(key)) as sock, pytest.raises(WebSocketDisconnect) as closed:
        while True:
            events.append(sock.receive_json())
    return events, closed.value.code


def answers(app: TestClient, job_id: str, key: str) -> dict[str, object]:
    """What each way of reading the job says, with the id in the texts replaced by ``ID``."""
    out: dict[str, object] = {}
    for method in ("GET", "DELETE"):
        r = app.request(method, f"/v1/jobs/{job_id}", headers=auth(key))
        out[method] = (r.status_code, r.text.replace(job_id, "ID"))
    events, code = ws(app, f"/v1/jobs/{job_id}/stream", key)
    out["WS"] = (code, json.dumps(events).replace(job_id, "ID"))
    return out


def test_another_keys_job_an_unknown_and_a_malformed_id_answer_byte_for_byte_alike(app) -> None:
    job = submit(app, ALICE)
    unknown = answers(app, UNKNOWN, BOB)
    assert unknown["GET"][0] == unknown["DELETE"][0] == 404 and unknown["WS"][0] == 4404
    assert json.loads(unknown["GET"][1])["error"] == {"type": "not_found_error", "code": "job_not_found",
                                                      "message": "job ID not found", "param": "id"}
    assert answers(app, job, BOB) == unknown
    for malformed in (f"{job}:log", job.upper(), job[:-1], "job-x", f"{job}:chan", "inferq:job:" + job):
        assert answers(app, malformed, BOB) == unknown, malformed
        assert answers(app, malformed, ALICE) == unknown, malformed
    r = app.get(f"/v1/jobs/{job}", headers=auth(ALICE))  # bob neither saw nor cancelled it
    assert r.status_code == 200 and r.json()["status"] == "queued"


def test_a_job_whose_record_is_gone_is_not_found_for_anybody(app, unit_redis) -> None:
    """Expiry simulated with DEL: the log is still there, and nobody may read it."""
    job = submit(app, ALICE)
    r = redis.Redis.from_url(unit_redis.url, decode_responses=True)
    r.xadd(keys.job_log(job), {"e": TokenEvent(seq=1, text="secret").model_dump_json()}, id="1-0")
    r.xadd(keys.job_log(job), {"e": DoneEvent(seq=2, finish_reason="stop").model_dump_json()}, id="2-0")
    ws_before, code = ws(app, f"/v1/jobs/{job}/stream", ALICE)
    assert code == 1000 and [e["seq"] for e in ws_before] == [1, 2]
    r.delete(keys.job(job))
    assert r.xlen(keys.job_log(job)) == 2
    unknown = answers(app, UNKNOWN, BOB)
    for key in (ALICE, BOB):
        got = answers(app, job, key)
        assert got == unknown, key
        assert "secret" not in json.dumps(got)
    for after in (0, 1):  # a resumed stream too
        events, code = ws(app, f"/v1/jobs/{job}/stream?after={after}", ALICE)
        assert code == 4404 and [e["error"]["code"] for e in events] == ["job_not_found"]
    assert r.xlen(keys.job_log(job)) == 2  # nothing was written to it either


@pytest.mark.parametrize("after", ["-1", "1e3", "1.0", "", "+1", "\u00b2", "99999999999999999999999",
                                   str(2**53 + 1), "0x10", " 1"])
def test_a_bad_after_is_a_400_naming_it_and_closes_1008(app, after) -> None:
    job = submit(app, ALICE)
    for job_id in (job, UNKNOWN):  # checked before the job is looked up: the same for both
        events, code = ws(app, f"/v1/jobs/{job_id}/stream?after={after}", ALICE)
        assert code == 1008
        assert [(e["seq"], e["error"]["type"], e["error"]["code"], e["error"]["param"]) for e in events] == [
            (0, "invalid_request_error", "invalid_value", "after")]


def test_after_up_to_2_to_the_53_is_accepted(app, unit_redis) -> None:
    job = submit(app, ALICE)
    r = redis.Redis.from_url(unit_redis.url, decode_responses=True)
    r.xadd(keys.job_log(job), {"e": DoneEvent(seq=1, finish_reason="stop").model_dump_json()}, id="1-0")
    r.hset(keys.job(job), "status", json.dumps("succeeded"))
    for after in ("0", "00", str(2**53)):
        events, code = ws(app, f"/v1/jobs/{job}/stream?after={after}", ALICE)
        assert code == 1000 and [e["seq"] for e in events] == ([1] if int(after) == 0 else [])


async def test_the_record_lives_as_long_as_its_log(unit_redis) -> None:
    """Every script that sets the log's TTL sets the record's to the same."""
    r = make_redis(unit_redis.url)
    store = JobStore(r, ttl_s=5000)
    try:
        async def job() -> str:
            rec = JobRecord(id=f"job-{uuid.uuid4().hex}", model="m", request=JobRequest(prompt="p"))
            await store.create(rec)
            await r.expire(keys.job(rec.id), 10)  # as if created long ago
            return rec.id

        async def same_ttl(job_id: str) -> None:
            ttl_rec, ttl_log = await r.ttl(keys.job(job_id)), await r.ttl(keys.job_log(job_id))
            assert 4990 <= ttl_log <= ttl_rec <= 5000, (ttl_rec, ttl_log)

        cancelled = await job()
        await store.request_cancel(cancelled)
        await same_ttl(cancelled)

        appended = await job()
        await store.claim(appended, "w")
        await store.append([(appended, 1, TokenEvent(seq=1, text="a"))])
        await same_ttl(appended)
        await r.expire(keys.job(appended), 10)
        await store.append([(appended, 1, TokenEvent(seq=2, text="b"))])  # a token: no TTL change
        assert await r.ttl(keys.job(appended)) <= 10
        await store.finish(appended, "w", 1, DoneEvent(seq=3), status=JobStatus.succeeded)
        await same_ttl(appended)

        requeued = await job()
        await store.claim(requeued, "w")
        await store.requeue(requeued, "w", 1, "worker_lost", max_attempts=3)
        await same_ttl(requeued)

        failed = await job()
        await store.fail_queued(failed, ErrorInfo.of(InvalidRequest("no", code="undecodable_job")))
        await same_ttl(failed)
    finally:
        await r.aclose()


async def test_get_visible_follows_the_ownership_rule(unit_redis) -> None:
    r = make_redis(unit_redis.url)
    store = JobStore(r, ttl_s=120)
    try:
        owned = JobRecord(id=f"job-{uuid.uuid4().hex}", model="m", request=JobRequest(prompt="p"), owner="key-a")
        nobodys = JobRecord(id=f"job-{uuid.uuid4().hex}", model="m", request=JobRequest(prompt="p"))
        for rec in (owned, nobodys):
            await store.create(rec)
        assert (await store.get_visible(owned.id, "key-a")) == await store.get(owned.id)
        assert (await store.get_visible(owned.id, None)).owner == "key-a"  # auth off: every job
        assert (await store.get_visible(nobodys.id, None)).id == nobodys.id
        for job_id, owner in ((owned.id, "key-b"), (nobodys.id, "key-a"), (UNKNOWN, "key-a"), (UNKNOWN, None)):
            assert await store.get_visible(job_id, owner) is None
    finally:
        await r.aclose()
