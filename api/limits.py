"""A pure ASGI middleware that refuses request bodies over ``max_body_bytes`` with 413, and bodies
that stall for over ``body_timeout_s`` between two parts with 408."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from inferq.api.errors import PassThrough, to_response
from inferq.shared.errors import BodyTooLarge, RequestTimeout

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]


class BodyLimit:
    def __init__(self, app: Callable[..., Awaitable[None]], max_bytes: int,
                 routes: dict[str, int] | None = None, body_timeout_s: float | None = None) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.routes = routes or {}  # exact paths with a limit of their own (file uploads)
        self.body_timeout_s = body_timeout_s  # longest wait for the body's next part (None: no limit)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        limit = self.routes.get(scope.get("path", ""), self.max_bytes)
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            return await to_response(BodyTooLarge(limit))(scope, receive, send)
        seen, done = 0, False

        async def limited_receive() -> dict[str, Any]:
            nonlocal seen, done
            if done:  # the body is all here: what is left is a streamed answer's wait for the disconnect
                return await receive()
            msg = await self._next(receive)
            if msg["type"] == "http.request":
                seen += len(msg.get("body", b""))
                if seen > limit:
                    raise PassThrough(BodyTooLarge(limit))
            done = not msg.get("more_body", False)
            return msg

        try:  # send is not wrapped: a wrapper would cost a call on every chunk a stream sends
            await self.app(scope, limited_receive, send)
        except PassThrough as e:  # raised where no exception handler saw it, reading the body:
            await to_response(e)(scope, receive, send)  # no route answers before it has read that

    async def _next(self, receive: Receive) -> dict[str, Any]:
        """The body's next part; 408 when it does not come within ``body_timeout_s``."""
        if self.body_timeout_s is None:
            return await receive()
        try:
            async with asyncio.timeout(self.body_timeout_s):
                return await receive()
        except TimeoutError:
            raise PassThrough(RequestTimeout(f"the request body stalled for over {self.body_timeout_s:g} s")) from None
