"""The gateway's connections, below the application: how long a client may take to send a request's
head (its line and headers), how large that head may be, and an answer, never silence, to a refused
WebSocket handshake (docs/security.md, "Connections").

uvicorn (pinned) closes idle kept-alive connections, but has no deadline for a request's head and
no limit on its size with its httptools parser, which uvicorn[standard] installs and uvicorn picks;
and its sans-I/O WebSocket protocol drops a handshake that the websockets library refused (a
request line over 8 KiB, a header line over 8 KiB, over 128 headers) without sending the library's
answer. The two protocol classes below add what is missing; :func:`uvicorn_options` gives them to
``uvicorn.run`` with the settings' values.
"""

from __future__ import annotations

import asyncio
import functools
from dataclasses import dataclass
from typing import Any

from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol
from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol
from websockets.exceptions import HeaderLineTooLong, RequestLineTooLong, TooManyHeaders

from inferq.api.errors import to_response
from inferq.shared.errors import HeadersTooLarge, InferqError, RequestTimeout, UriTooLong
from inferq.shared.settings import Settings

#: Longest URL of a request line, 414 beyond: what fits in the 8 KiB line the websockets library
#: reads in a WebSocket handshake (``GET `` and `` HTTP/1.1`` take the rest)
MAX_URL_BYTES = 8192 - 16
#: A request answered before its body was all here: how long the client may pause in sending the
#: rest, and how much of it is read (and dropped), before the connection is closed
LINGER_S = 2.0
LINGER_MAX_BYTES = 32 << 20


@dataclass(frozen=True)
class HeadLimits:
    timeout_s: float  # to send a request's head, from the connection's opening or the request's first bytes
    max_bytes: int  # request line and headers together


def refusal(err: InferqError, default_headers: list[tuple[bytes, bytes]]) -> bytes:
    """An HTTP/1.1 answer of ``err`` (its status and OpenAI's error body) that closes the connection."""
    response = to_response(err)
    lines = [STATUS_LINE[response.status_code]]
    for name, value in [*default_headers, *response.raw_headers, (b"connection", b"close")]:
        lines += [name, b": ", value, b"\r\n"]
    return b"".join([*lines, b"\r\n", response.body])


