"""Clients that hold the gateway's connections, oversize its request heads, upload without a key or
put keys in query strings, against a real gateway process with keys and short read timeouts
(docs/security.md, "Connections"). It needs Redis, no worker."""

from __future__ import annotations

import json
import socket
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from websockets.asyncio.client import connect

from tests.conftest import RedisServer, Service, free_port, inferq_env, spawn
from tests.wait import eventually

pytestmark = pytest.mark.integration
KEY_A, KEY_B = "sk-slow-a-7f3c9e", "sk-slow-b-51d2aa"
HEADER_TIMEOUT_S = BODY_TIMEOUT_S = 1  # short here: the default is 10 and 30 s
#: How long a test waits for what the gateway must do by itself, at most (not a timing assertion:
#: a busy machine may take longer than the timeouts, never this long)
PATIENCE_S = 60


@dataclass
class Gateway:
    port: int
    proc: Service

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def sock(self, data: bytes = b"") -> socket.socket:
        s = socket.create_connection(("127.0.0.1", self.port), timeout=PATIENCE_S)
        if data:
            s.sendall(data)
        return s


@pytest.fixture(scope="module")
def gateway(redis_server: RedisServer, logdir: Path) -> Iterator[Gateway]:
    port = free_port()
    env = inferq_env(redis_server.url, INFERQ_API_KEYS=f"{KEY_A},{KEY_B}",
                     INFERQ_HTTP_HEADER_TIMEOUT_S=str(HEADER_TIMEOUT_S), INFERQ_HTTP_BODY_TIMEOUT_S=str(BODY_TIMEOUT_S))
    proc = spawn("gateway-slow-clients", [sys.executable, "-m", "inferq.cli", "api", "--port", str(port)], env, logdir)
    gw = Gateway(port, proc)
    try:
        eventually(lambda: httpx.get(f"{gw.base}/healthz", timeout=2).status_code == 200, 60, "the gateway",
                   procs=[proc], interval=0.2, ignore=(httpx.HTTPError,))
        yield gw
    finally:
        proc.stop()


def until_closed(s: socket.socket, deadline: float) -> tuple[bool, bytes]:
    """Read ``s`` until the server closes it or ``deadline`` (monotonic) passes: whether it was
    closed, and what came before."""
    got = b""
    while True:
        s.settimeout(max(0.01, deadline - time.monotonic()))
        try:
            chunk = s.recv(65536)
        except TimeoutError:
            return False, got
        except ConnectionResetError:
            return True, got
        if not chunk:
            return True, got
        got += chunk


def status_of(s: socket.socket) -> int | None:
    """The status of the answer on ``s`` (None: closed, or nothing within the patience)."""
    closed, got = False, b""
    deadline = time.monotonic() + PATIENCE_S
    while b"\r\n" not in got and not closed and time.monotonic() < deadline:
        s.settimeout(max(0.01, deadline - time.monotonic()))
        try:
            chunk = s.recv(65536)
        except TimeoutError:
            break
        except ConnectionResetError:
            closed = True
            continue
        got += chunk
        closed = not chunk
    line = got.split(b"\r\n", 1)[0].split()
    return int(line[1]) if len(line) > 1 and line[0].startswith(b"HTTP/") else None


def ws_upgrade(path: str, extra: str = "") -> bytes:
    return (f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            f"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n{extra}\r\n").encode()


HALF_SENT = [b"", b"G", b"GET /healthz HTTP/1.1\r\nHo", b"GET /v1/models HTTP/1.1\r\nHost: x\r\n",
             f"POST /v1/jobs HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY_A}\r\nX-Slow: aaaa".encode(),
             ws_upgrade("/v1/generate")[:-30]]


def test_half_sent_requests_are_dropped_while_other_clients_are_served(gateway: Gateway) -> None:
    held = [gateway.sock(HALF_SENT[i % len(HALF_SENT)]) for i in range(120)]
    try:
        with httpx.Client(base_url=gateway.base, timeout=PATIENCE_S) as other:  # served meanwhile
            assert other.get("/healthz").status_code == 200
            assert other.get("/v1/models", headers={"Authorization": f"Bearer {KEY_B}"}).status_code == 200
        deadline = time.monotonic() + PATIENCE_S
        ends = [until_closed(s, deadline) for s in held]
    finally:
        for s in held:
            s.close()
    open_ones = [HALF_SENT[i % len(HALF_SENT)] for i, (closed, _) in enumerate(ends) if not closed]
    assert not open_ones, f"{len(open_ones)} of {len(held)} half-sent connections still open, e.g. {open_ones[:3]}"
    for i, (_, got) in enumerate(ends):  # a connection that sent part of a request is told why
        sent = HALF_SENT[i % len(HALF_SENT)]
        assert got.startswith(b"HTTP/1.1 408 ") if sent else got == b"", (sent, got[:200])


