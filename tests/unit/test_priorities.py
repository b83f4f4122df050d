"""Who may ask for which priority: each API key may use the priorities its keys-file line gives it
(``priority=LO`` or ``priority=LO-HI``), by default the default priority and later; without auth
every caller may use them all. A priority a key may not use is a 400 naming ``priority``."""

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

KEYS = "sk-plain\nsk-admin operator priority=0-9\nsk-late batchy priority=7\n"


def test_keys_file_priority_option(tmp_path: Path) -> None:
    f = tmp_path / "keys"
    f.write_text(KEYS + "sk-mid priority=2-4\n")
    got = {k: spec.priorities for k, spec in read_keys_file(f).items()}
    assert got == {"sk-plain": range(5, 10), "sk-admin": range(0, 10), "sk-late": range(7, 10),
                   "sk-mid": range(2, 5)}
    assert read_keys_file(f)["sk-admin"].name == "operator"


@pytest.mark.parametrize("bad", ["priority=10", "priority=5-3", "priority=x", "priority=-1", "priority=1-"])
def test_a_bad_priority_option_names_its_line_never_the_key(tmp_path: Path, bad: str) -> None:
    f = tmp_path / "keys"
    f.write_text(f"sk-ok\nsk-secret {bad}\n")
    with pytest.raises(ValueError, match="line 2: priority=") as e:
        read_keys_file(f)
    assert "sk-secret" not in str(e.value)


def _priority(url: str, job_id: str) -> int:
    with redis.Redis.from_url(url, decode_responses=True) as r:
        return JobRecord.from_hash(r.hgetall(keys.job(job_id))).request.priority


def test_each_key_asks_only_for_its_priorities(own_redis: str, tmp_path: Path) -> None:
    """A plain key cannot jump ahead of other keys' default-priority work (priority 0 is refused, so
    a flood of it cannot starve them); an operator's key can; a key whose priorities start later
    runs a request that names none at its first."""
    f = tmp_path / "keys"
    f.write_text(KEYS)
    model = f"prio-{uuid.uuid4().hex[:6]}"  # no worker serves it: accepted jobs wait, queued
    settings = Settings(redis_url=own_redis, served_model_name=model, api_keys_file=f)

    def post(client: TestClient, key: str, **body: object) -> tuple[int, dict]:
        r = client.post("/v1/jobs", json={"prompt": "x", **body}, headers={"Authorization": f"Bearer {key}"})
        return r.status_code, r.json()

    with TestClient(create_app(settings)) as c:
        status, body = post(c, "sk-plain", priority=0)
        assert status == 400 and body["error"]["param"] == "priority", body
        assert body["error"]["message"] == ("priority 0 is not allowed for this API key: it may use priorities 5 "
                                            "to 9 (0 runs first)")
        for prio in (5, 9):
            status, body = post(c, "sk-plain", priority=prio)
            assert status == 202 and _priority(own_redis, body["id"]) == prio
        status, body = post(c, "sk-plain")
        assert status == 202 and _priority(own_redis, body["id"]) == 5
        status, body = post(c, "sk-admin", priority=0)
        assert status == 202 and _priority(own_redis, body["id"]) == 0
        status, body = post(c, "sk-late")
        assert status == 202 and _priority(own_redis, body["id"]) == 7
        assert post(c, "sk-late", priority=5)[0] == 400
        with c.websocket_connect("/v1/generate", headers={"Authorization": "Bearer sk-plain"}) as ws:
            ws.send_json({"prompt": "x", "priority": 1})
            ev = ws.receive_json()
            with pytest.raises(WebSocketDisconnect):
                ws.receive_json()
        assert ev["type"] == "error" and ev["error"]["param"] == "priority"


def test_without_auth_every_priority_is_open(own_redis: str) -> None:
    settings = Settings(redis_url=own_redis, served_model_name=f"prio-{uuid.uuid4().hex[:6]}", api_keys="")
    with TestClient(create_app(settings)) as c:
        r = c.post("/v1/jobs", json={"prompt": "x", "priority": 0})
    assert r.status_code == 202 and _priority(own_redis, r.json()["id"]) == 0
