"""OpenAI-compatible endpoints, served through the same queue as ``/v1/jobs``."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable
from typing import Annotated, TypeVar

from fastapi import APIRouter, Body, Header, Request
from fastapi.responses import Response
from sse_starlette import EventSourceResponse, ServerSentEvent
from starlette.types import Message, Send

from inferq.api import openai_compat as oc
from inferq.api.admission import fingerprint
from inferq.api.deps import Admit, Caller, Hub, Service
from inferq.api.errors import error_body, typed
from inferq.api.openai_schemas import (
    ChatCompletion,
    ChatCompletionRequest,
    CompletionRequest,
    ModelCard,
    ModelList,
    TextCompletion,
)
from inferq.api.service import JobService
from inferq.shared.errors import NotFound

router = APIRouter(prefix="/v1", tags=["openai"])
T = TypeVar("T")
_background: set[asyncio.Task[object]] = set()


def _cancel_later(service: JobService, job_ids: list[str]) -> None:
    """Cancel jobs from a cleanup path that may itself be cancelled (a client that went away)."""
    for job_id in job_ids:
        task = asyncio.get_running_loop().create_task(service.cancel(job_id))
        _background.add(task)
        task.add_done_callback(_background.discard)


async def _unless_disconnected(request: Request, work: Awaitable[T], service: JobService,
                               job_ids: list[str]) -> T | None:
    """Await ``work``; if the client disconnects first, cancel its jobs and return None."""

    async def disconnected() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass

    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(disconnected())
    await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    if task.done():
        watcher.cancel()
        return task.result()
    task.cancel()
    _cancel_later(service, job_ids)
    return None


class EventStream(EventSourceResponse):
    """sse-starlette's response without its per-send cancel scope when there is no send timeout:
    opening an anyio scope around every chunk cost ~15 % of a gateway's CPU streaming tokens
    (py-spy, docs/benchmarks.md). A client that stops reading is still noticed: its disconnect
    ends the stream."""

    async def _send_with_timeout(self, send: Send, message: Message) -> None:
        if self.send_timeout is None:
            await send(message)
        else:
            await super()._send_with_timeout(send, message)


async def _stream(request: Request, payloads: AsyncIterator[oc.Payload], service: JobService,
                  job_ids: list[str], headers: dict[str, str]) -> Response:
    """The stream's response, held until its first payload: a job that fails before producing
    anything (a prompt that does not fit the context once the worker applied the chat template,
    a sampling combination vLLM refuses) answers with its error's HTTP status and body, as vLLM's
    server answers before any stream; a job that gets going streams from that payload on."""
    first = await _unless_disconnected(request, anext(payloads), service, job_ids)
    if first is None:
        return Response(status_code=499)
    if first.error is not None:
        raise first.error

    return _sse(payloads, service, job_ids, headers, first)


def _sse(payloads: AsyncIterator[oc.Payload], service: JobService, job_ids: list[str],
         headers: dict[str, str], first: oc.Payload | None = None) -> EventSourceResponse:
    """Stream ``first`` (when given), then ``payloads``; a client leaving mid-stream cancels
    ``job_ids`` (none: the jobs live on)."""

    async def events() -> AsyncIterator[bytes]:
        finished = False
        try:
            if first is not None:
                finished = first.last
                yield _encoded(first)
            async for p in payloads:
                finished = p.last
                yield _encoded(p)
        except Exception as e:  # the gateway failed mid-stream (Redis away): say so, as the last payload
            finished = True
            yield _encoded(oc.Payload(error_body(typed(e)).model_dump_json()))
        finally:
            if not finished:  # the client went away mid-stream: abort its jobs
                _cancel_later(service, job_ids)

    return EventStream(events(), sep="\n", ping=15, headers=headers)


def _encoded(p: oc.Payload) -> bytes:
    """The payload's SSE event. A payload is one line of JSON (or ``[DONE]``), written here as
    sse-starlette would write it, without building its event object for every token."""
    if "\n" in p.data or "\r" in p.data or (p.event and ("\n" in p.event or "\r" in p.event)):
        return ServerSentEvent(p.data, event=p.event, sep="\n").encode()
    return (f"event: {p.event}\ndata: {p.data}\n\n" if p.event else f"data: {p.data}\n\n").encode()


IdempotencyKey = Annotated[str | None, Header(alias="Idempotency-Key")]
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


def _headers(first_id: str, replayed: bool) -> dict[str, str]:
    return {"X-Inferq-Job-Id": first_id, **({"Idempotent-Replayed": "true"} if replayed else {})}


@router.post("/chat/completions", response_model=ChatCompletion)
async def chat_completions(req: ChatBody, request: Request, service: Service, hub: Hub,
                           caller: Caller, admission: Admit,
                           idempotency_key: IdempotencyKey = None) -> Response:
    """With an ``Idempotency-Key``, a repeat answers from the same job, and a client that goes away
    does not cancel it (it is expected to come back)."""
    oc.check_chat(req, admission.settings)  # what the job request cannot name as the client did
    admitted = await admission.submit(caller, [oc.chat_job(req)], idempotency_key=idempotency_key,
                                      fingerprint=lambda: fingerprint("chat", req.model_dump(mode="json")))
    rec = admitted.records[0]
    cancel = [] if idempotency_key else [rec.id]
    headers = _headers(rec.id, admitted.replayed)
    if req.stream:
        return await _stream(request, oc.chat_chunks(hub, rec.id, rec.model, req), service, cancel, headers)
    got = await _unless_disconnected(request, oc.collect(hub, rec.id, req.n), service, cancel)
    if got is None:
        return Response(status_code=499)
    return Response(oc.chat_response(rec.id, rec.model, req, got).model_dump_json(),
                    media_type="application/json", headers=headers)


@router.post("/completions", response_model=TextCompletion)
async def completions(req: CompletionBody, request: Request, service: Service, hub: Hub,
                      caller: Caller, admission: Admit, idempotency_key: IdempotencyKey = None) -> Response:
    """One job per prompt, admitted all or none; ``Idempotency-Key`` as for chat completions."""
    admitted = await admission.submit(caller, oc.completion_jobs(req), idempotency_key=idempotency_key,
                                      fingerprint=lambda: fingerprint("completions", req.model_dump(mode="json")))
    ids, model = [r.id for r in admitted.records], admitted.records[0].model
    cancel = [] if idempotency_key else ids
    headers = _headers(ids[0], admitted.replayed)
    if req.stream:
        return await _stream(request, oc.completion_chunks(hub, ids, model, req), service, cancel, headers)
    gathered = asyncio.gather(*(oc.collect(hub, i, req.n) for i in ids))
    parts = await _unless_disconnected(request, gathered, service, cancel)
    if parts is None:
        return Response(status_code=499)
    return Response(oc.completion_response(ids[0], model, req, parts).model_dump_json(),
                    media_type="application/json", headers=headers)


@router.get("/models", response_model=ModelList)
async def list_models(service: Service, _: Caller) -> ModelList:
    now = int(time.time())
    return ModelList(data=[await _card(service, m, now) for m in sorted(await service.live_models())])


@router.get("/models/{model:path}", response_model=ModelCard)
async def get_model(model: str, service: Service, _: Caller) -> ModelCard:
    if model not in await service.live_models():
        raise NotFound(f"model {model!r} is not served here", param="model", code="model_not_found")
    return await _card(service, model, int(time.time()))


async def _card(service: JobService, model: str, now: int) -> ModelCard:
    """A model's card, with the context window its live workers report (as vLLM's server does)."""
    workers = await service.live_workers(model)
    return ModelCard(id=model, created=now, max_model_len=max((w.max_model_len for w in workers), default=None))
