"""``/v1/embeddings``, served through the same queue as every other job, by the workers of a
pooling model (api/openai/embeddings.py)."""

from __future__ import annotations

from functools import partial
from typing import Annotated

from fastapi import APIRouter, Body, Request
from fastapi.responses import Response

from inferq.api import openai as oc
from inferq.api import sse
from inferq.api.admission import fingerprint
from inferq.api.deps import Admit, Caller, Hub, IdempotencyKey, Service
from inferq.api.openai.embeddings import (
    EmbeddingList,
    EmbeddingRequest,
    collect_vectors,
    embedding_job,
    embedding_response,
)

router = APIRouter(prefix="/v1", tags=["openai"])
EmbeddingBody = Annotated[EmbeddingRequest, Body(openapi_examples={
    "texts": {"value": {"model": "inferq-tiny-embed", "input": ["The sky is blue", "Grass is green"]}},
    "base64": {"value": {"model": "inferq-tiny-embed", "input": "hello", "encoding_format": "base64",
                         "dimensions": 64}},
})]


@router.post("/embeddings", response_model=EmbeddingList)
async def embeddings(req: EmbeddingBody, request: Request, service: Service, hub: Hub, caller: Caller,
                     admission: Admit, idempotency_key: IdempotencyKey = None) -> Response:
    """One job per request; ``Idempotency-Key`` as for chat completions."""
    admitted = await admission.submit(caller, [embedding_job(req)], idempotency_key=idempotency_key,
                                      fingerprint=lambda: fingerprint("embeddings", oc.job_fields(req)))
    rec = admitted.records[0]
    cancel = partial(service.cancel_soon, [] if idempotency_key else [rec.id])
    got = await sse.unless_disconnected(request, collect_vectors(hub, rec.id), cancel)
    if got is None:
        return Response(status_code=499)
    return Response(embedding_response(rec.id, rec.served_name, req, got).model_dump_json(),
                    media_type="application/json", headers=oc.answer_headers(rec.id, admitted.replayed))
