"""Bad input: a clear 4xx naming the field, and nothing that hurts a worker or another job."""

from __future__ import annotations

import json

import pytest
from websockets.asyncio.client import connect

from inferq.worker.engine.models import TINY_MAX_LEN
from tests.helpers import submit, wait_status, ws_events

pytestmark = pytest.mark.integration


@pytest.mark.parametrize(("body", "param"), [
    ({"prompt": "x", "max_tokens": 0}, "max_tokens"),
    ({"prompt": "x", "temperature": 3}, "temperature"),
    ({"prompt": "x", "top_p": 0}, "top_p"),
    ({"prompt": "x", "top_k": -5}, "top_k"),
    ({"prompt": "x", "stop": [""]}, "stop"),
    ({"prompt": "x", "seed": 2**63}, "seed"),  # any 64-bit signed seed is taken, as vLLM takes it
    ({"prompt": "x", "presence_penalty": 9}, "presence_penalty"),
    ({"prompt": "x", "frequency_penalty": -9}, "frequency_penalty"),
    ({"prompt": "x", "ignore_eos": "maybe"}, "ignore_eos"),
    ({"prompt": ""}, "prompt"),
    ({"prompt": 5}, "prompt"),
    ({"messages": [{"role": "wizard", "content": "x"}]}, "messages.0.role"),
    ({"messages": []}, "messages"),
    ({"prompt": "x", "unknown_field": 1}, "unknown_field"),
])
def test_invalid_field_is_400_naming_it(stack, body, param) -> None:
    with stack.http() as http:
        r = http.post("/v1/jobs", json=body)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert (err["type"], err["code"]) == ("invalid_request_error", "invalid_value"), err
    assert err["param"] == param and param.split(".")[0] in err["message"], err


@pytest.mark.parametrize(("body", "param"), [
    ({"prompt": "x", "max_tokens": 10**7}, "max_tokens"),
    ({"prompt": "x", "stop": ["s"] * 50}, "stop"),
    ({"prompt": "x", "stop": ["s" * 300]}, "stop"),
    ({"prompt": "x", "n": 1000}, "n"),
    ({"prompt": "x" * 200_001}, "prompt"),
    ({"prompt": "x", "timeout": 10**6}, "timeout"),
])
def test_over_a_configured_limit_is_400_naming_it(stack, body, param) -> None:
    with stack.http() as http:
        r = http.post("/v1/jobs", json=body)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and err["message"].startswith(f"{param}: "), err


@pytest.mark.parametrize(("body", "param"), [
    ({"prompt": "x", "stop_token_ids": [1, 4096]}, "stop_token_ids"),
    ({"prompt": "x", "logit_bias": {"4096": 5}}, "logit_bias"),
    ({"prompt_token_ids": [1, 4096]}, "prompt"),
])
def test_a_token_id_out_of_the_models_vocabulary_is_400_naming_the_field(stack, body, param) -> None:
    """The built-in model has 4,096 tokens: an id past them is refused before queueing, not a job
    that fails once it runs."""
    with stack.http() as http:
        r = http.post("/v1/jobs", json=body)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and "token id 4096 is out of vocabulary" in err["message"], err


def test_neither_or_both_inputs_is_400(stack) -> None:
    with stack.http() as http:
        for body in ({"max_tokens": 3}, {"prompt": "x", "messages": [{"role": "user", "content": "y"}]}):
            r = http.post("/v1/jobs", json=body)
            assert r.status_code == 400 and "prompt" in r.json()["error"]["message"]


def test_malformed_json_is_400(stack) -> None:
    with stack.http() as http:
        r = http.post("/v1/jobs", content=b"{not json", headers={"content-type": "application/json"})
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"


