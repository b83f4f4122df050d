"""Configured request limits come from the settings of the app that admits the job."""

from __future__ import annotations

import signal
import uuid
from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient
from starlette.websockets import WebSocketDisconnect

from inferq.api.app import create_app
from inferq.cli.procs import RedisProc, start_redis
from inferq.shared.errors import InvalidRequest
from inferq.shared.request_limits import check_limits
from inferq.shared.schemas import JobRequest
from inferq.shared.settings import Settings
from tests.procs import free_port

LIMITS = Settings(max_tokens_limit=100, max_n=2, max_stop_sequences=2, max_stop_chars=5, max_prompt_chars=10,
                  max_timeout_s=60)


@pytest.mark.parametrize(("body", "param", "message"), [
    ({"prompt": "x", "max_tokens": 101}, "max_tokens", "max_tokens: must be <= 100"),
    ({"prompt": "x", "n": 3, "temperature": 1}, "n", "n: must be <= 2"),
    ({"prompt": "x", "stop": ["a", "b", "c"]}, "stop", "stop: at most 2 stop sequences"),
    ({"prompt": "x", "stop": ["abcdef"]}, "stop", "stop: each stop sequence must be 1 to 5 characters"),
    ({"prompt": "x" * 11}, "prompt", "prompt: is 11 characters; the limit is 10"),
    ({"messages": [{"role": "user", "content": "x" * 6}] * 2}, "messages",
     "messages: hold 12 characters; the limit is 10"),
    ({"prompt": "x", "timeout": 61}, "timeout", "timeout: must be <= 60 seconds"),
])
def test_each_limit_is_a_400_naming_the_field(body: dict, param: str, message: str) -> None:
    req = JobRequest.model_validate(body)  # the schema itself knows no configured limit
    with pytest.raises(InvalidRequest) as e:
        check_limits(req, LIMITS)
    assert (e.value.status, e.value.param, e.value.message) == (400, param, message)


def test_requests_at_the_limits_pass() -> None:
    check_limits(JobRequest(prompt="x" * 10, max_tokens=100, n=2, stop=["abcde", "a"], timeout=60), LIMITS)


@pytest.fixture(scope="module")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    server: RedisProc = start_redis(free_port(), tmp_path_factory.mktemp("limits"), name="redis-limits")
    yield server.url
    server.stop(signal.SIGKILL)


def test_two_apps_each_enforce_their_own_limits(redis_url: str) -> None:
    model = f"limits-{uuid.uuid4().hex[:6]}"  # no worker serves it: accepted jobs just wait, queued
    strict = Settings(redis_url=redis_url, served_model_name=model, api_keys="", max_tokens_limit=10, max_n=1)
    lax = Settings(redis_url=redis_url, served_model_name=model, api_keys="", max_tokens_limit=100, max_n=4)
    body = {"prompt": "x", "max_tokens": 50}
    with TestClient(create_app(strict)) as s, TestClient(create_app(lax)) as lx:
        r = s.post("/v1/jobs", json=body)
        assert r.status_code == 400, r.text
        assert r.json()["error"] | {"message": None} == {"message": None, "type": "invalid_request_error",
                                                         "param": "max_tokens", "code": "invalid_value"}
        assert r.json()["error"]["message"] == "max_tokens: must be <= 10"
        assert lx.post("/v1/jobs", json=body).status_code == 202

        chat = {"messages": [{"role": "user", "content": "hi"}], "n": 2}
        r = s.post("/v1/chat/completions", json=chat)
        assert r.status_code == 400 and r.json()["error"]["param"] == "n", r.text
        r = s.post("/v1/completions", json={"prompt": ["a", "b"], "max_tokens": 11})
        assert r.status_code == 400 and r.json()["error"]["param"] == "max_tokens", r.text

        with s.websocket_connect("/v1/generate") as ws:
            ws.send_json(body)
            ev = ws.receive_json()
            with pytest.raises(WebSocketDisconnect) as closed:
                ws.receive_json()
        assert ev["type"] == "error" and ev["error"]["message"] == "max_tokens: must be <= 10"
        assert closed.value.code == 1008
        with lx.websocket_connect("/v1/generate") as ws:
            ws.send_json(body)
            assert ws.receive_json()["type"] == "accepted"


def test_min_tokens_above_max_tokens_is_a_400_naming_it(redis_url: str) -> None:
    """It cannot be met (vLLM refuses it): refused before queueing, not a job that fails in the
    worker. Without max_tokens the job's default (INFERQ_DEFAULT_MAX_TOKENS) is what it must fit."""
    settings = Settings(redis_url=redis_url, served_model_name=f"limits-{uuid.uuid4().hex[:6]}", api_keys="",
                        default_max_tokens=50)
    with TestClient(create_app(settings)) as c:
        for body, message in (({"max_tokens": 8, "min_tokens": 20}, "min_tokens (20) must be <= max_tokens (8)"),
                              ({"min_tokens": 51}, "min_tokens (51) must be <= max_tokens, which is 50 when the "
                               "request gives none (INFERQ_DEFAULT_MAX_TOKENS)")):
            r = c.post("/v1/jobs", json={"prompt": "x", **body})
            assert r.status_code == 400 and r.json()["error"]["param"] == "min_tokens", r.text
            assert message in r.json()["error"]["message"]
        assert c.post("/v1/jobs", json={"prompt": "x", "max_tokens": 8, "min_tokens": 8}).status_code == 202
        assert c.post("/v1/jobs", json={"prompt": "x", "min_tokens": 50}).status_code == 202
