"""``/v1/models``: the models live workers serve, as OpenAI lists them."""

from __future__ import annotations

import time

from fastapi import APIRouter

from inferq.api.deps import Caller, Service
from inferq.api.openai.objects import ModelCard, ModelList
from inferq.api.service import JobService
from inferq.shared.errors import NotFound

router = APIRouter(prefix="/v1", tags=["openai"])


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
