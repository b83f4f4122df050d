"""What a client sends is checked at the door, before it reaches Redis or a worker: free-form
JSON (depth, size, what JSON cannot carry), model names, ``user``, ``stop``, Idempotency-Key."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient
from starlette.websockets import WebSocketDisconnect

from inferq.api.admission import check_idempotency_key
from inferq.api.app import create_app
from inferq.shared.errors import InvalidRequest
from inferq.shared.request_limits import check_json
from inferq.shared.schemas import JobMessage, JobRequest
from inferq.shared.settings import Settings

LIMITS = Settings(max_json_depth=8, max_json_bytes=2048)


def nested(levels: int) -> dict[str, Any]:
    """A JSON schema whose objects nest ``levels`` deep (two per property level)."""
    schema: dict[str, Any] = {"type": "string"}
    for _ in range((levels - 1) // 2):
        schema = {"type": "object", "properties": {"a": schema}}
    return schema if levels % 2 else {"not": schema}


def depth(value: Any) -> int:
    return 1 + max((depth(v) for v in (value.values() if isinstance(value, dict) else value)), default=0) \
        if isinstance(value, (dict, list)) else 0


def test_nested_builds_the_depth_it_says() -> None:
    assert [depth(nested(n)) for n in (1, 2, 7, 8, 9)] == [1, 2, 7, 8, 9]


def test_check_json_depth_size_and_what_json_cannot_carry() -> None:
    check_json(nested(8), "json_schema", LIMITS)
    check_json({"enum": ["x" * 1900]}, "json_schema", LIMITS)
    check_json({"title": "é" * 100, "maximum": 1.5, "n": 10**30}, "json_schema", LIMITS)
    cases = [(nested(9), "nests objects and arrays more than 8 levels deep"),
             ({"a": [[[[[[[[1]]]]]]]]}, "more than 8 levels"),
             ({"enum": ["x" * 2100]}, "the limit is 2048"),
             ({"enum": ["é" * 1100]}, "the limit is 2048"),  # bytes, not characters
             ({"maximum": float("nan")}, "NaN"), ({"maximum": float("inf")}, "NaN or an infinity"),
             ({"title": "\ud800"}, "lone surrogate"), ({"\udc00": 1}, "lone surrogate")]
    for value, message in cases:
        with pytest.raises(InvalidRequest) as e:
            check_json(value, "json_schema", LIMITS)
        assert e.value.param == "json_schema" and e.value.message.startswith("json_schema: ")
        assert message in e.value.message, (e.value.message, message)


def test_check_json_is_iterative() -> None:
    """Far deeper than Python's recursion limit: refused at the first level too deep."""
    value: Any = 1
    for _ in range(100_000):
        value = [value]
    with pytest.raises(InvalidRequest, match="more than 32 levels"):
        check_json({"a": value}, "json_schema", Settings())


def test_the_default_depth_limit_leaves_room_for_the_worker() -> None:
    """The deepest schema the gateway admits is one the worker decodes; the ceiling of the setting
    is too (the worker's JSON parser stops near 200 levels)."""
    for levels in (Settings().max_json_depth, Settings.model_fields["max_json_depth"].metadata[1].le):
        req = JobRequest(prompt="x", json_schema=nested(levels))
        check_json(req.json_schema, "json_schema", Settings(max_json_depth=levels))
        payload = JobMessage(id="job-" + "0" * 32, model="m", request=req, created_at=0).model_dump_json()
        assert JobMessage.model_validate_json(payload).request.json_schema == req.json_schema


@pytest.mark.parametrize("value", ["k", "x" * 255, "Aa0 -_.:/+=~!"])
def test_idempotency_key_within_bounds(value: str) -> None:
    assert check_idempotency_key(value) == value


@pytest.mark.parametrize("value", ["", "x" * 256, "clé", "a\tb", "a\x7fb", "\u00a0"])
def test_idempotency_key_out_of_bounds(value: str) -> None:
    with pytest.raises(InvalidRequest) as e:
        check_idempotency_key(value)
    assert e.value.param == "Idempotency-Key"


@pytest.fixture(scope="module")
def app(unit_redis) -> Iterator[TestClient]:
    model = f"door-{uuid.uuid4().hex[:6]}"  # no worker serves it: accepted jobs stay queued
    settings = Settings(redis_url=unit_redis.url, served_model_name=model, api_keys="")
    with TestClient(create_app(settings)) as client:
        yield client


def refused(r: Any, param: str | None, status: int = 400) -> str:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert (err["type"], err["code"], err["param"]) == ("invalid_request_error", "invalid_value", param), err
    return str(err["message"])


CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
DEEP = nested(33)  # the default limit is 32


def nested_text(levels: int) -> str:
    """:func:`nested` as JSON text, built without recursion."""
    k = (levels - 1) // 2
    inner = '{"type":"object","properties":{"a":' * k + '{"type":"string"}' + "}}" * k
    return inner if levels % 2 else '{"not":' + inner + "}"


def parses(text: str) -> bool:
    """Python's JSON parser takes ``text`` (how deep it goes depends on the version: 3.11 and 3.12
    give up on 5000 levels, 3.13 takes them)."""
    try:
        json.loads(text)
    except RecursionError:
        return False
    return True


def post(app: TestClient, path: str, body: str, headers: dict[str, str] | None = None) -> Any:
    return app.post(path, content=body, headers={"content-type": "application/json", **(headers or {})})


