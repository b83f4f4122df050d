"""The load client's HTTP client: concurrent requests spread over small httpx pools (one large pool
cost the client seconds per wave), sequential ones reuse one connection. Against a real server."""

from __future__ import annotations

import asyncio
import math
import threading
from collections.abc import AsyncIterator, Iterator

import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, StreamingResponse
from starlette.routing import Route

from bench.clients import CONNECTIONS_PER_POOL, HttpClients
from bench.stack import free_port
from tests.wait import eventually, eventually_async


class Server:
    """A streaming endpoint that holds each response open until released; it records the client
    address (host, port) of every request: one port per connection."""

    def __init__(self) -> None:
        self.peers: list[tuple[str, int]] = []
        self.release = threading.Event()
        self.port = free_port()

        async def hold(request: Request) -> StreamingResponse:
            assert request.client is not None
            self.peers.append((request.client.host, request.client.port))

            async def body() -> AsyncIterator[bytes]:
                await eventually_async(self.release.is_set, 60, "the test to release the response", interval=0.01)
                yield b"data: done\n\n"
            return StreamingResponse(body(), media_type="text/event-stream")

        async def ping(request: Request) -> PlainTextResponse:
            assert request.client is not None
            self.peers.append((request.client.host, request.client.port))
            return PlainTextResponse("ok")

        app = Starlette(routes=[Route("/hold", hold, methods=["POST"]), Route("/ping", ping)])
        self.server = uvicorn.Server(uvicorn.Config(app, port=self.port, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)


@pytest.fixture
def server() -> Iterator[Server]:
    s = Server()
    s.thread.start()
    eventually(lambda: s.server.started or not s.thread.is_alive(), 30, "the server to start")
    assert s.server.started, "the server's thread ended before the server started"
    yield s
    s.release.set()
    s.server.should_exit = True
    s.thread.join(10)


async def test_concurrent_streams_spread_over_pools_of_a_few_connections(server: Server) -> None:
    n = 3 * CONNECTIONS_PER_POOL + 1

    async def one(http: HttpClients) -> str:
        async with http.stream("POST", "/hold", json={}) as r:
            return (await r.aread()).decode()

    async with HttpClients(f"http://127.0.0.1:{server.port}") as http:
        streams = [asyncio.ensure_future(one(http)) for _ in range(n)]
        await eventually_async(lambda: len(server.peers) >= n, 60, f"{n} requests at the server", interval=0.01)
        assert http.pools == math.ceil(n / CONNECTIONS_PER_POOL)
        assert max(http._busy) <= CONNECTIONS_PER_POOL
        server.release.set()
        assert await asyncio.gather(*streams) == ["data: done\n\n"] * n
    assert len(set(server.peers)) == n  # one connection per concurrent stream


async def test_sequential_requests_reuse_one_connection(server: Server) -> None:
    async with HttpClients(f"http://127.0.0.1:{server.port}") as http:
        for _ in range(5):
            assert (await http.get("/ping")).text == "ok"
        assert http.pools == 1
    assert len(server.peers) == 5 and len(set(server.peers)) == 1
