"""A pure ASGI middleware that refuses request bodies over ``max_body_bytes`` with 413 (having read
up to 4x the limit of them first, so that a client still sending hears the answer, not a reset),
and bodies that stall for over ``body_timeout_s`` between two parts with 408."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from starlette.types import Message, Receive, Scope, Send

from inferq.api.errors import PassThrough, to_response
from inferq.shared.errors import BodyTooLarge, RequestTimeout

#: The most of a too-large body read (and dropped) before the 413, as a multiple of the limit up to this.
DRAIN_MAX_BYTES = 32 << 20


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
            if int(declared) <= self._drain_cap(limit):
                await self._drain(receive, 0, limit)
            return await to_response(BodyTooLarge(limit))(scope, receive, send)
        seen, done = 0, False

        async def limited_receive() -> Message:
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
            if isinstance(e.error, BodyTooLarge) and not done:
                await self._drain(receive, seen, limit)
            await to_response(e)(scope, receive, send)  # no route answers before it has read that

    @staticmethod
    def _drain_cap(limit: int) -> int:
        return min(4 * limit, DRAIN_MAX_BYTES)

    async def _drain(self, receive: Receive, seen: int, limit: int) -> None:
        """Read the rest of a body that is too large, up to :meth:`_drain_cap` bytes in all, before
        the 413: a client still sending when the connection closes gets a reset, not the answer."""
        more = True
        try:
            while more and seen <= self._drain_cap(limit):
                msg = await self._next(receive)
                seen += len(msg.get("body", b""))
                more = msg["type"] == "http.request" and msg.get("more_body", False)
        except PassThrough:  # it stalled: answer now
            pass

    async def _next(self, receive: Receive) -> Message:
        """The body's next part; 408 when it does not come within ``body_timeout_s``."""
        if self.body_timeout_s is None:
            return await receive()
        try:
            async with asyncio.timeout(self.body_timeout_s):
                return await receive()
        except TimeoutError:
            raise PassThrough(RequestTimeout(f"the request body stalled for over {self.body_timeout_s:g} s")) from None