class GatewayHttp(HttpToolsProtocol):
    """uvicorn's HTTP/1.1 protocol with a deadline and a size limit on each request's head; and a
    request answered before its body was all sent (401 before an upload, 408, 413) ends its
    connection: the answer goes out with the end of the stream (FIN), what the client still sends
    is read and dropped (:data:`LINGER_S`, :data:`LINGER_MAX_BYTES`), then the connection is closed.
    Closing at once, with its body unread, made the kernel send a reset, which reached a client
    still sending before it had read the answer; and a client cannot keep the connection by
    trickling the rest."""

    def __init__(self, *args: Any, limits: HeadLimits, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.limits = limits
        self._head_timer: asyncio.TimerHandle | None = None
        self._in_head = False  # a request has begun and its headers are not all here
        self._head_bytes = 0  # bytes received in that head after the chunk it began in
        self._header_bytes = 0  # its complete headers, as the parser gave them
        self._refused: InferqError | None = None  # why a parser callback stopped the parser
        self._linger_left: int | None = None  # answered early: bytes still read (and dropped) before closing
        self._linger_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)  # type: ignore[arg-type]
        self._head_timer = self.loop.call_later(self.limits.timeout_s, self._head_timed_out)

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_head_timer()
        if self._linger_timer is not None:
            self._linger_timer.cancel()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._linger_left is not None:  # the rest of a body already answered: dropped, unparsed
            self._linger_left -= len(data)
            self._linger_for(LINGER_S if self._linger_left >= 0 else 0)
            return
        if self._in_head:
            self._head_bytes += len(data)
        super().data_received(data)
        if not self._in_head or self.transport.is_closing():
            return
        if self._head_bytes > self.limits.max_bytes:  # e.g. one header line that never ends
            self._refuse(HeadersTooLarge(f"request headers are larger than {self.limits.max_bytes} bytes"))
        elif self._head_timer is None:  # the head of a kept-alive connection's next request is late
            self._head_timer = self.loop.call_later(self.limits.timeout_s, self._head_timed_out)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._in_head, self._head_bytes, self._header_bytes = True, 0, 0

    def on_url(self, url: bytes) -> None:
        super().on_url(url)
        if len(self.url) > MAX_URL_BYTES:
            self._stop_parser(UriTooLong(f"request URL is longer than {MAX_URL_BYTES} bytes"))

    def on_header(self, name: bytes, value: bytes) -> None:
        self._header_bytes += len(name) + len(value) + 4
        if len(self.url) + self._header_bytes > self.limits.max_bytes:
            self._stop_parser(HeadersTooLarge(f"request headers are larger than {self.limits.max_bytes} bytes"))
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self._in_head = False
        self._stop_head_timer()
        super().on_headers_complete()

    def on_response_complete(self) -> None:
        if not self.pipeline and self.cycle is not None and self.cycle.more_body and not self.cycle.disconnected:
            self.server_state.total_requests += 1
            self._linger_left = LINGER_MAX_BYTES  # answered before its body was all here: end the connection
            if self.transport.can_write_eof():
                self.transport.write_eof()  # the answer, then FIN; the client reads it while it sends
            self.flow.resume_reading()
            self._linger_for(LINGER_S)
            return
        super().on_response_complete()

    def _linger_for(self, seconds: float) -> None:
        """Close the connection ``seconds`` from now unless more of the body comes (0: now)."""
        if self._linger_timer is not None:
            self._linger_timer.cancel()
            self._linger_timer = None
        if seconds <= 0:
            self.transport.close()
        else:
            self._linger_timer = self.loop.call_later(seconds, self.transport.close)

    def send_400_response(self, msg: str) -> None:
        """uvicorn's answer to a parser error; one that a limit raised is answered with its own status."""
        if self._refused is None:
            return super().send_400_response(msg)
        self._refuse(self._refused)

    def _stop_parser(self, err: InferqError) -> None:
        self._refused = err
        raise ValueError(err.message)  # the parser stops, uvicorn calls send_400_response

    def _refuse(self, err: InferqError) -> None:
        self._stop_head_timer()
        self.transport.write(refusal(err, self.server_state.default_headers))
        self.transport.close()

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if self.transport.is_closing():
            return
        if self._in_head and (self.cycle is None or self.cycle.response_complete):
            self._refuse(RequestTimeout(f"the request's headers did not come within {self.limits.timeout_s:g} s"))
        else:  # nothing of a request came, or one is still being answered: close, saying nothing
            self.transport.close()

    def _stop_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None


#: What the websockets library refuses a handshake for, and the gateway's error for it
_HANDSHAKE_REFUSALS: dict[type[Exception], InferqError] = {
    RequestLineTooLong: UriTooLong("request URL is too long for a WebSocket handshake (8 KiB line)"),
    HeaderLineTooLong: HeadersTooLarge("a request header is too long for a WebSocket handshake (8 KiB line)"),
    TooManyHeaders: HeadersTooLarge("too many request headers for a WebSocket handshake (at most 128)"),
}


class GatewayWebSocket(WebSocketsSansIOProtocol):
    """uvicorn's WebSocket protocol, answering a handshake that the websockets library refused
    (uvicorn leaves the connection open and silent)."""

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        failed = self.conn.handshake_exc
        if failed is not None and not self.handshake_initiated and not self.transport.is_closing():
            err = _HANDSHAKE_REFUSALS.get(type(failed))
            self.transport.write(refusal(err, self.default_headers) if err else b"")  # not HTTP: just close
            self.transport.close()


def uvicorn_options(settings: Settings) -> dict[str, Any]:
    """The options of ``uvicorn.run`` that set the gateway's protocols and their limits (a partial of
    a module-level class: it pickles, for ``--workers``)."""
    limits = HeadLimits(settings.http_header_timeout_s, settings.http_max_header_bytes)
    return {"http": functools.partial(GatewayHttp, limits=limits), "ws": GatewayWebSocket,
            "timeout_keep_alive": settings.http_keep_alive_s}
