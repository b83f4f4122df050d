"""The error model (docs/errors.md): types and their statuses, stored errors read back as typed
errors, and the same body over HTTP, SSE and WebSocket; no Redis, no worker."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from types import SimpleNamespace

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from pydantic import BaseModel, Field
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ReadOnlyError, ResponseError
from starlette.websockets import WebSocketDisconnect

from inferq.api import errors
from inferq.api import openai as oc
from inferq.api.auth import KeyRing
from inferq.api.frames import Frame
from inferq.api.limits import BodyLimit
from inferq.api.openai.params import ChatCompletionRequest
from inferq.api.routes import stream
from inferq.api.service import JobService
from inferq.shared.errors import (
    BY_TYPE,
    BodyTooLarge,
    ContextLengthExceeded,
    DeadlineExceeded,
    EngineError,
    InferqError,
    InvalidRequest,
    NotFound,
    RateLimited,
    Unauthenticated,
    Unavailable,
    error_from,
)
from inferq.shared.schemas import ErrorEvent, ErrorInfo, JobRecord, JobRequest, JobStatus, TokenEvent
from inferq.shared.settings import Settings

JOB = "job-" + "1" * 32

STATUSES = {"invalid_request_error": 400, "authentication_error": 401, "permission_error": 403,
            "not_found_error": 404,
            "conflict_error": 409, "rate_limit_error": 429, "server_error": 500,
            "service_unavailable": 503, "timeout_error": 504}


def body(response) -> dict:
    return json.loads(response.body)


@pytest.mark.parametrize(("type_", "status"), sorted(STATUSES.items()))
def test_each_type_has_its_status_and_openai_body(type_: str, status: int) -> None:
    err = BY_TYPE[type_]("m", code="c", param="p")
    r = errors.to_response(err)
    assert (err.type, r.status_code) == (type_, status)
    assert body(r) == {"error": {"message": "m", "type": type_, "param": "p", "code": "c"}}


def test_every_type_is_mapped() -> None:
    assert set(BY_TYPE) == set(STATUSES)


def test_every_error_has_a_code() -> None:
    assert (InvalidRequest("m").code, NotFound("m").code, EngineError("m").code) == (
        "invalid_value", "job_not_found", "engine_error")
    too_large = errors.to_response(BodyTooLarge(10))
    assert too_large.status_code == 413 and body(too_large)["error"]["type"] == "invalid_request_error"
    assert body(too_large)["error"]["code"] == "body_too_large"


def test_retry_after_and_www_authenticate_headers() -> None:
    assert errors.to_response(RateLimited("slow down", retry_after=2.4)).headers["retry-after"] == "2"
    assert errors.to_response(Unauthenticated("who?")).headers["www-authenticate"] == "Bearer"


class Limited(BaseModel):
    max_tokens: int = Field(ge=1)
    n: int = Field(le=8)


def test_validation_error_is_400_naming_each_field_and_its_limit() -> None:
    with pytest.raises(Exception) as e:
        Limited.model_validate({"max_tokens": 0, "n": 9})
    r = errors.to_response(e.value)
    err = body(r)["error"]
    assert r.status_code == 400 and (err["type"], err["code"], err["param"]) == (
        "invalid_request_error", "invalid_value", "max_tokens")
    assert "max_tokens" in err["message"] and "n:" in err["message"] and "8" in err["message"]


def test_redis_away_is_503_redis_unavailable() -> None:
    r = errors.to_response(RedisConnectionError("refused"))
    assert r.status_code == 503 and r.headers["retry-after"] == "1"
    assert (body(r)["error"]["type"], body(r)["error"]["code"]) == ("service_unavailable", "redis_unavailable")


def test_a_demoted_master_mid_failover_is_503_redis_unavailable() -> None:
    """A replica that was the master answers writes with READONLY until clients find the new one."""
    r = errors.to_response(ReadOnlyError("You can't write against a read only replica."))
    assert r.status_code == 503 and r.headers["retry-after"] == "1"
    assert body(r)["error"]["code"] == "redis_unavailable"


def test_redis_at_its_memory_limit_is_503_redis_full() -> None:
    """With maxmemory and noeviction (the shipped configuration), Redis refuses writes when full."""
    r = errors.to_response(ResponseError("OOM command not allowed when used memory > 'maxmemory'."))
    assert r.status_code == 503 and r.headers["retry-after"] == "5"
    assert (body(r)["error"]["type"], body(r)["error"]["code"]) == ("service_unavailable", "redis_full")
    assert "maxmemory" not in body(r)["error"]["message"]  # the detail is for the logs


def test_an_unexpected_exception_is_500_without_its_details() -> None:
    r = errors.to_response(KeyError("secret"))
    assert r.status_code == 500 and body(r)["error"] == {
        "message": "internal error", "type": "server_error", "param": None, "code": "internal_error"}


@pytest.mark.parametrize(("stored", "cls", "status", "code"), [
    ({"type": "timeout_error", "code": "deadline_exceeded", "message": "m"}, DeadlineExceeded, 504,
     "deadline_exceeded"),
    ({"type": "service_unavailable", "code": "worker_lost", "message": "m"}, Unavailable, 503, "worker_lost"),
    ({"type": "invalid_request_error", "code": "context_length_exceeded", "message": "m", "param": "max_tokens"},
     InvalidRequest, 400, "context_length_exceeded"),
    ({"type": "server_error", "code": "engine_error", "message": "m"}, InferqError, 500, "engine_error"),
    # records written before types and codes were kept apart: the code stood in `type`
    ({"type": "deadline_exceeded", "message": "m"}, DeadlineExceeded, 504, "deadline_exceeded"),
    ({"type": "worker_lost", "message": "m"}, Unavailable, 503, "worker_lost"),
    ({"type": "enqueue_failed", "message": "m"}, Unavailable, 503, "enqueue_failed"),
    ({"type": "context_length_exceeded", "message": "m"}, InvalidRequest, 400, "context_length_exceeded"),
    ({"type": "engine_error", "message": "m"}, InferqError, 500, "engine_error"),
    ({"type": "something_new", "message": "m"}, InferqError, 500, "something_new"),
])
def test_a_stored_error_becomes_the_typed_error(stored: dict, cls: type, status: int, code: str) -> None:
    info = ErrorInfo.model_validate(stored)
    err = error_from(info)
    assert isinstance(err, cls) and (err.status, err.code, err.message) == (status, code, "m")
    assert err.type == info.type and err.param == stored.get("param")


def test_legacy_record_reads_back_in_todays_shape() -> None:
    rec = JobRecord(id="job-1", model="m", request=JobRequest(prompt="p"), status=JobStatus.failed)
    h = {**rec.to_hash(), "error": json.dumps({"type": "worker_lost", "message": "gone"})}
    assert JobRecord.from_hash(h).error == ErrorInfo(type="service_unavailable", code="worker_lost",
                                                     message="gone")


def test_context_error_names_the_prompt_when_no_max_tokens_could_fit() -> None:
    assert ContextLengthExceeded(10, 100, 64).param == "max_tokens"
    full = ContextLengthExceeded(64, 1, 64, "messages")
    assert full.param == "messages" and "prompt alone has 64 tokens" in full.message and "64 tokens" in full.message


def test_error_info_round_trips_the_typed_error() -> None:
    err = ContextLengthExceeded(10, 100, 64)
    info = ErrorInfo.of(err)
    assert (info.type, info.code, info.param) == ("invalid_request_error", "context_length_exceeded", "max_tokens")
    back = error_from(ErrorInfo.model_validate_json(info.model_dump_json()))
    assert (back.status, back.type, back.code, back.param, back.message) == (
        400, err.type, err.code, err.param, err.message)


def test_websocket_error_event_has_the_same_type_and_code_as_http() -> None:
    err = RateLimited("rate limit reached", code="rate_limit_exceeded", retry_after=3)
    event = json.loads(errors.ws_error_event(err).model_dump_json(exclude_none=True))
    assert event == {"type": "error", "seq": 0, "error": {
        "type": "rate_limit_error", "code": "rate_limit_exceeded", "message": "rate limit reached", "param": None}}
    assert event["error"] == body(errors.to_response(err))["error"]


@pytest.mark.parametrize(("err", "close"), [
    (Unauthenticated("m"), 4401), (NotFound("m"), 4404), (InvalidRequest("m"), 1008),
    (RateLimited("m", code="queue_full"), 4429), (Unavailable("m"), 1011), (EngineError("m"), 1011),
])
def test_websocket_close_codes(err: InferqError, close: int) -> None:
    assert errors.ws_close_code(err) == close


# --- the gateway's routes, with a scripted hub ------------------------------------------------


@dataclass
class ScriptedHub:
    """Yields ``frames`` then raises ``then`` (if any), like a hub whose Redis went away."""

    frames_: list[Frame] = field(default_factory=list)
    then: Exception | None = None

    async def frames(self, job_id: str, after: int = 0, kind: str | None = None) -> AsyncIterator[Frame]:
        for f in self.frames_:
            yield f
        if self.then is not None:
            raise self.then

    async def batches(self, job_id: str, after: int = 0, kind: str | None = None) -> AsyncIterator[list[Frame]]:
        async for f in self.frames(job_id, after):
            yield [f]

    async def events(self, job_id: str, after: int = 0, merge: bool = False,
                     kind: str | None = None) -> AsyncIterator[object]:
        async for f in self.frames(job_id, after):
            yield f.event()


def frame(event: BaseModel) -> Frame:
    return Frame(event.type, event.seq, event.model_dump_json())  # type: ignore[attr-defined]


@pytest.fixture
def ws_app() -> Iterator[tuple[FastAPI, TestClient]]:
    app = FastAPI()
    app.include_router(stream.router)
    app.state.keyring = KeyRing({})

    async def get_visible(job_id: str, owner: str | None) -> JobRecord | None:  # one job exists
        return JobRecord(id=JOB, model="m", request=JobRequest(prompt="p")) if job_id == JOB else None

    store = SimpleNamespace(get_visible=get_visible)
    app.state.service = JobService(Settings(), None, store, None)  # type: ignore[arg-type]
    with TestClient(app) as client:
        yield app, client


def test_websocket_redis_failure_mid_stream_is_an_error_event_and_1011(ws_app) -> None:
    app, client = ws_app
    app.state.hub = ScriptedHub([frame(TokenEvent(seq=1, text="a", n_tokens=1))],
                                then=RedisConnectionError("Connection refused"))
    with client.websocket_connect(f"/v1/jobs/{JOB}/stream") as ws:
        assert ws.receive_json()["type"] == "token"
        event = ws.receive_json()
        with pytest.raises(WebSocketDisconnect) as closed:
            ws.receive_json()
    assert event["type"] == "error" and event["seq"] == 0
    assert (event["error"]["type"], event["error"]["code"]) == ("service_unavailable", "redis_unavailable")
    assert closed.value.code == 1011


def test_websocket_job_error_event_passes_as_written_and_closes_normally(ws_app) -> None:
    app, client = ws_app
    failed = ErrorEvent(seq=1, error=ErrorInfo(type="timeout_error", code="deadline_exceeded", message="late"))
    app.state.hub = ScriptedHub([frame(failed)])
    with client.websocket_connect(f"/v1/jobs/{JOB}/stream") as ws:
        event = ws.receive_json()
        with pytest.raises(WebSocketDisconnect) as closed:
            ws.receive_json()
    assert event == {"type": "error", "seq": 1, "error": {
        "type": "timeout_error", "code": "deadline_exceeded", "message": "late", "param": None}}
    assert closed.value.code == 1000


def test_websocket_unknown_job_and_bad_after(ws_app) -> None:
    app, client = ws_app
    app.state.hub = ScriptedHub()
    unknown = "job-" + "0" * 32
    for url, type_, code, close in ((f"/v1/jobs/{unknown}/stream", "not_found_error", "job_not_found", 4404),
                                    ("/v1/jobs/job-1/stream", "not_found_error", "job_not_found", 4404),
                                    (f"/v1/jobs/{JOB}/stream?after=x", "invalid_request_error", "invalid_value",
                                     1008)):
        with client.websocket_connect(url) as ws:
            event = ws.receive_json()
            with pytest.raises(WebSocketDisconnect) as closed:
                ws.receive_json()
        assert (event["error"]["type"], event["error"]["code"], closed.value.code) == (type_, code, close)


async def test_failed_stream_ends_with_one_error_payload_in_the_http_shape() -> None:
    failed = ErrorEvent(seq=2, error=ErrorInfo(type="service_unavailable", code="worker_lost", message="lost"))
    hub = ScriptedHub([frame(TokenEvent(seq=1, text="a", n_tokens=1)), frame(failed)])
    req = ChatCompletionRequest(messages=[{"role": "user", "content": "hi"}], stream=True)
    payloads = [p async for p in oc.chat_chunks(hub, "job-1", "m", req)]  # type: ignore[arg-type]
    assert [p.last for p in payloads] == [False, True]
    assert json.loads(payloads[-1].data) == body(errors.to_response(error_from(failed.error)))
    assert json.loads(payloads[-1].data)["error"]["code"] == "worker_lost"


async def test_finished_stream_ends_with_done() -> None:
    from inferq.shared.schemas import DoneEvent

    hub = ScriptedHub([frame(TokenEvent(seq=1, text="a", n_tokens=1)), frame(DoneEvent(seq=2))])
    req = ChatCompletionRequest(messages=[{"role": "user", "content": "hi"}], stream=True)
    payloads = [p async for p in oc.chat_chunks(hub, "job-1", "m", req)]  # type: ignore[arg-type]
    assert payloads[-1] == oc.DONE and [p.last for p in payloads[:-1]] == [False] * (len(payloads) - 1)


async def test_non_streamed_completion_of_a_timed_out_job_is_504() -> None:
    failed = ErrorEvent(seq=1, error=ErrorInfo(type="timeout_error", code="deadline_exceeded", message="late"))
    with pytest.raises(InferqError) as e:
        await oc.collect(ScriptedHub([frame(failed)]), "job-1", 1)  # type: ignore[arg-type]
    r = errors.to_response(e.value)
    assert r.status_code == 504 and body(r)["error"]["code"] == "deadline_exceeded"


def test_one_413_body_whether_the_length_is_declared_or_not() -> None:
    app = FastAPI()
    errors.install(app)

    @app.post("/echo")
    async def echo(payload: dict) -> dict:
        return payload

    app.add_middleware(BodyLimit, max_bytes=100)
    big = json.dumps({"x": "y" * 500}).encode()
    with TestClient(app) as client:
        declared = client.post("/echo", content=big, headers={"content-type": "application/json"})
        streamed = client.post("/echo", content=iter([big[:50], big[50:]]),
                               headers={"content-type": "application/json"})
    assert declared.status_code == streamed.status_code == 413
    assert declared.headers["connection"] == streamed.headers["connection"] == "close"
    assert declared.json() == streamed.json() == {"error": {
        "message": "request body is larger than 100 bytes", "type": "invalid_request_error", "param": None,
        "code": "body_too_large"}}


def test_the_api_schema_documents_400_not_422() -> None:
    from inferq.api.app import create_app
    from inferq.shared.settings import Settings

    schema = create_app(Settings()).openapi()
    submit = schema["paths"]["/v1/jobs"]["post"]["responses"]
    assert "422" not in json.dumps(schema["paths"]) and "HTTPValidationError" not in schema["components"]["schemas"]
    assert submit["400"]["content"]["application/json"]["schema"] == {"$ref": "#/components/schemas/ErrorBody"}
    assert schema["components"]["schemas"]["ErrorInfo"]["properties"]["type"]["enum"] == list(STATUSES)


def test_unknown_route_and_method_have_the_same_body() -> None:
    app = FastAPI()
    errors.install(app)

    @app.get("/thing")
    async def thing() -> dict:
        return {}

    with TestClient(app) as client:
        missing, wrong = client.get("/nope"), client.delete("/thing")
    assert missing.status_code == 404 and (missing.json()["error"]["type"], missing.json()["error"]["code"]) == (
        "not_found_error", "route_not_found")
    assert wrong.status_code == 405 and wrong.headers["allow"] == "GET"
    assert (wrong.json()["error"]["type"], wrong.json()["error"]["code"]) == ("invalid_request_error",
                                                                              "method_not_allowed")


async def test_a_restart_before_anything_was_sent_is_not_an_error() -> None:
    """The job's worker was lost before its first token reached the client: the stream simply
    goes on with the next attempt (a restart after text was sent still ends it)."""
    from inferq.api.openai.params import CompletionRequest
    from inferq.shared.schemas import DoneEvent, RestartEvent

    events = [frame(RestartEvent(seq=1, attempt=1, reason="worker_lost")),
              frame(TokenEvent(seq=2, text="a", n_tokens=1)), frame(DoneEvent(seq=3))]
    chat = ChatCompletionRequest(messages=[{"role": "user", "content": "hi"}], stream=True)
    payloads = [p async for p in oc.chat_chunks(ScriptedHub(events), "job-1", "m", chat)]  # type: ignore[arg-type]
    assert payloads[-1] == oc.DONE and all(p.error is None for p in payloads)
    assert json.loads(payloads[0].data)["choices"][0]["delta"] == {"role": "assistant", "content": "a"}
    text = CompletionRequest(prompt="hi", stream=True)
    payloads = [p async for p in oc.completion_chunks(ScriptedHub(events), ["job-1"], "m", text)]  # type: ignore[arg-type]
    assert payloads[-1] == oc.DONE and all(p.error is None for p in payloads)
    late = [frame(TokenEvent(seq=1, text="a", n_tokens=1)), frame(RestartEvent(seq=2, attempt=1, reason="worker_lost"))]
    payloads = [p async for p in oc.chat_chunks(ScriptedHub(late), "job-1", "m", chat)]  # type: ignore[arg-type]
    assert payloads[-1].error is not None and payloads[-1].error.code == "restarted"
