"""A pure ASGI middleware that refuses request bodies over ``max_body_bytes`` with 413."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from inferq.api.errors import PassThrough, to_response
from inferq.shared.errors import BodyTooLarge

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]


class BodyLimit:
    def __init__(self, app: Callable[..., Awaitable[None]], max_bytes: int,
                 routes: dict[str, int] | None = None) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.routes = routes or {}  # exact paths with a limit of their own (file uploads)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        limit = self.routes.get(scope.get("path", ""), self.max_bytes)
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            return await to_response(BodyTooLarge(limit))(scope, receive, send)
        seen = 0

        async def limited_receive() -> dict[str, Any]:
            nonlocal seen
            msg = await receive()
            if msg["type"] == "http.request":
                seen += len(msg.get("body", b""))
                if seen > limit:
                    raise PassThrough(BodyTooLarge(limit))
            return msg

        try:  # send is not wrapped: a wrapper would cost a call on every chunk a stream sends
            await self.app(scope, limited_receive, send)
        except PassThrough as e:  # raised where no exception handler saw it, reading the body:
            await to_response(e)(scope, receive, send)  # no route answers before it has read that