def test_oversized_body_is_413(stack) -> None:
    with stack.http() as http:
        r = http.post("/v1/jobs", json={"prompt": "x" * (2 << 20)})
        # its body unread, the connection closes, and says so: the client's next request goes on a
        # new one (else it could be sent on the closing socket and fail with a ReadError)
        assert r.headers["connection"] == "close"
        assert http.post("/v1/jobs", json={"prompt": "x", "max_tokens": 10**9}).status_code == 400
    assert r.status_code == 413 and "bytes" in r.json()["error"]["message"]
    assert (r.json()["error"]["type"], r.json()["error"]["code"]) == ("invalid_request_error", "body_too_large")


def test_prompt_plus_max_tokens_over_context_is_400_before_queueing(stack) -> None:
    with stack.http() as http:
        r = http.post("/v1/jobs", json={"prompt": "word " * (TINY_MAX_LEN - 500), "max_tokens": 1000})
        assert r.status_code == 400, r.text
        err = r.json()["error"]
        assert err["code"] == "context_length_exceeded" and str(TINY_MAX_LEN) in err["message"]
        r = http.post("/v1/jobs", json={"prompt": "hello world", "max_tokens": 2 * TINY_MAX_LEN})
        assert r.status_code == 400 and r.json()["error"]["param"] == "max_tokens"
        n = http.post("/tokenize", json={"prompt": "hello world"}).json()["count"]  # max_tokens alone is over
        assert f"has {n} prompt tokens and asks for {2 * TINY_MAX_LEN} more" in r.json()["error"]["message"], r.text


def test_chat_over_context_is_400_before_queueing_where_the_gateway_renders_it(stack) -> None:
    """The gateway renders the chat template as the worker does (the worker's probe agrees), so it
    counts chat prompts too."""
    with stack.http() as http:
        r = http.post("/v1/jobs", json={"messages": [{"role": "user", "content": "word " * TINY_MAX_LEN}],
                                        "max_tokens": 500})
        assert r.status_code == 400, r.text
        err = r.json()["error"]
        assert err["code"] == "context_length_exceeded" and str(TINY_MAX_LEN) in err["message"]
        assert err["param"] == "messages" and "prompt alone" in err["message"]  # no max_tokens would fit it
        r = http.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "word " * 900}],
                                                     "max_tokens": TINY_MAX_LEN - 100})
        assert r.status_code == 400 and r.json()["error"]["param"] == "max_tokens", r.text


def test_chat_over_context_fails_the_job_with_the_reason_where_only_the_worker_counts(stack) -> None:
    """With tools only the worker renders the template: the job ends failed, the worker lives on."""
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    with stack.http() as http:
        job_id = submit(http, messages=[{"role": "user", "content": "word " * TINY_MAX_LEN}], tools=tools,
                        max_tokens=500)
        view = wait_status(http, job_id)
        assert view["status"] == "failed"
        assert (view["error"]["type"], view["error"]["code"]) == ("invalid_request_error", "context_length_exceeded")
        assert str(TINY_MAX_LEN) in view["error"]["message"] and view["error"]["param"] == "messages"
        ok = wait_status(http, submit(http, prompt="still alive", max_tokens=4))
        assert ok["status"] == "succeeded"


def test_unknown_job_and_model_are_404(stack) -> None:
    with stack.http() as http:
        assert http.get("/v1/jobs/job-nope").status_code == 404
        assert http.delete("/v1/jobs/job-nope").status_code == 404
        r = http.post("/v1/jobs", json={"prompt": "x", "model": "no-such-model"})
        assert r.status_code == 404 and r.json()["error"]["param"] == "model"


async def test_ws_unknown_job_gets_error_event(stack) -> None:
    events = await ws_events(f"{stack.ws}/v1/jobs/job-nope/stream")
    assert events == [{"type": "error", "seq": 0, "error": {
        "type": "not_found_error", "code": "job_not_found", "message": "job job-nope not found",
        "param": "id"}}]


