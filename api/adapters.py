"""The fleet's LoRA adapters as a gateway sees and changes them.

An adapter is a name clients send as ``model``; its jobs go on its base model's queue and carry the
adapter's folder, which the worker that claims one loads (once) before it runs it. The registry is
a Redis hash (``inferq:adapters``), written by workers for the adapters their settings name and by
gateways for run-time loads, so that every gateway resolves the same names.

A run-time load (``POST /v1/load_lora_adapter``, vLLM's shape) is checked the way vLLM checks it:
the live workers of the base model load the adapter into their engines and answer; the first
answer decides (an engine that refused it: 400 with its reason, and the adapter is removed again).
With no live worker the adapter is registered unchecked and loaded on first use.
"""

from __future__ import annotations

import logging
import secrets
import time

from pydantic import BaseModel, Field
from redis.asyncio import Redis

from inferq.shared import keys
from inferq.shared.errors import InvalidRequest, NotFound
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
    """Reads (cached for :data:`ADAPTERS_CACHE_S`) and changes the fleet's adapter registry."""

    def __init__(self, settings: Settings, redis: Redis) -> None:
        self.settings = settings
        self.redis = redis
        self._seen: dict[str, tuple[float, AdapterInfo]] = {}

    async def get(self, name: str) -> AdapterInfo | None:
        """The adapter named ``name``, or None."""
        seen = self._seen.get(name)
        if seen is not None and time.monotonic() - seen[0] < ADAPTERS_CACHE_S:
            return seen[1]
        raw = await self.redis.hget(keys.ADAPTERS, name)
        if raw is None:
            self._seen.pop(name, None)
            return None
        if len(self._seen) > 4096:
            self._seen.clear()
        info = AdapterInfo.model_validate_json(raw)
        self._seen[name] = (time.monotonic(), info)
        return info

    async def all(self) -> list[AdapterInfo]:
        """Every registered adapter, by name."""
        raw = await self.redis.hgetall(keys.ADAPTERS)
        return sorted((AdapterInfo.model_validate_json(v) for v in raw.values()), key=lambda a: a.name)

    async def load(self, req: LoadAdapterRequest, parent: str, live_workers: int) -> str:
        """Register the adapter and have the base model's live workers load it; returns vLLM's
        success text. Raises 400 for a taken name (without ``load_inplace``) or a refused adapter."""
        info = AdapterInfo(name=req.lora_name, parent=parent, path=req.lora_path, source="runtime")
        if req.lora_name == parent:
            raise InvalidRequest(f"{req.lora_name!r} is the base model's own name", param="lora_name")
        added = await self.redis.hsetnx(keys.ADAPTERS, info.name, info.model_dump_json())
        if not added:
            if not req.load_inplace:
                raise InvalidRequest(f"The lora adapter '{info.name}' has already been loaded.", param="lora_name",
                                     code="adapter_exists")
            old = await self.get(info.name)
            await self.redis.hset(keys.ADAPTERS, info.name, info.model_dump_json())
            if old is not None:
                await self._publish(AdapterCommand(op="unload", adapter=old))
        self._seen.pop(info.name, None)
        if live_workers == 0:
            log.info("adapter %s registered for %s (no live worker: loaded on first use)", info.name, parent)
            return f"Success: LoRA adapter '{info.name}' added successfully."
        reply = await self._ask_load(info)
        if reply is not None and reply.error is not None:
            await self.redis.hdel(keys.ADAPTERS, info.name)
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

    async def unload(self, req: UnloadAdapterRequest) -> str:
        """Remove the adapter from the registry and the workers' engines; vLLM's success text."""
        info = await self.get(req.lora_name)
        if info is None or not await self.redis.hdel(keys.ADAPTERS, req.lora_name):
            raise NotFound(f"The lora adapter '{req.lora_name}' cannot be found.", param="lora_name",
                           code="adapter_not_found")
        self._seen.pop(req.lora_name, None)
        await self._publish(AdapterCommand(op="unload", adapter=info))
        return f"Success: LoRA adapter '{req.lora_name}' removed successfully."

    async def _publish(self, cmd: AdapterCommand) -> None:
        await self.redis.publish(keys.ADAPTER_CHANNEL, cmd.model_dump_json())
