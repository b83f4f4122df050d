"""Browser origins (``INFERQ_ALLOWED_ORIGINS``), against a real redis-server: pages on a listed
origin get CORS answers and may open WebSockets; other pages' sockets are refused with a
``permission_error`` event and close 4403; clients that send no Origin (SDKs, scripts) are not
concerned; with no list, nothing changes."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient
from starlette.websockets import WebSocketDisconnect

from inferq.api.app import create_app
from inferq.shared.settings import Settings

APP, OTHER = "https://app.example", "https://evil.example"
UNKNOWN = "job-" + "0" * 32


def client(url: str, origins: str) -> TestClient:
    settings = Settings(redis_url=url, served_model_name=f"origins-{uuid.uuid4().hex[:6]}", allowed_origins=origins)
    return TestClient(create_app(settings))


@pytest.fixture(scope="module")
def listed(unit_redis) -> Iterator[TestClient]:
    with client(unit_redis.url, f"{APP}, https://second.example/") as c:
        yield c


@pytest.fixture(scope="module")
def open_app(unit_redis) -> Iterator[TestClient]:
    with client(unit_redis.url, "") as c:
        yield c


def first_event_and_close(app: TestClient, origin: str | None) -> tuple[dict, int]:
    headers = {"Origin": origin} if origin else {}
    with app.websocket_connect(f"/v1/jobs/{UNKNOWN}/stream", headers=headers) as sock:
        event = sock.receive_json()
        with pytest.raises(WebSocketDisconnect) as closed:
            sock.receive_json()
    return event, closed.value.code


def test_cors_answers_only_listed_origins(listed) -> None:
    preflight = {"Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "authorization"}
    ok = listed.options("/v1/chat/completions", headers={"Origin": APP, **preflight})
    assert ok.status_code == 200 and ok.headers["access-control-allow-origin"] == APP
    assert listed.get("/healthz", headers={"Origin": "https://second.example"}).headers[
        "access-control-allow-origin"] == "https://second.example"
    refused = listed.options("/v1/chat/completions", headers={"Origin": OTHER, **preflight})
    assert refused.status_code == 400 and "access-control-allow-origin" not in refused.headers
    assert "access-control-allow-origin" not in listed.get("/healthz", headers={"Origin": OTHER}).headers


def test_websockets_from_other_origins_are_refused(listed) -> None:
    event, code = first_event_and_close(listed, OTHER)
    assert (event["type"], event["error"]["type"], event["error"]["code"], code) == \
        ("error", "permission_error", "origin_not_allowed", 4403)
    for origin in (APP, None):  # a listed page, and a client that sends no Origin, get as far as the job
        event, code = first_event_and_close(listed, origin)
        assert (event["error"]["type"], code) == ("not_found_error", 4404), origin


def test_no_list_no_cors_and_any_origin(open_app) -> None:
    assert "access-control-allow-origin" not in open_app.get("/healthz", headers={"Origin": OTHER}).headers
    event, code = first_event_and_close(open_app, OTHER)
    assert (event["error"]["type"], code) == ("not_found_error", 4404)
