"""``/v1/chat/completions`` and ``/v1/completions``, served through the same queue as ``/v1/jobs``."""

from __future__ import annotations

import asyncio
from functools import partial
from typing import Annotated

from fastapi import APIRouter, Body, Request
from fastapi.responses import Response

from inferq.api import openai as oc
from inferq.api import sse
from inferq.api.admission import fingerprint
from inferq.api.deps import Admit, Caller, Hub, IdempotencyKey, Service
from inferq.api.openai.objects import ChatCompletion, TextCompletion
from inferq.api.openai.params import ChatCompletionRequest, CompletionRequest

router = APIRouter(prefix="/v1", tags=["openai"])
_CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Say hi"}]
ChatBody = Annotated[ChatCompletionRequest, Body(openapi_examples={
    "chat": {"value": {"model": "inferq-tiny", "messages": _CHAT, "max_tokens": 16}},
    "stream": {"value": {"messages": _CHAT, "max_completion_tokens": 8, "stream": True, "logprobs": True,
                         "top_logprobs": 2}},
})]
CompletionBody = Annotated[CompletionRequest, Body(openapi_examples={
    "one": {"value": {"model": "inferq-tiny", "prompt": "def f(x):", "max_tokens": 16, "temperature": 0}},
    "many": {"value": {"prompt": ["a", "b"], "n": 2, "max_tokens": 4, "stream": True, "logprobs": 1}},
})]


@router.post("/chat/completions", response_model=ChatCompletion)
async def chat_completions(req: ChatBody, request: Request, service: Service, hub: Hub,
                           caller: Caller, admission: Admit,
                           idempotency_key: IdempotencyKey = None) -> Response:
    """With an ``Idempotency-Key``, a repeat answers from the same job, and a client that goes away
    does not cancel it (it is expected to come back)."""
    oc.check_chat(req, admission.settings)  # what the job request cannot name as the client did
    admitted = await admission.submit(caller, [oc.chat_job(req)], idempotency_key=idempotency_key,
                                      fingerprint=lambda: fingerprint("chat", oc.job_fields(req)),
                                      streamed=req.stream, class_param="service_tier")
    rec = admitted.records[0]
    cancel = partial(service.cancel_soon, [] if idempotency_key else [rec.id])
    headers = oc.answer_headers(rec.id, admitted.replayed)
    if req.stream:
        return await sse.held_stream(request, oc.chat_chunks(hub, rec.id, rec.served_name, req), cancel, headers)
    return await sse.answer_once(request, oc.collect(hub, rec.id, req.n), cancel, lambda got: Response(
        oc.chat_response(rec.id, rec.served_name, req, got).model_dump_json(), media_type="application/json",
        headers=headers))


@router.post("/completions", response_model=TextCompletion)
async def completions(req: CompletionBody, request: Request, service: Service, hub: Hub,
                      caller: Caller, admission: Admit, idempotency_key: IdempotencyKey = None) -> Response:
    """One job per prompt, admitted all or none; ``Idempotency-Key`` as for chat completions."""
    admitted = await admission.submit(caller, oc.completion_jobs(req), idempotency_key=idempotency_key,
                                      fingerprint=lambda: fingerprint("completions", oc.job_fields(req)),
                                      streamed=req.stream, class_param="service_tier")
    ids, model = [r.id for r in admitted.records], admitted.records[0].served_name
    cancel = partial(service.cancel_soon, [] if idempotency_key else ids)
    headers = oc.answer_headers(ids[0], admitted.replayed)
    if req.stream:
        return await sse.held_stream(request, oc.completion_chunks(hub, ids, model, req), cancel, headers)
    gathered = asyncio.gather(*(oc.collect(hub, i, req.n) for i in ids))
    return await sse.answer_once(request, gathered, cancel, lambda parts: Response(
        oc.completion_response(ids[0], model, req, parts).model_dump_json(), media_type="application/json",
        headers=headers))