def test_a_keep_alive_connection_that_stops_halfway_through_its_next_request_is_dropped(gateway: Gateway) -> None:
    with gateway.sock(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n") as s:
        assert status_of(s) == 200
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost")
        closed, got = until_closed(s, time.monotonic() + PATIENCE_S)
    assert closed, got


def test_a_body_that_stalls_gets_408_and_the_connection_is_closed(gateway: Gateway) -> None:
    head = (f"POST /v1/jobs HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY_A}\r\n"
            "Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n").encode()
    with gateway.sock(head + b'{"prompt": "') as s:
        assert status_of(s) == 408
        closed, _ = until_closed(s, time.monotonic() + PATIENCE_S)
    assert closed


@pytest.mark.parametrize(("what", "request_bytes", "status"), [
    ("URL of 10 kB", b"GET /v1/jobs/" + b"a" * 10_000 + b" HTTP/1.1\r\nHost: x\r\n\r\n", 414),
    ("WebSocket upgrade with a URL of 10 kB", ws_upgrade("/v1/generate?x=" + "a" * 10_000), 414),
    ("headers of 20 kB", b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 20_000 + b"\r\n\r\n", 431),
    ("WebSocket upgrade with headers of 20 kB", ws_upgrade("/v1/generate", "X-Big: " + "a" * 20_000 + "\r\n"), 431),
    ("WebSocket upgrade with a header line of 9 kB", ws_upgrade("/v1/generate", "X-Big: " + "a" * 9_000 + "\r\n"),
     431),
    ("WebSocket upgrade with 200 headers", ws_upgrade("/v1/generate", "".join(f"X-{i}: a\r\n" for i in range(200))),
     431),
])
def test_an_oversized_request_head_is_answered_not_dropped(gateway: Gateway, what: str, request_bytes: bytes,
                                                            status: int) -> None:
    with gateway.sock(request_bytes) as s:
        assert status_of(s) == status, what
    assert httpx.get(f"{gateway.base}/healthz", timeout=PATIENCE_S).status_code == 200


def test_heads_within_the_limits_are_served(gateway: Gateway) -> None:
    with httpx.Client(base_url=gateway.base, timeout=PATIENCE_S) as http:
        r = http.get("/v1/jobs/" + "a" * 7_000, headers={"Authorization": f"Bearer {KEY_A}", "X-Pad": "b" * 7_000})
    assert r.status_code == 404 and r.json()["error"]["code"] == "job_not_found"


@pytest.mark.parametrize("auth", [None, "Bearer sk-wrong"])
def test_an_upload_without_a_valid_key_is_refused_before_its_body_is_sent(gateway: Gateway, auth: str | None) -> None:
    size = 60 << 20
    head = ("POST /v1/files HTTP/1.1\r\nHost: x\r\nContent-Type: multipart/form-data; boundary=b0undary\r\n"
            f"Content-Length: {size}\r\n" + (f"Authorization: {auth}\r\n" if auth else "") + "\r\n").encode()
    part = b'--b0undary\r\nContent-Disposition: form-data; name="file"; filename="x.jsonl"\r\n\r\n'
    with gateway.sock(head + part + b"x" * (64 << 10)) as s:  # about 0.1 % of the body; the rest never goes
        assert status_of(s) == 401


@pytest.mark.parametrize("size", [200 << 10, 4 << 20])
def test_an_upload_without_a_key_hears_its_401_not_a_reset(gateway: Gateway, size: int) -> None:
    """A client that sends its whole upload before it reads (requests, curl; httpx reads the answer
    after a failed write, the others do not) gets the 401: the gateway answered at once and reads
    the rest of the body without parsing it, where closing at once reset the connection under the
    client's feet."""
    import requests

    r = requests.post(f"{gateway.base}/v1/files", data={"purpose": "batch"}, timeout=PATIENCE_S,
                      files={"file": ("x.jsonl", b"x" * size)})
    assert r.status_code == 401 and r.json()["error"]["code"] == "missing_api_key"
    head = ("POST /v1/files HTTP/1.1\r\nHost: x\r\nContent-Type: multipart/form-data; boundary=b0undary\r\n"
            f"Content-Length: {size}\r\n\r\n").encode()
    with gateway.sock(head + b"x" * size) as s:  # all of it, then the answer
        assert status_of(s) == 401


async def test_keys_in_query_strings_are_hidden_in_the_gateway_log(gateway: Gateway) -> None:
    """The gateway decodes query names: ``api%5Fkey`` and ``%61pi_key`` are ``api_key``."""
    async with connect(f"ws://127.0.0.1:{gateway.port}/v1/generate?after=0&%61pi_key={KEY_A}", open_timeout=30) as ws:
        await ws.send("{}")  # the key authenticated: what comes back is about the job, not the key
        assert json.loads(await ws.recv())["error"]["type"] == "invalid_request_error"
    with httpx.Client(base_url=gateway.base, timeout=PATIENCE_S) as http:
        for query in (f"api%5Fkey={KEY_B}", f"API_KEY={KEY_B}", f"x=1&api%5fkey={KEY_A}&y=2"):
            assert http.get(f"/v1/queue?{query}").status_code == 401
    log = gateway.proc.log
    eventually(lambda: log.read_text(), 30, "the access lines of the last requests",
               until=lambda text: text.count("/v1/queue?") >= 3 and "%61pi_key=***" in text)
    text = log.read_text()
    assert KEY_A not in text and KEY_B not in text
    assert "api%5Fkey=*** " in text and "API_KEY=*** " in text and "x=1&api%5fkey=***&y=2" in text


MISSPELLED = ["api+key", "api_key%00", "api_key[]", "api%255Fkey", "apikey", "x-api-key", "token", "access_token"]


def test_a_key_under_a_misspelled_name_is_not_logged(gateway: Gateway) -> None:
    """A valid key sent under a name the gateway does not read as ``api_key`` is refused (401), and
    redacted in the log all the same: a parameter whose name, decoded, looks like a key's or a
    token's never reaches a log line in clear."""
    with httpx.Client(base_url=gateway.base, timeout=PATIENCE_S) as http:
        for i, name in enumerate(MISSPELLED):
            assert http.get(f"/v1/queue?n={i}&{name}={KEY_A}").status_code == 401
    log = gateway.proc.log
    eventually(lambda: log.read_text(), 30, "the access lines of the last requests",
               until=lambda text: f"n={len(MISSPELLED) - 1}&" in text)
    assert KEY_A not in log.read_text()
