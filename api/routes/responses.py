"""``/v1/responses``: OpenAI's Responses API on the queue (api/openai/responses.py says how)."""

from __future__ import annotations

from functools import partial
from typing import Any

from fastapi import APIRouter, Query, Request
from fastapi.responses import JSONResponse, Response

from inferq.api import openai as oc
from inferq.api import sse
from inferq.api.admission import fingerprint
from inferq.api.deps import Admit, Caller, Hub, IdempotencyKey, Service
from inferq.api.openai import responses as rs

router = APIRouter(prefix="/v1", tags=["openai"])


@router.post("/responses")
async def create_response(req: rs.ResponsesRequest, request: Request, service: Service, hub: Hub,
                          caller: Caller, admission: Admit, idempotency_key: IdempotencyKey = None) -> Response:
    """A response is a job. ``background``: answer at once and let it run (poll or stream it with
    ``GET``); otherwise a client that goes away cancels it, as on chat completions."""
    history = []
    if req.previous_response_id is not None:
        history = rs.history(await service.record(rs.job_id(req.previous_response_id), caller))
    admitted = await admission.submit(caller, [req.job(history)], idempotency_key=idempotency_key,
                                      fingerprint=lambda: fingerprint("responses", oc.job_fields(req)))
    rec = admitted.records[0]
    cancel = partial(service.cancel_soon, [] if req.background or idempotency_key else [rec.id])
    headers = oc.answer_headers(rec.id, admitted.replayed)
    extra: dict[str, Any] = {"previous_response_id": req.previous_response_id, "background": req.background}

    async def final() -> dict[str, Any]:
        return {**rs.response(await service.record(rec.id, caller)), **extra}

    if req.stream:
        return await sse.held_stream(request, rs.stream_events(hub, rec, -1, final, extra), cancel, headers)
    if req.background:
        return JSONResponse({**rs.response(rec), **extra}, headers=headers)
    got = await sse.unless_disconnected(request, oc.collect(hub, rec.id, 1), cancel)
    if got is None:
        return Response(status_code=499)
    return JSONResponse(await final(), headers=headers)


@router.get("/responses/{response_id}")
async def get_response(response_id: str, service: Service, hub: Hub, caller: Caller,
                       stream: bool = False, starting_after: int = Query(default=-1, ge=-1)) -> Response:
    """The response now; ``stream=true``: its events after ``starting_after`` (a resume), live
    until it ends. Reading never cancels it."""
    job_id = rs.job_id(response_id)
    rec = await service.record(job_id, caller)
    if not stream:
        return JSONResponse(rs.response(rec))

    async def final() -> dict[str, Any]:
        return rs.response(await service.record(job_id, caller))

    return sse.EventStream(rs.stream_events(hub, rec, starting_after, final), None, {})


@router.post("/responses/{response_id}/cancel")
async def cancel_response(response_id: str, service: Service, caller: Caller) -> JSONResponse:
    """Cancel a response (a queued one never runs; a running one stops); the response as it is."""
    job_id = rs.job_id(response_id)
    await service.cancel(job_id, caller)
    return JSONResponse(rs.response(await service.record(job_id, caller)))
