"""The fleet's LoRA adapters as a gateway sees and changes them.

An adapter is a name clients send as ``model``; its jobs go on its base model's queue and carry the
adapter's folder, which the worker that claims one loads (once) before it runs it. The registry is
a Redis hash (``inferq:adapters``), written by workers for the adapters their settings name and by
gateways for run-time loads, so that every gateway resolves the same names.

A run-time load (``POST /v1/load_lora_adapter``, vLLM's shape) is checked the way vLLM checks it:
the live workers of the base model load the adapter into their engines and answer; the first
answer decides (an engine that refused it: 400 with its reason, and the adapter is removed again).
With no live worker the adapter is registered unchecked and loaded on first use.

An adapter loaded at run time is its loader's: only that key (or an operator key) may replace or
unload it (403 otherwise); every registration has an id of its own (shared/adapters.py).
"""

from __future__ import annotations

import logging
import secrets
import time

from pydantic import BaseModel, Field
from redis.asyncio import Redis

from inferq.shared import keys
from inferq.shared.adapters import AdapterRegistry
from inferq.shared.errors import Forbidden, InvalidRequest, NotFound
from inferq.shared.schemas import AdapterCommand, AdapterInfo, AdapterReply
from inferq.shared.settings import Settings

log = logging.getLogger(__name__)

#: How long a gateway answers from what it read of an adapter without reading it again.
ADAPTERS_CACHE_S = 1.0


class LoadAdapterRequest(BaseModel):
    """Body of ``POST /v1/load_lora_adapter`` (vLLM's; ``model`` names the base model, default the
    gateway's INFERQ_SERVED_MODEL_NAME)."""

    lora_name: str = Field(min_length=1, max_length=256, pattern=keys.MODEL_NAME_PATTERN)
    lora_path: str = Field(min_length=1, max_length=4096)
    load_inplace: bool = Field(default=False, description="Replace an adapter of the same name.")
    model: str | None = Field(default=None, min_length=1, max_length=256, pattern=keys.MODEL_NAME_PATTERN)


class UnloadAdapterRequest(BaseModel):
    """Body of ``POST /v1/unload_lora_adapter`` (vLLM's)."""

    lora_name: str = Field(min_length=1, max_length=256, pattern=keys.MODEL_NAME_PATTERN)
    lora_int_id: int | None = None


class Adapters:
    """Reads (cached for :data:`ADAPTERS_CACHE_S`) and changes the fleet's adapter registry
    (shared/adapters.py). A change names its caller: ``owner`` (the key's id; None without auth)
    and whether it is an ``operator`` (may change any adapter)."""

    def __init__(self, settings: Settings, redis: Redis) -> None:
        self.settings = settings
        self.redis = redis
        self.registry = AdapterRegistry(redis)
        self._seen: dict[str, tuple[float, AdapterInfo]] = {}

    async def get(self, name: str) -> AdapterInfo | None:
        """The adapter named ``name``, or None."""
        seen = self._seen.get(name)
        if seen is not None and time.monotonic() - seen[0] < ADAPTERS_CACHE_S:
            return seen[1]
        info = await self.registry.get(name)
        if info is None:
            self._seen.pop(name, None)
            return None
        if len(self._seen) > 4096:
            self._seen.clear()
        self._seen[name] = (time.monotonic(), info)
        return info

    async def all(self) -> list[AdapterInfo]:
        """Every registered adapter, by name."""
        return await self.registry.all()

    async def load(self, req: LoadAdapterRequest, parent: str, live_workers: int, owner: str | None = None,
                   operator: bool = True) -> str:
        """Register the adapter and have the base model's live workers load it; returns vLLM's
        success text. Raises 400 for a taken name (without ``load_inplace``) or a refused adapter,
        403 for replacing another key's adapter."""
        if req.lora_name == parent:
            raise InvalidRequest(f"{req.lora_name!r} is the base model's own name", param="lora_name")
        info = AdapterInfo(name=req.lora_name, parent=parent, path=req.lora_path, source="runtime", owner=owner)
        change = await self.registry.put(info, "replace" if req.load_inplace else "new", owner, operator)
        if change.outcome == "exists":
            raise InvalidRequest(f"The lora adapter '{info.name}' has already been loaded.", param="lora_name",
                                 code="adapter_exists")
        if change.outcome == "owned":
            raise Forbidden(f"The lora adapter '{info.name}' was loaded by another key; only that key or an "
                            "operator key may replace it.", param="lora_name", code="adapter_not_owned")
        assert change.info is not None
        info = change.info
        self._seen.pop(info.name, None)
        if change.replaced is not None:
            await self._publish(AdapterCommand(op="unload", adapter=change.replaced))
        if live_workers == 0:
            log.info("adapter %s registered for %s (no live worker: loaded on first use)", info.name, parent)
            return f"Success: LoRA adapter '{info.name}' added successfully."
        reply = await self._ask_load(info)
        if reply is not None and reply.error is not None:
            await self.registry.remove(info.name, only_id=info.id)
            raise InvalidRequest(reply.error, param="lora_path", code="adapter_load_failed")
        log.info("adapter %s loaded for %s (%s)", info.name, parent,
                 f"first by {reply.worker}" if reply else "no worker answered in time")
        return f"Success: LoRA adapter '{info.name}' added successfully."

    async def _ask_load(self, info: AdapterInfo) -> AdapterReply | None:
        """Ask the base model's workers to load ``info``; the first answer, or None if none came
        within INFERQ_LORA_LOAD_TIMEOUT_S."""
        reply_to = keys.adapter_reply(secrets.token_hex(8))
        await self._publish(AdapterCommand(op="load", adapter=info, reply_to=reply_to))
        got = await self.redis.blpop([reply_to], timeout=self.settings.lora_load_timeout_s)
        return AdapterReply.model_validate_json(got[1]) if got else None

    async def unload(self, req: UnloadAdapterRequest, owner: str | None = None, operator: bool = True) -> str:
        """Remove the adapter from the registry and the workers' engines; vLLM's success text. 404
        for an unknown name, 403 for another key's adapter."""
        change = await self.registry.remove(req.lora_name, owner, operator)
        if change.outcome == "owned":
            raise Forbidden(f"The lora adapter '{req.lora_name}' was loaded by another key; only that key or an "
                            "operator key may unload it.", param="lora_name", code="adapter_not_owned")
        if change.outcome != "removed" or change.info is None:
            raise NotFound(f"The lora adapter '{req.lora_name}' cannot be found.", param="lora_name",
                           code="adapter_not_found")
        self._seen.pop(req.lora_name, None)
        await self._publish(AdapterCommand(op="unload", adapter=change.info))
        return f"Success: LoRA adapter '{req.lora_name}' removed successfully."

    async def _publish(self, cmd: AdapterCommand) -> None:
        await self.redis.publish(keys.ADAPTER_CHANNEL, cmd.model_dump_json())
