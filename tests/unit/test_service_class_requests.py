"""What a request's service class is, as the gateway decides it (api/admission.py ``classed``): the
default is interactive; batch work is asked for with ``service_class`` (``/v1/jobs``), OpenAI's
``service_tier: "flex"`` (chat, completions, Responses) or a key's ``class=batch``, and runs at
``INFERQ_BATCH_PRIORITY``, the batch lane. An unknown class or tier, batch work on a streamed
request, and a batch job asking for another priority are 400s naming the field."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
import redis
from fastapi.testclient import TestClient
from starlette.websockets import WebSocketDisconnect

from inferq.api.app import create_app
from inferq.api.auth import read_keys_file
from inferq.shared import keys
from inferq.shared.schemas import JobRecord
from inferq.shared.settings import Settings

KEYS = "sk-chat\nsk-bulk bulk class=batch\n"


def _record(url: str, job_id: str) -> JobRecord:
    with redis.Redis.from_url(url, decode_responses=True) as r:
        return JobRecord.from_hash(r.hgetall(keys.job(job_id)))


def test_keys_file_class_option(tmp_path: Path) -> None:
    f = tmp_path / "keys"
    f.write_text(KEYS + "sk-both class=interactive\n")
    got = {k: spec.batch_only for k, spec in read_keys_file(f).items()}
    assert got == {"sk-chat": False, "sk-bulk": True, "sk-both": False}
    f.write_text("sk-ok\nsk-secret class=bulk\n")
    with pytest.raises(ValueError, match="line 2: class= must be one of interactive, batch") as e:
        read_keys_file(f)
    assert "sk-secret" not in str(e.value)


@pytest.fixture
def gateway(own_redis: str, tmp_path: Path) -> TestClient:
    f = tmp_path / "keys"
    f.write_text(KEYS)
    model = f"cls-{uuid.uuid4().hex[:6]}"  # no worker serves it: accepted jobs wait, queued
    with TestClient(create_app(Settings(redis_url=own_redis, served_model_name=model, api_keys_file=f))) as c:
        yield c


def _post(c: TestClient, path: str, key: str = "sk-chat", **body: object) -> tuple[int, dict]:
    r = c.post(path, json=body, headers={"Authorization": f"Bearer {key}"})
    return r.status_code, r.json()


def test_a_job_is_interactive_unless_it_asks_for_batch(gateway: TestClient, own_redis: str) -> None:
    status, body = _post(gateway, "/v1/jobs", prompt="x")
    rec = _record(own_redis, body["id"])
    assert status == 202 and rec.request.service_class == "interactive" and rec.request.priority == 5
    status, body = _post(gateway, "/v1/jobs", prompt="x", service_class="batch")
    rec = _record(own_redis, body["id"])
    assert status == 202 and rec.request.service_class == "batch" and rec.request.priority == 9
    assert rec.tenant is not None and rec.tenant.startswith("key-")


def test_an_unknown_class_or_tier_is_a_400_naming_it(gateway: TestClient) -> None:
    status, body = _post(gateway, "/v1/jobs", prompt="x", service_class="bulk")
    assert status == 400 and body["error"]["param"] == "service_class", body
    status, body = _post(gateway, "/v1/chat/completions", messages=[{"role": "user", "content": "x"}],
                         service_tier="turbo")
    assert status == 400 and body["error"]["param"] == "service_tier", body
    status, body = _post(gateway, "/v1/responses", input="x", service_tier="cheap", background=True)
    assert status == 400 and body["error"]["param"] == "service_tier", body


def test_batch_work_is_not_streamed(gateway: TestClient) -> None:
    chat = {"messages": [{"role": "user", "content": "x"}], "stream": True, "service_tier": "flex"}
    for path, body in (("/v1/chat/completions", chat), ("/v1/completions", {"prompt": "x", "stream": True,
                                                                            "service_tier": "flex"}),
                       ("/v1/responses", {"input": "x", "stream": True, "service_tier": "flex"})):
        status, got = _post(gateway, path, **body)
        assert status == 400 and got["error"]["param"] == "service_tier", (path, got)
        assert "streamed request is interactive" in got["error"]["message"]
    with gateway.websocket_connect("/v1/generate", headers={"Authorization": "Bearer sk-chat"}) as ws:
        ws.send_json({"prompt": "x", "service_class": "batch"})
        ev = ws.receive_json()
        with pytest.raises(WebSocketDisconnect):
            ws.receive_json()
    assert ev["type"] == "error" and ev["error"]["param"] == "service_class"


def test_a_background_response_may_be_batch_work(gateway: TestClient, own_redis: str) -> None:
    status, body = _post(gateway, "/v1/responses", input="x", background=True, service_tier="flex")
    assert status == 200 and body["service_tier"] == "flex", body
    rec = _record(own_redis, "job-" + body["id"].removeprefix("resp_"))
    assert rec.request.service_class == "batch" and rec.request.priority == 9
    status, body = _post(gateway, "/v1/responses", input="x", background=True)
    assert status == 200 and body["service_tier"] == "default"


def test_batch_work_runs_at_the_batch_priority(gateway: TestClient) -> None:
    status, body = _post(gateway, "/v1/jobs", prompt="x", service_class="batch", priority=6)
    assert status == 400 and body["error"]["param"] == "priority", body
    assert _post(gateway, "/v1/jobs", prompt="x", service_class="batch", priority=9)[0] == 202


def test_a_batch_key_runs_batch_work_only(gateway: TestClient, own_redis: str) -> None:
    status, body = _post(gateway, "/v1/jobs", "sk-bulk", prompt="x")
    rec = _record(own_redis, body["id"])
    assert status == 202 and rec.request.service_class == "batch" and rec.request.priority == 9
    status, body = _post(gateway, "/v1/jobs", "sk-bulk", prompt="x", service_class="interactive")
    assert status == 400 and body["error"]["code"] == "service_class_not_allowed", body
    status, body = _post(gateway, "/v1/completions", "sk-bulk", prompt="x", stream=True)
    assert status == 400 and body["error"]["param"] == "stream", body


def test_the_queue_shows_each_class_and_tenant(gateway: TestClient, own_redis: str) -> None:
    """``GET /v1/queue`` (the console's queue panel): queued work by class (batch: the batch lane's)
    and tenant, and what the workers' heartbeats say they hold; /metrics as inferq_class_jobs."""
    import time

    from inferq.shared.schemas import ClassesInfo, WorkerInfo

    _post(gateway, "/v1/jobs", prompt="x")
    _, body = _post(gateway, "/v1/jobs", "sk-bulk", prompt="x")
    model = _record(own_redis, body["id"]).model
    info = WorkerInfo(id="w1", model=model, host="h", pid=1, max_model_len=128, max_num_seqs=2, started_at=0.0,
                      last_seen=time.time(), classes=ClassesInfo(slots=2, reserve=1, batch_limit=2, running={
                          "batch": {"acme": 2}, "interactive": {"acme": 1}}))
    with redis.Redis.from_url(own_redis, decode_responses=True) as r:
        r.set(keys.worker("w1"), info.model_dump_json())
        r.zadd(keys.workers(model), {"w1": time.time()})
    [q] = [m for m in gateway.get("/v1/queue", headers={"Authorization": "Bearer sk-chat"}).json()["models"]
           if m["model"] == model]
    assert q["classes"] == {"batch": {"queued": 1, "running": 2}, "interactive": {"queued": 1, "running": 1}}
    assert sorted(v["queued"] for v in q["tenants"].values()) == [1, 1]  # the two keys, a tenant each
    text = gateway.get("/metrics").text
    assert f'inferq_class_jobs{{class="batch",model="{model}",status="running"}} 2.0' in text
