"""Server-sent events: the one response every SSE stream of the gateway is, and the watch on a
client that turns its going away into cancelling its jobs (as vLLM's ``with_cancellation``).

A stream is a sequence of :class:`Payload`; the OpenAI routes make them from job events (chunks,
Responses events) and this module writes them. :func:`held_stream` holds the response until the
first payload, so that a job that fails before producing anything (a prompt that does not fit the
context once the worker applied the chat template, a sampling combination vLLM refuses) answers
with its error's HTTP status and body, as vLLM's server answers before any stream.
:class:`EventStream` then writes each payload as one event, a comment every :data:`PING_S` seconds
(so that proxies keep an idle connection open), and, when the client goes away before the last
payload, calls ``on_disconnect`` (which cancels the stream's jobs).

Every payload is sent as it comes, in one ASGI message, with nothing around the send (no timeout
scope, no event object): the per-token cost of a stream is the payload's encoding and the send.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from datetime import UTC, datetime
from typing import NamedTuple, TypeVar

from fastapi import Request
from fastapi.responses import Response
from starlette.types import Receive, Scope, Send
from typing_extensions import override

from inferq.api.errors import error_body, typed
from inferq.shared.errors import InferqError

T = TypeVar("T")
#: Seconds between keep-alive comments on an open stream.
PING_S = 15.0
#: What a stream's response says besides its own headers: not to be stored, nor buffered by a proxy.
SSE_HEADERS = {"Cache-Control": "no-store", "Connection": "keep-alive", "X-Accel-Buffering": "no"}
_LINE_BREAK = re.compile(r"\r\n|\r|\n")


class Payload(NamedTuple):
    """One SSE ``data`` payload; ``last`` marks the end of the stream: ``[DONE]``, or the error
    body of a stream that cannot finish (``error``: that error)."""

    data: str
    last: bool = False
    error: InferqError | None = None
    event: str | None = None  # the SSE event name (the Responses API names each event)


def encode(p: Payload) -> bytes:
    """The payload's SSE event. A payload is one line of JSON (or ``[DONE]``), written as it is;
    one with line breaks is one ``data:`` line per line (a line break in an event name is dropped)."""
    if "\n" in p.data or "\r" in p.data or (p.event and ("\n" in p.event or "\r" in p.event)):
        head = "" if p.event is None else f"event: {_LINE_BREAK.sub('', p.event)}\n"
        return (head + "".join(f"data: {line}\n" for line in _LINE_BREAK.split(p.data)) + "\n").encode()
    return (f"event: {p.event}\ndata: {p.data}\n\n" if p.event else f"data: {p.data}\n\n").encode()


async def disconnected(receive: Receive) -> None:
    """Return when the client has gone away (the ASGI ``http.disconnect`` message)."""
    while (await receive())["type"] != "http.disconnect":
        pass


async def unless_disconnected(request: Request, work: Awaitable[T], on_disconnect: Callable[[], None]) -> T | None:
    """Await ``work``; if the client goes away first, cancel it, call ``on_disconnect`` and return None."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(disconnected(request.receive))
    await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    if task.done():
        watcher.cancel()
        return task.result()
    task.cancel()
    on_disconnect()
    return None


async def answer_once(request: Request, work: Awaitable[T], on_disconnect: Callable[[], None],
                      respond: Callable[[T], Response]) -> Response:
    """A request answered once its job is done: ``respond`` to what ``work`` (collecting the job's
    answer) returns; a client gone before then gets 499, ``work`` is cancelled and ``on_disconnect``
    called (the job's own cancel, unless it is to outlive its client)."""
    got = await unless_disconnected(request, work, on_disconnect)
    if got is None:
        return Response(status_code=499)
    return respond(got)


async def held_stream(request: Request, payloads: AsyncIterator[Payload], on_disconnect: Callable[[], None],
                      headers: Mapping[str, str]) -> Response:
    """The stream's response, held until its first payload: a stream whose first payload is an
    error answers with that error's status and body (raised here); one that gets going streams
    from that payload on. A client gone before it: 499, and ``on_disconnect``."""
    first = await unless_disconnected(request, anext(payloads), on_disconnect)
    if first is None:
        return Response(status_code=499)
    if first.error is not None:
        raise first.error
    return EventStream(payloads, on_disconnect, headers, first=first)


class EventStream(Response):
    """An SSE response: ``first`` (when given), then ``payloads``. A failure of the gateway mid-stream
    (Redis away) is said as the last payload; a client that goes away before the last payload ends
    the stream and gets ``on_disconnect`` called (None: its jobs live on)."""

    media_type = "text/event-stream"

    def __init__(self, payloads: AsyncIterator[Payload], on_disconnect: Callable[[], None] | None,
                 headers: Mapping[str, str], *, first: Payload | None = None, ping_s: float = PING_S) -> None:
        self.status_code = 200
        self.background = None
        self.init_headers({**headers, **SSE_HEADERS})
        self.payloads, self.first, self.on_disconnect, self.ping_s = payloads, first, on_disconnect, ping_s
        self.ended = False  # the last message was sent: no ping after it

    @override
    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
        tasks = [asyncio.ensure_future(self._write(send)), asyncio.ensure_future(disconnected(receive))]
        if self.ping_s > 0:
            tasks.append(asyncio.ensure_future(self._ping(send)))
        failed: list[BaseException] = []
        try:
            await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        finally:  # the stream ended, the client left, or the server cancels the request: stop the rest
            for t in tasks:
                t.cancel()
            await asyncio.wait(tasks)
            failed = [e for t in tasks if not t.cancelled() and (e := t.exception()) is not None]
        if failed:
            raise failed[0]

    async def _write(self, send: Send) -> None:
        """Send every payload, then the end of the body; ``on_disconnect`` if stopped before the last."""
        finished, sending = False, False
        try:
            if self.first is not None:
                finished = self.first.last
                await send({"type": "http.response.body", "body": encode(self.first), "more_body": True})
            try:
                async for p in self.payloads:
                    finished, sending = p.last, True
                    await send({"type": "http.response.body", "body": encode(p), "more_body": True})
                    sending = False
            except Exception as e:  # the gateway failed mid-stream (Redis away): say so, as the last payload
                if sending:
                    raise
                finished = True
                body = encode(Payload(error_body(typed(e)).model_dump_json()))
                await send({"type": "http.response.body", "body": body, "more_body": True})
        finally:
            if not finished and self.on_disconnect is not None:  # the client went away mid-stream
                self.on_disconnect()
        self.ended = True
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def _ping(self, send: Send) -> None:
        """A comment every ``ping_s`` seconds while the stream lasts (it ends only when cancelled)."""
        while True:
            await asyncio.sleep(self.ping_s)
            if not self.ended:
                ping = f": ping - {datetime.now(UTC)}\n\n".encode()
                await send({"type": "http.response.body", "body": ping, "more_body": True})
