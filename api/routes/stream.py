"""WebSocket streaming: follow a job's events, or submit one and follow it on the same socket.

A job's own events (its ``error`` included) end with a normal close (1000). When the gateway
itself refuses or fails the socket, it sends one ``error`` event with ``seq`` 0 and closes with
the type's code (api/errors.py, docs/errors.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
from collections.abc import Awaitable, Callable

from fastapi import APIRouter, WebSocket
from starlette.websockets import WebSocketDisconnect, WebSocketState

from inferq.api.auth import Principal
from inferq.api.deps import Admit, Hub, Service, WsCaller
from inferq.api.errors import typed, ws_close_code, ws_error_event
from inferq.shared.errors import Forbidden, InferqError, InvalidRequest, Unauthenticated
from inferq.shared.schemas import AcceptedMessage, JobRequest

log = logging.getLogger(__name__)
router = APIRouter(tags=["stream"])

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


async def _fail(ws: WebSocket, err: InferqError) -> None:
    """Tell the client what went wrong as a final ``error`` event, then close with the type's code."""
    if ws.client_state is WebSocketState.CONNECTED:
        with contextlib.suppress(WebSocketDisconnect, RuntimeError):  # the client left meanwhile
            await ws.send_text(ws_error_event(err).model_dump_json())
            await ws.close(ws_close_code(err))


async def _accept(ws: WebSocket, caller: Principal | Unauthenticated) -> Principal | None:
    """Accept the socket (it must be, to be told why it is refused); the caller, or None once an
    unauthenticated one was told and the socket closed."""
    await ws.accept()
    if isinstance(caller, Unauthenticated):
        await _fail(ws, caller)
        return None
    origin, allowed = ws.headers.get("origin"), ws.app.state.service.settings.origins
    # browsers always send Origin on a WebSocket (and CORS does not cover sockets); other clients
    # need not, and are let through
    if allowed and "*" not in allowed and origin is not None and origin.rstrip("/") not in allowed:
        await _fail(ws, Forbidden(f"origin {origin[:200]!r} is not in INFERQ_ALLOWED_ORIGINS", param="origin"))
        return None
    return caller


async def _until_disconnect(ws: WebSocket) -> None:
    while (await ws.receive())["type"] != "websocket.disconnect":
        pass


async def _follow(ws: WebSocket, hub: Hub, job_id: str, after: int,
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
        return await _fail(ws, typed(e))
    if ws.client_state is WebSocketState.CONNECTED:
        await ws.close(CLOSE_NORMAL)


@router.websocket("/v1/jobs/{job_id}/stream")
async def stream_job(ws: WebSocket, job_id: str, hub: Hub, service: Service, caller: WsCaller) -> None:
    """Events of an existing job; ``?after=SEQ`` resumes after that event."""
    if (principal := await _accept(ws, caller)) is None:
        return
    try:
        after = parse_after(ws.query_params.get("after"))
        await service.record(job_id, principal)  # unknown, expired or another key's: the same 404
    except Exception as e:
        return await _fail(ws, typed(e))
    await _follow(ws, hub, job_id, after)


@router.websocket("/v1/generate")
async def generate(ws: WebSocket, hub: Hub, service: Service, admission: Admit, caller: WsCaller) -> None:
    """Send one job as JSON, receive its events; closing the socket cancels the job."""
    if (principal := await _accept(ws, caller)) is None:
        return
    msg = await ws.receive()
    if msg["type"] == "websocket.disconnect":
        return
    try:
        req = JobRequest.model_validate_json(msg.get("text") or msg.get("bytes") or b"")
        rec = (await admission.submit(principal, [req])).records[0]
    except Exception as e:  # invalid, refused, or Redis away
        return await _fail(ws, typed(e))
    try:
        await ws.send_text(AcceptedMessage(id=rec.id, model=rec.model).model_dump_json())
    except Exception:  # the client left while its job was being queued: it cannot be told, so cancel
        await service.cancel(rec.id)
        return
    await _follow(ws, hub, rec.id, 0, on_disconnect=lambda: service.cancel(rec.id))