@pytest.mark.parametrize("levels", [33, 120, 199, 230, 300, 5000])
def test_a_deep_json_schema_is_a_400_naming_it_on_every_endpoint(app, levels: int) -> None:
    schema = nested_text(levels)
    if levels < 300:
        assert json.loads(schema) == nested(levels)
    parsed = parses(schema)  # else Python's JSON parser gave up first: no field to name yet
    for headers in ({}, {"Idempotency-Key": f"deep-{uuid.uuid4().hex}"}):  # the key's fingerprint too
        r = post(app, "/v1/jobs", '{"prompt": "x", "json_schema": %s}' % schema, headers)
        message = refused(r, "json_schema" if parsed else None)
        assert ("more than 32 levels deep" if parsed else "nests JSON too deeply") in message
        rf = '{"type": "json_schema", "json_schema": {"name": "deep", "schema": %s}}' % schema
        r = post(app, "/v1/chat/completions", json.dumps(CHAT)[:-1] + ', "response_format": %s}' % rf, headers)
        message = refused(r, "response_format.json_schema.schema" if parsed else None)
        assert ("more than 32 levels deep" if parsed else "nests JSON too deeply") in message
    with app.websocket_connect("/v1/generate") as ws:
        ws.send_text('{"prompt": "x", "json_schema": %s}' % schema)
        event = ws.receive_json()
        with pytest.raises(WebSocketDisconnect) as closed:
            ws.receive_json()
    assert closed.value.code == 1008 and event["error"]["type"] == "invalid_request_error"
    if levels < 200:  # deeper, the socket's own JSON parser refuses it first
        assert event["error"]["param"] == "json_schema"


def test_a_json_schema_at_the_limit_is_queued(app) -> None:
    r = app.post("/v1/jobs", json={"prompt": "x", "json_schema": nested(32)}, headers={"Idempotency-Key": "d32"})
    assert r.status_code == 202, r.text


def test_a_json_schema_over_the_size_limit_or_not_json_is_a_400(app) -> None:
    big = {"enum": ["x" * 1000] * 70}  # ~70 KB; the default limit is 64 KiB
    assert "the limit is 65536" in refused(app.post("/v1/jobs", json={"prompt": "x", "json_schema": big}),
                                           "json_schema")
    for raw in ('{"maximum": NaN}', '{"maximum": Infinity}', '{"title": "\\ud800"}'):
        body = '{"prompt": "x", "json_schema": %s}' % raw
        r = app.post("/v1/jobs", content=body, headers={"content-type": "application/json"})
        refused(r, "json_schema")
        body = '{"messages": [{"role": "user", "content": "x"}], "response_format": {"type": "json_schema", ' \
               '"json_schema": {"name": "n", "schema": %s}}}' % raw
        r = app.post("/v1/chat/completions", content=body, headers={"content-type": "application/json"})
        refused(r, "response_format.json_schema.schema")


@pytest.mark.parametrize("model", ["a:3", "inferq.q.x:1", "m m", "m\n", "m*", "m?", "m[1]", "é", "m{x}"])
def test_a_model_name_with_characters_of_a_redis_key_is_a_400(app, model: str) -> None:
    refused(app.post("/v1/jobs", json={"prompt": "x", "model": model}), "model")
    refused(app.post("/v1/chat/completions", json={**CHAT, "model": model}), "model")
    refused(app.post("/v1/completions", json={"prompt": "x", "model": model}), "model")


@pytest.mark.parametrize("model", ["Qwen/Qwen2.5-0.5B-Instruct", "org/model@v1.2+cpu", "x_y.z"])
def test_a_well_formed_unknown_model_is_a_404(app, model: str) -> None:
    r = app.post("/v1/jobs", json={"prompt": "x", "model": model})
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found", r.text


def test_user_is_bounded_and_has_no_control_characters(app) -> None:
    for user in ("a\nb", "\x00", "x\x1b[2J", "u" * 257):
        refused(app.post("/v1/jobs", json={"prompt": "x", "user": user}), "user")
        refused(app.post("/v1/chat/completions", json={**CHAT, "user": user}), "user")
        refused(app.post("/v1/completions", json={"prompt": "x", "user": user}), "user")
    assert app.post("/v1/jobs", json={"prompt": "x", "user": "user-42 é"}).status_code == 202


def test_stop_is_bounded_on_every_endpoint(app) -> None:
    for stop in ([""], "", ["s"] * 9, ["s" * 257], ["\ud800"], "\udfff"):
        body = json.dumps({"prompt": "x", "stop": stop})
        r = app.post("/v1/jobs", content=body, headers={"content-type": "application/json"})
        refused(r, "stop")
        r = app.post("/v1/completions", content=body, headers={"content-type": "application/json"})
        refused(r, "stop")
        body = json.dumps({**CHAT, "stop": stop})
        r = app.post("/v1/chat/completions", content=body, headers={"content-type": "application/json"})
        refused(r, "stop")


def test_a_bad_idempotency_key_is_a_400_before_anything_is_queued(app) -> None:
    for key in ("x" * 256, "clé".encode(), b"a\x7fb"):
        for path, body in (("/v1/jobs", {"prompt": "x"}), ("/v1/chat/completions", CHAT),
                           ("/v1/completions", {"prompt": "x"})):
            r = app.post(path, json=body, headers={"Idempotency-Key": key})
            refused(r, "Idempotency-Key")
