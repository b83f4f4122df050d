"""Client paths, one coroutine per request: inferq WebSocket, OpenAI SSE, REST polling, naive HTTP.

Every client measures on its own side of the wire: TTFT is when the first output reaches the
client (for non-streaming paths: when the whole answer arrives; for REST: the first poll that
shows text), and inter-token latency is the gap between output chunks as received.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import httpx

from bench.config import SSE_KINDS
from bench.load import RequestResult, Send, Timer
from inferq.shared.schemas import TERMINAL_STATUSES


def auth_headers(api_key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


#: How many connections one httpx pool should hold at most (see :class:`HttpClients`).
CONNECTIONS_PER_POOL = 8


class HttpClients:
    """A target's HTTP client: several httpx clients, each request on the one with the fewest in
    flight. httpcore's pool (1.0) walks all its connections, and for each of them all again, on
    every request and every response it ends: one pool holding 256 streams cost its process ~25
    CPU-seconds per 1,024 requests on a 2-core host, against ~4 with pools of 8 (seconds to open a
    request at the start of a wave: it was measuring the client, not the server). Sequential
    requests all go to the first client, so a lone client reuses one connection."""

    def __init__(self, base_url: str, headers: dict[str, str] | None = None) -> None:
        self.base_url, self.headers = base_url, headers
        self._clients: list[httpx.AsyncClient] = []
        self._busy: list[int] = []

    def _pick(self) -> int:
        """The client with the fewest requests in flight (a new one when all hold their share)."""
        if not self._clients or min(self._busy) >= CONNECTIONS_PER_POOL:
            limits = httpx.Limits(max_connections=None, max_keepalive_connections=2048)
            self._clients.append(httpx.AsyncClient(base_url=self.base_url, limits=limits, headers=self.headers,
                                                   timeout=httpx.Timeout(None, connect=30.0)))
            self._busy.append(0)
        return self._busy.index(min(self._busy))

    @asynccontextmanager
    async def _one(self) -> AsyncIterator[httpx.AsyncClient]:
        k = self._pick()
        self._busy[k] += 1
        try:
            yield self._clients[k]
        finally:
            self._busy[k] -= 1

    @asynccontextmanager
    async def stream(self, method: str, url: str, **kw: Any) -> AsyncIterator[httpx.Response]:
        async with self._one() as c, c.stream(method, url, **kw) as r:
            yield r

    async def get(self, url: str, **kw: Any) -> httpx.Response:
        async with self._one() as c:
            return await c.get(url, **kw)

    async def post(self, url: str, **kw: Any) -> httpx.Response:
        async with self._one() as c:
            return await c.post(url, **kw)

    @property
    def pools(self) -> int:
        return len(self._clients)

    async def __aenter__(self) -> HttpClients:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await asyncio.gather(*(c.aclose() for c in self._clients))


def http_client(base_url: str, headers: dict[str, str] | None = None) -> HttpClients:
    """One client per target; no limit on connections (the level sets the concurrency)."""
    return HttpClients(base_url, headers)


async def ws_generate(ws_url: str, index: int, body: dict[str, Any], expected: int,
                      headers: dict[str, str] | None = None) -> RequestResult:
    """``WS /v1/generate``: send the job, read ``accepted``, ``token``... and ``done``."""
    from websockets.asyncio.client import connect
    from websockets.exceptions import ConnectionClosed

    r = RequestResult(index=index)
    timer = Timer(r)
    finished = False
    async with connect(f"{ws_url}/v1/generate", open_timeout=60, close_timeout=5, max_size=None,
                       additional_headers=headers) as ws:
        await ws.send(json.dumps(body))
        try:
            async for raw in ws:
                ev = json.loads(raw)
                kind = ev.get("type")
                if kind == "accepted":
                    r.job_id = ev.get("id")
                elif kind == "token":
                    timer.chunk(int(ev.get("n_tokens") or 0))
                elif kind == "done":
                    usage = ev.get("usage") or {}
                    r.out_tokens = int(usage.get("completion_tokens", r.out_tokens))
                    r.prompt_tokens = usage.get("prompt_tokens")
                    if ev.get("status", "succeeded") != "succeeded":
                        r.error = f"job ended {ev.get('status')}"
                    finished = True
                    break
                elif kind == "error":
                    r.error = f"{ev.get('error', {}).get('type')}: {ev.get('error', {}).get('message')}"
                    finished = True
                    break
        except ConnectionClosed as e:
            r.error = f"socket closed before the job ended: {e}"
    if not finished and r.error is None:
        r.error = "socket closed before the job ended"
    timer.done(expected)
    return r


def _refused(r: RequestResult, timer: Timer, status: int, text: str) -> RequestResult:
    """The server answered with another status than expected: the request failed, and why."""
    r.error = f"HTTP {status}: {text[:300]}"
    timer.done(None)
    return r


def _sse_text(chunk: dict[str, Any]) -> str:
    choices = chunk.get("choices") or []
    if not choices:
        return ""
    c = choices[0]
    return (c.get("delta") or {}).get("content") or c.get("text") or ""


async def sse_stream(client: HttpClients, path: str, index: int, body: dict[str, Any],
                     expected: int) -> RequestResult:
    """OpenAI ``stream: true`` (chat or completions): ``data: {chunk}`` lines up to ``data: [DONE]``."""
    r = RequestResult(index=index)
    timer = Timer(r)
    chunks_with_text, usage, done = 0, None, False
    async with client.stream("POST", path, json=body) as resp:
        if resp.status_code != 200:
            return _refused(r, timer, resp.status_code, (await resp.aread()).decode(errors="replace"))
        r.job_id = resp.headers.get("x-inferq-job-id")
        async for line in resp.aiter_lines():
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                done = True
                break
            chunk = json.loads(data)
            if "error" in chunk:
                r.error = f"stream error: {json.dumps(chunk['error'])[:300]}"
                break
            r.job_id = r.job_id or chunk.get("id")
            if _sse_text(chunk):
                chunks_with_text += 1
                timer.chunk(0)
            if chunk.get("usage"):
                usage = chunk["usage"]
    if not done and r.error is None:
        r.error = "stream ended without data: [DONE]"
    if usage is not None:
        r.out_tokens = int(usage.get("completion_tokens", 0))
        r.prompt_tokens = usage.get("prompt_tokens")
    else:  # no usage chunk: one chunk per token is the best estimate
        r.out_tokens = chunks_with_text
    timer.done(expected)
    return r


async def rest_poll(client: HttpClients, index: int, body: dict[str, Any], expected: int,
                    interval_s: float = 0.02) -> RequestResult:
    """``POST /v1/jobs`` then ``GET /v1/jobs/{id}`` every ``interval_s`` until the job ends."""
    r = RequestResult(index=index)
    timer = Timer(r)
    resp = await client.post("/v1/jobs", json=body)
    if resp.status_code != 202:
        return _refused(r, timer, resp.status_code, resp.text)
    r.job_id = resp.json()["id"]
    while True:
        await asyncio.sleep(interval_s)
        view = (await client.get(f"/v1/jobs/{r.job_id}")).json()
        if r.ttft is None and (view.get("text") or view.get("status") in TERMINAL_STATUSES):
            r.ttft = time.perf_counter() - timer.t0
        if view.get("status") in TERMINAL_STATUSES:
            break
    fill_stages(r, view)
    usage = view.get("usage") or {}
    r.out_tokens = int(usage.get("completion_tokens", 0))
    r.prompt_tokens = usage.get("prompt_tokens")
    if view["status"] != "succeeded":
        r.error = f"job {view['status']}: {view.get('error')}"
    timer.done(expected)
    return r


def fill_stages(r: RequestResult, view: dict[str, Any]) -> None:
    """Where the request's time to first token went, from its job's record (``RequestResult``)."""
    created, started, first = (view.get(k) for k in ("created_at", "started_at", "first_token_at"))
    if created is not None and started is not None:
        r.queued = float(started) - float(created)
    if r.sent_at and created is not None:
        r.ingest = float(created) - r.sent_at
    if started is not None and first is not None:
        r.to_first_token = float(first) - float(started)
    if r.sent_at and first is not None and r.ttft is not None:
        r.delivery = r.sent_at + r.ttft - float(first)


async def job_stages(client: HttpClients, r: RequestResult) -> None:
    """Fill ``r``'s TTFT stages from its job's record (nothing if the id is not a job's)."""
    assert r.job_id is not None
    for jid in dict.fromkeys([r.job_id, r.job_id.split("-", 1)[-1]]):
        resp = await client.get(f"/v1/jobs/{jid}")
        if resp.status_code == 200:
            fill_stages(r, resp.json())
            return


async def naive_generate(client: HttpClients, index: int, body: dict[str, Any],
                         expected: int) -> RequestResult:
    """The naive server's ``POST /generate``: one JSON answer; the client sees output only at the end."""
    r = RequestResult(index=index)
    timer = Timer(r)
    resp = await client.post("/generate", json=body)
    if resp.status_code != 200:
        return _refused(r, timer, resp.status_code, resp.text)
    out = resp.json()
    timer.chunk(int(out["completion_tokens"]))
    r.prompt_tokens = out.get("prompt_tokens")
    timer.done(expected)
    return r


@dataclass(frozen=True)
class SendSpec:
    """How one target's requests are sent: its kind, the server, the SSE path, the output length
    each request must reach, the headers and the REST poll interval."""

    kind: str
    base: str
    path: str
    expected: int
    headers: dict[str, str]
    poll_interval_s: float = 0.02


def sender(spec: SendSpec, http: HttpClients) -> Send:
    """The coroutine that sends one request of the target and measures it."""
    ws_base = spec.base.replace("http://", "ws://").replace("https://", "wss://")
    kind, path, expected = spec.kind, spec.path, spec.expected

    async def send(i: int, body: Any) -> RequestResult:
        if kind == "inferq-ws":
            return await ws_generate(ws_base, i, body, expected, spec.headers)
        if kind in SSE_KINDS:
            return await sse_stream(http, path, i, body, expected)
        if kind == "inferq-rest":
            return await rest_poll(http, i, body, expected, spec.poll_interval_s)
        return await naive_generate(http, i, body, expected)

    return send
