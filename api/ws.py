"""WebSocket plumbing of the gateway's streaming routes: accepting a socket (auth, origin), sending
a job's events until it ends or the client goes away, and failing a socket with one ``error``
event.

A job's own events (its ``error`` included) end with a normal close (1000). When the gateway
itself refuses or fails the socket, it sends one ``error`` event with ``seq`` 0 and closes with
the type's code (api/errors.py, docs/errors.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import Awaitable, Callable

from fastapi import WebSocket
from starlette.websockets import WebSocketDisconnect, WebSocketState

from inferq.api.auth import Principal
from inferq.api.errors import typed, ws_close_code, ws_error_event
from inferq.api.streams import StreamHub
from inferq.shared.errors import Forbidden, InferqError, InvalidRequest, Unauthenticated

CLOSE_NORMAL = 1000
#: The largest ``?after=`` accepted: a ``seq`` never gets near it, and it stays an exact integer
#: in every client's JSON (2**53) and a valid Redis stream id.
MAX_AFTER = 2**53
_AFTER = re.compile(r"[0-9]{1,16}")


def parse_after(value: str | None) -> int:
    """``?after=SEQ``: 0 (the default) to :data:`MAX_AFTER`, else 400 naming ``after``."""
    if value is None:
        return 0
    if _AFTER.fullmatch(value) is None or int(value) > MAX_AFTER:
        raise InvalidRequest(f"after: must be an integer from 0 to {MAX_AFTER}", param="after")
    return int(value)


async def fail(ws: WebSocket, err: InferqError) -> None:
    """Tell the client what went wrong as a final ``error`` event, then close with the type's code."""
    if ws.client_state is WebSocketState.CONNECTED:
        with contextlib.suppress(WebSocketDisconnect, RuntimeError):  # the client left meanwhile
            await ws.send_text(ws_error_event(err).model_dump_json())
            await ws.close(ws_close_code(err))


async def accept(ws: WebSocket, caller: Principal | Unauthenticated) -> Principal | None:
    """Accept the socket (it must be, to be told why it is refused); the caller, or None once an
    unauthenticated one was told and the socket closed."""
    await ws.accept()
    if isinstance(caller, Unauthenticated):
        await fail(ws, caller)
        return None
    origin, allowed = ws.headers.get("origin"), ws.app.state.service.settings.origins
    # browsers always send Origin on a WebSocket (and CORS does not cover sockets); other clients
    # need not, and are let through
    if allowed and "*" not in allowed and origin is not None and origin.rstrip("/") not in allowed:
        await fail(ws, Forbidden(f"origin {origin[:200]!r} is not in INFERQ_ALLOWED_ORIGINS", param="origin"))
        return None
    return caller


async def _until_disconnect(ws: WebSocket) -> None:
    while (await ws.receive())["type"] != "websocket.disconnect":
        pass


async def follow(ws: WebSocket, hub: StreamHub, job_id: str, after: int,
                  on_disconnect: Callable[[], Awaitable[object]] | None = None) -> None:
    """Send the job's events from ``after`` on; stop when it ends or the client goes away."""

    async def send_all() -> None:
        async for f in hub.frames(job_id, after, kind="ws"):
            await ws.send_text(f.json())

    sender = asyncio.create_task(send_all())
    watcher = asyncio.create_task(_until_disconnect(ws))
    done, _ = await asyncio.wait({sender, watcher}, return_when=asyncio.FIRST_COMPLETED)
    if sender not in done:  # the client left first
        sender.cancel()
        if on_disconnect is not None:
            await on_disconnect()
        return
    watcher.cancel()
    try:
        sender.result()
    except (WebSocketDisconnect, RuntimeError):
        if on_disconnect is not None:
            await on_disconnect()
        return
    except Exception as e:  # the job is unknown, or the gateway failed mid-stream (Redis away)
        return await fail(ws, typed(e))
    if ws.client_state is WebSocketState.CONNECTED:
        await ws.close(CLOSE_NORMAL)
