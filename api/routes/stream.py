"""WebSocket streaming: follow a job's events, or submit one and follow it on the same socket."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from fastapi import APIRouter, WebSocket
from pydantic import ValidationError
from starlette.websockets import WebSocketDisconnect, WebSocketState

from inferq.api.deps import Admit, Hub, Service, WsCaller
from inferq.api.errors import validation_message
from inferq.shared.errors import InferqError, NotFound, Unauthenticated
from inferq.shared.schemas import AcceptedMessage, ErrorEvent, ErrorInfo, JobRequest

log = logging.getLogger(__name__)
router = APIRouter(tags=["stream"])

CLOSE_NORMAL, CLOSE_INVALID, CLOSE_UNAUTHENTICATED, CLOSE_NOT_FOUND = 1000, 1008, 4401, 4404


async def _fail(ws: WebSocket, type_: str, message: str, code: int) -> None:
    """Tell the client what went wrong as a final ``error`` event, then close."""
    if ws.client_state is WebSocketState.CONNECTED:
        await ws.send_text(ErrorEvent(seq=0, error=ErrorInfo(type=type_, message=message)).model_dump_json())
        await ws.close(code)


async def _until_disconnect(ws: WebSocket) -> None:
    while (await ws.receive())["type"] != "websocket.disconnect":
        pass


async def _follow(ws: WebSocket, hub: Hub, job_id: str, after: int,
                  on_disconnect: Callable[[], Awaitable[object]] | None = None) -> None:
    """Send the job's events from ``after`` on; stop when it ends or the client goes away."""

    async def send_all() -> None:
        async for f in hub.frames(job_id, after):
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
    except NotFound as e:
        return await _fail(ws, e.type, e.message, CLOSE_NOT_FOUND)
    except (WebSocketDisconnect, RuntimeError):
        if on_disconnect is not None:
            await on_disconnect()
        return
    if ws.client_state is WebSocketState.CONNECTED:
        await ws.close(CLOSE_NORMAL)


@router.websocket("/v1/jobs/{job_id}/stream")
async def stream_job(ws: WebSocket, job_id: str, hub: Hub, service: Service, caller: WsCaller) -> None:
    """Events of an existing job; ``?after=SEQ`` resumes after that event."""
    await ws.accept()
    if isinstance(caller, Unauthenticated):
        return await _fail(ws, caller.type, caller.message, CLOSE_UNAUTHENTICATED)
    rec = await service.store.get(job_id)
    if rec is not None and not caller.may_see(rec.owner):  # another key's job: exactly as if unknown
        return await _fail(ws, NotFound.type, f"job {job_id} not found (or expired)", CLOSE_NOT_FOUND)
    after = ws.query_params.get("after", "0")
    if not after.isdigit():
        return await _fail(ws, "invalid_request_error", "after: must be a non-negative integer", CLOSE_INVALID)
    await _follow(ws, hub, job_id, int(after))


@router.websocket("/v1/generate")
async def generate(ws: WebSocket, hub: Hub, service: Service, admission: Admit, caller: WsCaller) -> None:
    """Send one job as JSON, receive its events; closing the socket cancels the job."""
    await ws.accept()
    if isinstance(caller, Unauthenticated):
        return await _fail(ws, caller.type, caller.message, CLOSE_UNAUTHENTICATED)
    msg = await ws.receive()
    if msg["type"] == "websocket.disconnect":
        return
    try:
        req = JobRequest.model_validate_json(msg.get("text") or msg.get("bytes") or b"")
    except ValidationError as e:
        message, _ = validation_message(list(e.errors()))
        return await _fail(ws, "invalid_request_error", message, CLOSE_INVALID)
    try:
        rec = (await admission.submit(caller, [req])).records[0]
    except InferqError as e:
        return await _fail(ws, e.code or e.type, e.message, CLOSE_INVALID)
    await ws.send_text(AcceptedMessage(id=rec.id, model=rec.model).model_dump_json())
    await _follow(ws, hub, rec.id, 0, on_disconnect=lambda: service.cancel(rec.id))
