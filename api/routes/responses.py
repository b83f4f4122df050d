"""``/v1/responses``: OpenAI's Responses API on the queue (api/openai/responses.py says how)."""

from __future__ import annotations

import asyncio
import contextlib
from functools import partial
from typing import Any

from fastapi import APIRouter, Query, Request
from fastapi.responses import JSONResponse, Response

from inferq.api import openai as oc
from inferq.api import sse
from inferq.api.admission import fingerprint
from inferq.api.auth import Principal
from inferq.api.deps import Admit, Caller, Hub, IdempotencyKey, Service
from inferq.api.openai import responses as rs
from inferq.api.service import JobService
from inferq.api.streams import StreamHub
from inferq.shared.errors import InvalidRequest, NotFound
from inferq.shared.schemas import JobRecord, JobStatus, ResponseOptions

router = APIRouter(prefix="/v1", tags=["openai"])

#: How long a cancel waits for the worker to stop a running response before it answers (as
#: cancelled: the worker stops it all the same).
CANCEL_WAIT_S = 10.0


async def response_record(service: JobService, response_id: str, caller: Principal,
                          param: str = "response_id") -> JobRecord:
    """The job of a response id as ``caller`` may see it; 404 naming the response id as given
    and the field that held it (``param``)."""
    try:
        return await service.record(rs.job_id(response_id, param), caller)
    except NotFound:
        raise rs.not_found(response_id, param) from None


@router.post("/responses")
async def create_response(req: rs.ResponsesRequest, request: Request, service: Service, hub: Hub,
                          caller: Caller, admission: Admit, idempotency_key: IdempotencyKey = None) -> Response:
    """A response is a job. ``background``: answer at once and let it run (poll or stream it with
    ``GET``); otherwise a client that goes away cancels it, as on chat completions."""
    history = []
    if req.previous_response_id is not None:
        history = rs.history(await response_record(service, req.previous_response_id, caller,
                                                   "previous_response_id"))
    options = ResponseOptions(background=req.background, previous_response_id=req.previous_response_id)
    admitted = await admission.submit(caller, [req.job(history)], idempotency_key=idempotency_key,
                                      fingerprint=lambda: fingerprint("responses", oc.job_fields(req)),
                                      response=options, streamed=req.stream, class_param="service_tier")
    rec = admitted.records[0]
    cancel = partial(service.cancel_soon, [] if req.background or idempotency_key else [rec.id])
    headers = oc.answer_headers(rec.id, admitted.replayed)

    async def final() -> dict[str, Any]:
        return rs.response(await service.record(rec.id, caller))

    if req.stream:
        return await sse.held_stream(request, rs.stream_events(hub, rec, -1, final), cancel, headers)
    if req.background:
        return JSONResponse(rs.response(rec), headers=headers)
    async def answered() -> dict[str, Any]:
        await oc.collect(hub, rec.id, 1)
        return await final()

    return await sse.answer_once(request, answered(), cancel, lambda done: JSONResponse(done, headers=headers))


@router.get("/responses/{response_id}")
async def get_response(response_id: str, service: Service, hub: Hub, caller: Caller,
                       stream: bool = False, starting_after: int = Query(default=-1, ge=-1)) -> Response:
    """The response now; ``stream=true``: its events after ``starting_after`` (a resume), live
    until it ends. Reading never cancels it."""
    rec = await response_record(service, response_id, caller)
    if not stream:
        return JSONResponse(rs.response(rec))

    async def final() -> dict[str, Any]:
        return rs.response(await service.record(rec.id, caller))

    return sse.EventStream(rs.stream_events(hub, rec, starting_after, final), None, {})


async def _ended(hub: StreamHub, job_id: str) -> None:
    async for _ in hub.frames(job_id):  # up to the job's last event
        pass


@router.post("/responses/{response_id}/cancel")
async def cancel_response(response_id: str, service: Service, hub: Hub, caller: Caller) -> JSONResponse:
    """Cancel a background response: a queued one never runs, a running one stops. The answer is
    the response once it has stopped, ``cancelled`` (waited for up to ``CANCEL_WAIT_S``; past
    that, said as cancelled, as the worker stops it all the same). A response that is not a
    background one, or that ended otherwise, is a 400, as OpenAI's; an already cancelled one is
    answered as it is."""
    rec = await response_record(service, response_id, caller)
    if rec.response is None or not rec.response.background:
        raise InvalidRequest(f"response {response_id!r} was not created with background: only a background "
                             "response can be cancelled", param="response_id")
    prev = await service.cancel(rec.id)
    if prev.terminal and prev is not JobStatus.cancelled:
        raise InvalidRequest(f"response {response_id!r} has already ended ({rs.status_of(prev)}): it cannot be "
                             "cancelled", param="response_id")
    if prev is JobStatus.running:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(_ended(hub, rec.id), CANCEL_WAIT_S)
    rec = await service.record(rec.id, caller)
    return JSONResponse(rs.response(rec, status=None if rec.status.terminal else "cancelled"))
