"""WebSocket streaming: follow a job's events, or submit one and follow it on the same socket
(the socket's plumbing: api/ws.py)."""

from __future__ import annotations

from fastapi import APIRouter, WebSocket

from inferq.api.deps import Admit, Hub, Service, WsCaller
from inferq.api.errors import typed
from inferq.api.ws import accept, fail, follow, parse_after
from inferq.shared.schemas import AcceptedMessage, JobRequest

router = APIRouter(tags=["stream"])


@router.websocket("/v1/jobs/{job_id}/stream")
async def stream_job(ws: WebSocket, job_id: str, hub: Hub, service: Service, caller: WsCaller) -> None:
    """Events of an existing job; ``?after=SEQ`` resumes after that event."""
    if (principal := await accept(ws, caller)) is None:
        return
    try:
        after = parse_after(ws.query_params.get("after"))
        await service.record(job_id, principal)  # unknown, expired or another key's: the same 404
    except Exception as e:
        return await fail(ws, typed(e))
    await follow(ws, hub, job_id, after)


@router.websocket("/v1/generate")
async def generate(ws: WebSocket, hub: Hub, service: Service, admission: Admit, caller: WsCaller) -> None:
    """Send one job as JSON, receive its events; closing the socket cancels the job."""
    if (principal := await accept(ws, caller)) is None:
        return
    msg = await ws.receive()
    if msg["type"] == "websocket.disconnect":
        return
    try:
        req = JobRequest.model_validate_json(msg.get("text") or msg.get("bytes") or b"")
        rec = (await admission.submit(principal, [req], streamed=True)).records[0]
    except Exception as e:  # invalid, refused, or Redis away
        return await fail(ws, typed(e))
    try:
        await ws.send_text(AcceptedMessage(id=rec.id, model=rec.served_name).model_dump_json())
    except Exception:  # the client left while its job was being queued: it cannot be told, so cancel
        await service.cancel(rec.id)
        return
    await follow(ws, hub, rec.id, 0, on_disconnect=lambda: service.cancel(rec.id))