async def test_an_id_that_is_not_a_job_id_is_an_unknown_job(stack) -> None:
    """``{id}:log`` used to reach the log's stream key: a 500 (WRONGTYPE) and a silent close."""
    with stack.http() as http:
        job_id = submit(http, prompt="real", max_tokens=2)
        assert wait_status(http, job_id)["status"] == "succeeded"
        unknown = "job-" + "0" * 32
        for bad in (f"{job_id}:log", f"{job_id}:chan", job_id.upper(), job_id + "0"):
            for method in ("GET", "DELETE"):
                got, none = http.request(method, f"/v1/jobs/{bad}"), http.request(method, f"/v1/jobs/{unknown}")
                assert got.status_code == none.status_code == 404, got.text
                assert got.json() == json.loads(none.text.replace(unknown, bad))
            async with connect(f"{stack.ws}/v1/jobs/{bad}/stream") as ws:
                event = json.loads(await ws.recv())
                await ws.wait_closed()
            assert ws.close_code == 4404 and event["error"]["code"] == "job_not_found"
        assert http.get(f"/v1/jobs/{job_id}").json()["status"] == "succeeded"  # untouched


@pytest.mark.parametrize("after", ["99999999999999999999999", str(2**53 + 1), "-1", "1e3", "%C2%B2"])
async def test_ws_after_out_of_bounds_is_an_error_event_and_1008(stack, after) -> None:
    with stack.http() as http:
        job_id = submit(http, prompt="after", max_tokens=2)
    async with connect(f"{stack.ws}/v1/jobs/{job_id}/stream?after={after}") as ws:
        event = json.loads(await ws.recv())
        await ws.wait_closed()
    assert ws.close_code == 1008
    assert (event["error"]["type"], event["error"]["param"]) == ("invalid_request_error", "after")


def test_a_deeply_nested_json_schema_is_400_before_queueing(stack) -> None:
    """~230 levels used to be queued and then dropped by every worker (the job stayed queued);
    300 was a 500."""
    for levels in (40, 115, 150, 300):
        schema = '{"type":"object","properties":{"a":' * levels + '{"type":"string"}' + "}}" * levels
        with stack.http() as http:
            r = http.post("/v1/jobs", content='{"prompt": "x", "json_schema": %s}' % schema,
                          headers={"content-type": "application/json", "Idempotency-Key": f"deep-{levels}"})
            assert r.status_code == 400 and r.json()["error"]["param"] == "json_schema", r.text
            chat = ('{"messages": [{"role": "user", "content": "x"}], "response_format": {"type": "json_schema", '
                    '"json_schema": {"name": "deep", "schema": %s}}}' % schema)
            r = http.post("/v1/chat/completions", content=chat, headers={"content-type": "application/json"})
            assert r.status_code == 400, r.text
            assert r.json()["error"]["param"] == "response_format.json_schema.schema"
    with stack.http() as http:  # a schema within the limits still runs
        job_id = submit(http, prompt="Answer:", max_tokens=8,
                        json_schema={"type": "object", "properties": {"a": {"type": "integer"}}})
        assert wait_status(http, job_id)["status"] in ("succeeded", "failed")


@pytest.mark.parametrize("payload", ["{broken", json.dumps({"prompt": "x", "max_tokens": -1}), "[]", ""])
async def test_ws_malformed_message_gets_error_and_clean_close(stack, payload) -> None:
    async with connect(f"{stack.ws}/v1/generate") as ws:
        await ws.send(payload)
        msg = json.loads(await ws.recv())
        await ws.wait_closed()
    assert msg["type"] == "error" and (msg["error"]["type"], msg["error"]["code"]) == (
        "invalid_request_error", "invalid_value")
    assert ws.close_code == 1008


async def test_ws_bad_after_is_rejected(stack) -> None:
    events = await ws_events(f"{stack.ws}/v1/jobs/job-x/stream?after=-3")
    assert events[0]["type"] == "error" and "after" in events[0]["error"]["message"]


def test_health_and_readiness(stack) -> None:
    with stack.http() as http:
        assert http.get("/healthz").json() == {"status": "ok"}
        ready = http.get("/readyz")
        assert ready.status_code == 200 and ready.json()["workers"] == 2
