"""``/v1/models``: the models the fleet serves, awake or asleep (multi-model workers), and the LoRA
adapters on them, as OpenAI and vLLM list them (with each model's state); vLLM's
``/v1/load_lora_adapter`` and ``/v1/unload_lora_adapter`` (api/adapters.py)."""

from __future__ import annotations

import time
from typing import Literal

from fastapi import APIRouter
from fastapi.responses import PlainTextResponse

from inferq.api.adapters import LoadAdapterRequest, UnloadAdapterRequest
from inferq.api.deps import Caller, Service
from inferq.api.openai.objects import ModelCard, ModelList
from inferq.api.service import JobService
from inferq.shared.errors import Forbidden, NotFound
from inferq.shared.schemas import AdapterInfo

router = APIRouter(prefix="/v1", tags=["openai"])


async def _servable(service: JobService) -> list[str]:
    """The models the fleet can serve: those workers serve or hold asleep, and INFERQ_MODELS' (a fleet
    scaled to zero serves them once a worker starts)."""
    return sorted({*await service.live_models(), *(m.name for m in service.settings.models)})


@router.get("/models", response_model=ModelList)
async def list_models(service: Service, _: Caller) -> ModelList:
    now, live = int(time.time()), await _servable(service)
    cards = [await _card(service, m, now) for m in live]
    adapters = [_adapter_card(a, cards) for a in await service.adapters.all() if a.parent in live]
    return ModelList(data=cards + adapters)


@router.get("/models/{model:path}", response_model=ModelCard)
async def get_model(model: str, service: Service, _: Caller) -> ModelCard:
    now, live = int(time.time()), await _servable(service)
    if model in live:
        return await _card(service, model, now)
    adapter = await service.adapters.get(model)
    if adapter is None or adapter.parent not in live:
        raise NotFound(f"model {model!r} is not served here", param="model", code="model_not_found")
    return _adapter_card(adapter, [await _card(service, adapter.parent, now)])


@router.post("/load_lora_adapter", response_class=PlainTextResponse)
async def load_lora_adapter(body: LoadAdapterRequest, service: Service, caller: Caller) -> str:
    settings = service.settings
    _runtime_updates(settings.lora_runtime_updates)
    parent = body.model or settings.model_name
    live = await service.live_workers(parent)
    if not live and parent != settings.model_name:
        raise NotFound(f"model {parent!r} is not served here", param="model", code="model_not_found")
    return await service.adapters.load(body, parent, len(live), caller.key_id, caller.operator)


@router.post("/unload_lora_adapter", response_class=PlainTextResponse)
async def unload_lora_adapter(body: UnloadAdapterRequest, service: Service, caller: Caller) -> str:
    _runtime_updates(service.settings.lora_runtime_updates)
    return await service.adapters.unload(body, caller.key_id, caller.operator)


def _runtime_updates(allowed: bool) -> None:
    if not allowed:
        raise Forbidden("loading and unloading LoRA adapters at run time is off on this server "
                        "(INFERQ_LORA_RUNTIME_UPDATES)", code="runtime_updates_off")


async def _card(service: JobService, model: str, now: int) -> ModelCard:
    """A model's card, with the context window its live workers report (as vLLM's server does; a
    model asleep: as its workers last reported it awake) and its state."""
    workers = await service.live_workers(model)
    asleep = await service.standby.get(model) if not workers else None
    lens = [w.max_model_len for w in workers] or ([asleep.info.max_model_len] if asleep and asleep.info else [])
    state: Literal["awake", "asleep", "offline"] = "awake" if workers else "asleep" if asleep is not None else "offline"
    return ModelCard(id=model, created=now, max_model_len=max(lens, default=None), state=state,
                     awake_workers=len(workers), asleep_workers=asleep.holders if asleep is not None else 0)


def _adapter_card(adapter: AdapterInfo, cards: list[ModelCard]) -> ModelCard:
    """An adapter's card: its base model's context window and its parent (as vLLM's; no folder: paths
    on the workers' disks are not shown to clients)."""
    base = next((c for c in cards if c.id == adapter.parent), None)
    return ModelCard(id=adapter.name, created=int(adapter.created_at), parent=adapter.parent,
                     max_model_len=base.max_model_len if base else None)
