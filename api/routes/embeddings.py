"""``/v1/embeddings``, and vLLM's ``/pooling``, ``/score`` and ``/rerank``, served through the same
queue as every other job by the workers of a pooling model (api/openai/embeddings.py, scores.py):
each request is one embedding job, except small ``/v1/embeddings`` requests of one key that meet in
the gateway, which share one (api/embed_coalesce.py)."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Annotated

from fastapi import APIRouter, Body, Request
from fastapi.responses import Response
from pydantic import BaseModel

from inferq.api import openai as oc
from inferq.api import sse
from inferq.api.admission import fingerprint
from inferq.api.deps import Admit, Caller, Embed, Hub, IdempotencyKey, Service
from inferq.api.openai.embeddings import EmbeddingList, EmbeddingRequest, Vectors, collect_vectors
from inferq.api.openai.scores import (
    PoolingList,
    PoolingRequest,
    RerankList,
    RerankRequest,
    ScoreList,
    ScoreRequest,
    pooling_response,
    rerank_response,
    score_response,
)
from inferq.api.service import JobService
from inferq.api.streams import StreamHub
from inferq.shared.schemas import JobRequest

router = APIRouter(tags=["openai"])
EmbeddingBody = Annotated[EmbeddingRequest, Body(openapi_examples={
    "texts": {"value": {"model": "inferq-tiny-embed", "input": ["The sky is blue", "Grass is green"]}},
    "base64": {"value": {"model": "inferq-tiny-embed", "input": "hello", "encoding_format": "base64",
                         "dimensions": 64}},
})]
#: what each request's answer is made of, from its job id, its model's name and the job's vectors
Answer = Callable[[str, str, Vectors], BaseModel]


async def _answered(job: JobRequest, kind: str, body: BaseModel, answer: Answer, request: Request,
                    service: JobService, hub: StreamHub, caller: Caller, admission: Admit,
                    idempotency_key: str | None) -> Response:
    """Queue the request's job, wait for its vectors, answer (``Idempotency-Key`` as for chat)."""
    admitted = await admission.submit(caller, [job], idempotency_key=idempotency_key,
                                      fingerprint=lambda: fingerprint(kind, oc.job_fields(body)))
    rec = admitted.records[0]
    cancel = partial(service.cancel_soon, [] if idempotency_key else [rec.id])
    return await sse.answer_once(request, delivered(service, hub, rec.id), cancel, lambda got: Response(
        answer(rec.id, rec.served_name, got).model_dump_json(), media_type="application/json",
        headers=oc.answer_headers(rec.id, admitted.replayed)))


async def delivered(service: JobService, hub: StreamHub, job_id: str) -> Vectors:
    """The job's vectors; its record and log, which hold them, then stay only
    ``answered_embedding_ttl_s`` more (40 requests of 2,048 inputs left ~126 MB in Redis for a day)."""
    got = await collect_vectors(hub, job_id)
    await service.store.expire_soon(job_id, service.settings.answered_embedding_ttl_s)
    return got


@router.post("/v1/embeddings", response_model=EmbeddingList)
async def embeddings(req: EmbeddingBody, request: Request, service: Service, hub: Hub, caller: Caller,
                     admission: Admit, embed: Embed, idempotency_key: IdempotencyKey = None) -> Response:
    """The request's inputs embedded together on one worker: in a job of its own, or (small, without an
    Idempotency-Key) in one it shares with the key's other requests that meet it here."""
    job = oc.embedding_job(req)
    if idempotency_key is not None or not embed.takes(job):
        return await _answered(job, "embeddings", req, partial(_embedding, req), request, service, hub, caller,
                               admission, idempotency_key)
    admission.check(job)  # its own limits and its own count in the rate limit, before it joins
    await admission.check_rate(caller.subject)
    return await sse.answer_once(request, embed.embed(caller, job), lambda: None, lambda got: Response(
        oc.embedding_response(got.record.id, got.record.served_name, req,
                              Vectors(packed=got.packed, prompt_tokens=got.prompt_tokens)).model_dump_json(),
        media_type="application/json", headers=oc.answer_headers(got.record.id, False)))


@router.post("/pooling", response_model=PoolingList)
async def pooling(req: PoolingRequest, request: Request, service: Service, hub: Hub, caller: Caller,
                  admission: Admit, idempotency_key: IdempotencyKey = None) -> Response:
    """vLLM's ``/pooling``: the pooler's output (an embedding model's: its embedding)."""
    return await _answered(oc.embedding_job(req), "pooling", req, partial(_pooled, req), request, service,
                           hub, caller, admission, idempotency_key)


@router.post("/score", response_model=ScoreList)
@router.post("/v1/score", response_model=ScoreList, include_in_schema=False)
async def score(req: ScoreRequest, request: Request, service: Service, hub: Hub, caller: Caller,
                admission: Admit, idempotency_key: IdempotencyKey = None) -> Response:
    """vLLM's ``/score`` with an embedding model: each pair's cosine similarity."""
    return await _answered(req.job(), "score", req, partial(_scored, req), request, service, hub, caller,
                           admission, idempotency_key)


@router.post("/rerank", response_model=RerankList)
@router.post("/v1/rerank", response_model=RerankList, include_in_schema=False)
@router.post("/v2/rerank", response_model=RerankList, include_in_schema=False)
async def rerank(req: RerankRequest, request: Request, service: Service, hub: Hub, caller: Caller,
                 admission: Admit, idempotency_key: IdempotencyKey = None) -> Response:
    """vLLM's ``/rerank`` with an embedding model: the documents by cosine similarity to the query."""
    return await _answered(req.job(), "rerank", req, partial(_reranked, req), request, service, hub, caller,
                           admission, idempotency_key)


def _embedding(req: EmbeddingRequest, job_id: str, model: str, got: Vectors) -> BaseModel:
    return oc.embedding_response(job_id, model, req, got)


def _pooled(req: PoolingRequest, job_id: str, model: str, got: Vectors) -> BaseModel:
    return pooling_response(job_id, model, req, got)


def _scored(req: ScoreRequest, job_id: str, model: str, got: Vectors) -> BaseModel:
    return score_response(job_id, model, req, got)


def _reranked(req: RerankRequest, job_id: str, model: str, got: Vectors) -> BaseModel:
    return rerank_response(job_id, model, req, got)
