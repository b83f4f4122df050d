"""API keys, job ownership, per-key limits and Idempotency-Key, against a second real gateway that
has keys configured and shares the session's Redis and workers."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import signal
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import openai
import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from tests.conftest import ADAPTER_SEEDS, Service, Stack, free_port, http_ok, inferq_env, spawn
from tests.helpers import LONG_JOB, fresh_rate_window, submit, wait_status
from tests.wait import eventually

pytestmark = pytest.mark.integration
KEYS = ["sk-alice", "sk-bob", "sk-rate", "sk-conc", "sk-idem"]
FILE_KEY = "sk-from-file-carol"
RATE, CONCURRENT = 8, 2
LONG = {"prompt": "def long():", "max_tokens": LONG_JOB, "ignore_eos": True}


@dataclass
class Secure:
    base: str
    ws: str
    gateway: Service

    def http(self, key: str | None = None) -> httpx.Client:
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        return httpx.Client(base_url=self.base, timeout=60, headers=headers)


@pytest.fixture(scope="module")
def secure(stack: Stack, logdir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Secure]:
    keys_file = tmp_path_factory.mktemp("keys") / "keys.txt"
    keys_file.write_text(f"# inferq keys\n\n{FILE_KEY}  carol\n")
    port = free_port()
    env = inferq_env(stack.redis.url, INFERQ_API_KEYS=" , ".join(KEYS), INFERQ_API_KEYS_FILE=str(keys_file),
                     INFERQ_RATE_LIMIT_PER_MINUTE=str(RATE),
                     INFERQ_MAX_CONCURRENT_JOBS_PER_KEY=str(CONCURRENT))
    cmd = [sys.executable, "-m", "inferq.cli", "api", "--port", str(port)]
    gw = spawn("gateway-secure", cmd, env, logdir)
    sec = Secure(f"http://127.0.0.1:{port}", f"ws://127.0.0.1:{port}", gw)
    try:
        eventually(lambda: http_ok(f"{sec.base}/readyz"), 60, "the gateway with API keys", procs=[gw], interval=0.2)
        yield sec
    finally:
        gw.stop()


def key_id(key: str) -> str:
    return "key-" + hashlib.sha256(key.encode()).hexdigest()[:16]


def assert_401(r: httpx.Response) -> None:
    assert r.status_code == 401, (r.request.url, r.text)
    assert r.json()["error"]["type"] == "authentication_error"
    assert r.headers["www-authenticate"] == "Bearer"


ENDPOINTS = [("GET", "/v1/models", None), ("GET", "/v1/models/inferq-tiny", None),
             ("GET", "/v1/workers", None), ("POST", "/v1/jobs", {"prompt": "x"}), ("GET", "/v1/jobs/job-x", None),
             ("DELETE", "/v1/jobs/job-x", None), ("GET", "/openapi.json", None),
             ("POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}]}),
             ("POST", "/v1/completions", {"prompt": "x"})]


@pytest.mark.parametrize("auth", [None, "Bearer sk-wrong", "Basic c2stYWxpY2U6", "Bearer", "sk-alice",
                                  "Bearer sk-alicex"])
def test_every_endpoint_needs_a_valid_key(secure, auth) -> None:
    headers = {"Authorization": auth} if auth else {}
    with httpx.Client(base_url=secure.base, timeout=30, headers=headers) as http:
        for method, path, body in ENDPOINTS:
            assert_401(http.request(method, path, json=body))
        assert http.get("/healthz").status_code == 200 and http.get("/readyz").status_code == 200
        assert http.get("/docs").status_code == 404


def test_valid_keys_from_env_and_file(secure, stack) -> None:
    for key in (KEYS[0], FILE_KEY):
        with secure.http(key) as http:
            assert [m["id"] for m in http.get("/v1/models").json()["data"]] == ["inferq-tiny", *ADAPTER_SEEDS]
            assert http.get("/openapi.json").json()["info"]["title"] == "inferq"
    with secure.http("sk-alice") as http:
        view = wait_status(http, submit(http, prompt="owned by alice", max_tokens=4))
    assert view["status"] == "succeeded"
    r = stack.redis.client()
    assert json.loads(r.hget(f"inferq:job:{view['id']}", "owner")) == key_id("sk-alice")
    for k in r.scan_iter("inferq:*"):  # the raw key is nowhere in Redis
        if r.type(k) == "hash":
            assert "sk-alice" not in json.dumps(r.hgetall(k)), k


def test_another_keys_job_is_exactly_like_an_unknown_one(secure, stack) -> None:
    with secure.http("sk-alice") as alice, secure.http("sk-bob") as bob, stack.http() as open_gw:
        # first: the open gateway's first request can take seconds, longer than the long job itself
        theirs = submit(open_gw, prompt="no owner", max_tokens=2)  # made without auth: nobody's here
        job_id = submit(alice, **LONG)
        for other_id, client in ((job_id, bob), (theirs, alice)):
            for method in ("GET", "DELETE"):
                got = client.request(method, f"/v1/jobs/{other_id}")
                unknown = client.request(method, "/v1/jobs/job-0")
                assert got.status_code == unknown.status_code == 404
                assert got.json() == json.loads(unknown.text.replace("job-0", other_id))
        # bob did not cancel it
        assert alice.get(f"/v1/jobs/{job_id}").json()["status"] in ("queued", "running")
        assert alice.delete(f"/v1/jobs/{job_id}").status_code == 202
        assert wait_status(alice, job_id)["status"] == "cancelled"


async def test_a_job_whose_record_expired_is_not_found_for_anybody(secure, stack) -> None:
    """The log may outlive the record by moments: nobody may read it then, its owner included."""
    with secure.http("sk-alice") as alice, secure.http("sk-bob") as bob:
        job_id = submit(alice, prompt="soon gone", max_tokens=6, ignore_eos=True)
        assert wait_status(alice, job_id)["status"] == "succeeded"
        r = stack.redis.client()
        assert r.xlen(f"inferq:job:{job_id}:log") > 1
        r.delete(f"inferq:job:{job_id}")  # what expiry does
        unknown = "job-" + "f" * 32
        for client in (alice, bob):
            for method in ("GET", "DELETE"):
                got, none = client.request(method, f"/v1/jobs/{job_id}"), client.request(method, f"/v1/jobs/{unknown}")
                assert got.status_code == none.status_code == 404
                assert got.json() == json.loads(none.text.replace(unknown, job_id))
    for key in ("sk-alice", "sk-bob"):
        for after in ("", "?after=1"):
            events, code = await ws_read(f"{secure.ws}/v1/jobs/{job_id}/stream{after}", key)
            none, code2 = await ws_read(f"{secure.ws}/v1/jobs/{unknown}/stream{after}", key)
            assert code == code2 == 4404
            assert events == json.loads(json.dumps(none).replace(unknown, job_id))
    assert r.xlen(f"inferq:job:{job_id}:log") > 1  # still there, and never replayed


async def ws_read(url: str, key: str | None = None,
                  send: dict | None = None) -> tuple[list[dict], int | None]:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    out: list[dict] = []
    async with connect(url, additional_headers=headers, open_timeout=10, close_timeout=5) as ws:
        try:
            if send is not None:
                await ws.send(json.dumps(send))
        except ConnectionClosed:  # refused before it read anything: the error event is still buffered
            pass
        try:
            async for msg in ws:
                out.append(json.loads(msg))
        except ConnectionClosed:
            pass
    return out, ws.close_code


async def test_websockets_need_a_key_from_header_or_query(secure) -> None:
    body = {"prompt": "ws", "max_tokens": 3, "ignore_eos": True}
    for url, key in ((f"{secure.ws}/v1/generate", None), (f"{secure.ws}/v1/generate?api_key=sk-nope", None),
                     (f"{secure.ws}/v1/jobs/job-x/stream", "sk-wrong")):
        events, code = await ws_read(url, key, send=body if "generate" in url else None)
        assert code == 4401 and [e["type"] for e in events] == ["error"]
        assert events[0]["error"]["type"] == "authentication_error"
    by_header, code = await ws_read(f"{secure.ws}/v1/generate", "sk-alice", send=body)
    assert code == 1000 and by_header[0]["type"] == "accepted" and by_header[-1]["type"] == "done"
    by_query, code = await ws_read(f"{secure.ws}/v1/generate?api_key=sk-alice", send=body)
    assert code == 1000 and by_query[-1]["type"] == "done"
    job_id = by_header[0]["id"]
    mine, _ = await ws_read(f"{secure.ws}/v1/jobs/{job_id}/stream", "sk-alice")
    assert mine == by_header[1:]
    foreign, code = await ws_read(f"{secure.ws}/v1/jobs/{job_id}/stream?api_key=sk-bob")
    for other in ("job-0", "job-" + "0" * 32):  # malformed and well-formed unknown ids alike
        unknown, code2 = await ws_read(f"{secure.ws}/v1/jobs/{other}/stream", "sk-bob")
        assert code == code2 == 4404 and foreign == json.loads(json.dumps(unknown).replace(other, job_id))


def test_openai_sdk_with_keys(secure) -> None:
    ok = openai.OpenAI(base_url=f"{secure.base}/v1", api_key="sk-alice", max_retries=0)
    r = ok.chat.completions.create(model="inferq-tiny", messages=[{"role": "user", "content": "hi"}],
                                   max_tokens=3)
    assert r.choices[0].message.content is not None
    with secure.http("sk-bob") as bob:
        assert bob.get(f"/v1/jobs/{r.id}").status_code == 404
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=f"{secure.base}/v1", api_key="sk-nope", max_retries=0).models.list()


def test_rate_limit_per_key(secure) -> None:
    with secure.http("sk-rate") as http, secure.http("sk-bob") as bob:
        for _ in range(RATE):  # one at a time, so that the concurrency limit is not what stops us
            assert wait_status(http, submit(http, prompt="r", max_tokens=1))["status"] == "succeeded"
        r = http.post("/v1/jobs", json={"prompt": "r", "max_tokens": 1})
        assert r.status_code == 429 and r.json()["error"]["type"] == "rate_limit_error", r.text
        assert r.json()["error"]["code"] == "rate_limit_exceeded"
        assert 1 <= int(r.headers["retry-after"]) <= 60
        oai = http.post("/v1/completions", json={"prompt": "r", "max_tokens": 1})
        assert oai.status_code == 429 and "retry-after" in oai.headers
        assert bob.post("/v1/jobs", json={"prompt": "r", "max_tokens": 1}).status_code == 202  # per key


async def test_concurrency_limit_counts_unfinished_jobs(secure, stack) -> None:
    # frozen workers: the jobs stay unfinished for as long as the test needs (a running one
    # could end between two requests on a busy machine and free its slot early)
    for w in stack.workers.values():
        os.kill(w.proc.pid, signal.SIGSTOP)
    with secure.http("sk-conc") as http:
        ids = [submit(http, **LONG) for _ in range(CONCURRENT)]
        try:
            r = http.post("/v1/jobs", json=LONG)
            assert r.status_code == 429 and r.json()["error"]["code"] == "too_many_jobs", r.text
            assert r.headers["retry-after"] == "1"
            events, code = await ws_read(f"{secure.ws}/v1/generate", "sk-conc", send=LONG)
            assert events[0]["type"] == "error" and "unfinished" in events[0]["error"]["message"]
            assert events[0]["error"] == {**r.json()["error"], "message": events[0]["error"]["message"]}
            assert code == 4429
            http.delete(f"/v1/jobs/{ids[-1]}")  # a slot frees as soon as a job ends
            assert wait_status(http, ids.pop())["status"] == "cancelled"
            ids.append(submit(http, **LONG))
        finally:
            for job_id in ids:
                http.delete(f"/v1/jobs/{job_id}")
            for w in stack.workers.values():
                os.kill(w.proc.pid, signal.SIGCONT)


def test_idempotency_key_returns_the_same_job(secure, stack) -> None:
    body = {"prompt": "idempotent", "max_tokens": 4, "temperature": 1.0}
    with secure.http("sk-idem") as http, secure.http("sk-bob") as bob:
        first = http.post("/v1/jobs", json=body, headers={"Idempotency-Key": "k1"})
        again = http.post("/v1/jobs", json=dict(reversed(body.items())), headers={"Idempotency-Key": "k1"})
        assert first.status_code == again.status_code == 202
        assert again.json()["id"] == first.json()["id"] and again.headers["idempotent-replayed"] == "true"
        other = http.post("/v1/jobs", json={**body, "max_tokens": 5}, headers={"Idempotency-Key": "k1"})
        assert other.status_code == 400 and other.json()["error"]["code"] == "idempotency_key_reused"
        bobs = bob.post("/v1/jobs", json=body, headers={"Idempotency-Key": "k1"})  # keys are per API key
        assert bobs.status_code == 202 and bobs.json()["id"] != first.json()["id"]
        bad = http.post("/v1/jobs", json=body, headers={"Idempotency-Key": "x" * 300})
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "Idempotency-Key"
    r = stack.redis.client()
    mine = [k for k in r.scan_iter("inferq:job:*") if not k.endswith((":log", ":chan"))
            and r.hget(k, "owner") == json.dumps(key_id("sk-idem")) and "idempotent" in r.hget(k, "request")]
    assert len(mine) == 1


async def test_concurrent_repeats_create_one_job(secure) -> None:
    headers = {"Authorization": "Bearer sk-idem", "Idempotency-Key": "race"}
    async with httpx.AsyncClient(base_url=secure.base, timeout=60, headers=headers) as http:
        rs = await asyncio.gather(*(http.post("/v1/jobs", json={"prompt": "race", "max_tokens": 2})
                                    for _ in range(12)))
    assert {r.status_code for r in rs} == {202}
    assert len({r.json()["id"] for r in rs}) == 1
    assert sum(r.headers.get("idempotent-replayed") == "true" for r in rs) == 11
    with secure.http("sk-idem") as http:
        assert wait_status(http, rs[0].json()["id"])["status"] == "succeeded"


def test_openai_repeat_returns_the_same_completion(secure) -> None:
    client = openai.OpenAI(base_url=f"{secure.base}/v1", api_key="sk-idem", max_retries=0)
    kw = {"model": "inferq-tiny", "messages": [{"role": "user", "content": "tell me"}], "max_tokens": 12,
              "temperature": 1.0, "extra_body": {"ignore_eos": True}}
    a = client.chat.completions.create(**kw, extra_headers={"Idempotency-Key": "chat-1"})
    b = client.chat.completions.create(**kw, extra_headers={"Idempotency-Key": "chat-1"})
    assert a.id == b.id and a.choices[0].message.content == b.choices[0].message.content
    c = client.chat.completions.create(**kw, extra_headers={"Idempotency-Key": "chat-2"})
    assert c.id != a.id
    body = {"prompt": ["p1", "p2"], "max_tokens": 6, "stream": True, "ignore_eos": True}
    with secure.http("sk-idem") as http:
        seen = []
        for _ in range(2):
            r = http.post("/v1/completions", json=body, headers={"Idempotency-Key": "cmpl-stream"})
            assert r.status_code == 200
            chunks = [json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: {")]
            texts: dict[int, str] = {}
            for ch in chunks:
                for c in ch["choices"]:
                    texts[c["index"]] = texts.get(c["index"], "") + c["text"]
            seen.append((r.headers["x-inferq-job-id"], chunks[0]["id"], texts))
        assert seen[0] == seen[1] and sorted(seen[0][2]) == [0, 1] and all(seen[0][2].values())


def test_a_streamed_request_retried_without_streaming_answers_from_the_same_job(secure) -> None:
    """An Idempotency-Key names the request, not how its answer is delivered: the same chat request
    streamed, then again without ``stream``, is one job, and the second gets its whole answer."""
    body = {"messages": [{"role": "user", "content": "once"}], "max_tokens": 6, "ignore_eos": True,
            "temperature": 1.0}
    headers = {"Idempotency-Key": "stream-then-not"}
    with secure.http("sk-idem") as http:
        streamed = http.post("/v1/chat/completions", json={**body, "stream": True,
                                                           "stream_options": {"include_usage": True}}, headers=headers)
        assert streamed.status_code == 200 and streamed.text.rstrip().endswith("data: [DONE]")
        text = "".join(c["delta"].get("content") or "" for line in streamed.text.splitlines()
                       if line.startswith("data: {") for c in json.loads(line[6:])["choices"])
        whole = http.post("/v1/chat/completions", json=body, headers=headers)
        assert whole.status_code == 200, whole.text
        assert whole.headers["idempotent-replayed"] == "true"
        assert whole.json()["id"] == streamed.headers["x-inferq-job-id"]
        assert whole.json()["choices"][0]["message"]["content"] == text
        other = http.post("/v1/chat/completions", json={**body, "max_tokens": 7}, headers=headers)
        assert other.status_code == 400 and other.json()["error"]["code"] == "idempotency_key_reused"


def test_without_keys_limits_count_per_client_ip(stack, logdir) -> None:
    """Auth off: no key needed, and the limits apply to the client's address instead."""
    port = free_port()
    env = inferq_env(stack.redis.url, INFERQ_RATE_LIMIT_PER_MINUTE="2")
    gw = spawn("gateway-open-limited", [sys.executable, "-m", "inferq.cli", "api", "--port", str(port)],
               env, logdir)
    try:
        base = f"http://127.0.0.1:{port}"
        eventually(lambda: http_ok(f"{base}/readyz"), 60, "the open gateway with limits", procs=[gw], interval=0.2)
        fresh_rate_window(stack.redis.client())
        with httpx.Client(base_url=base, timeout=60) as http:
            codes = [http.post("/v1/jobs", json={"prompt": "ip", "max_tokens": 1}).status_code for _ in range(3)]
            assert codes == [202, 202, 429]
            assert http.get("/v1/models").status_code == 200  # reading is not limited
    finally:
        gw.stop()
