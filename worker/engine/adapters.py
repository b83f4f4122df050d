"""The LoRA adapters of one engine: vLLM ``LoRARequest`` objects, each adapter loaded before the
first request that names it, and what the engine holds, as it holds it.

vLLM's engine dies on a request whose adapter cannot be loaded (a missing or malformed folder, a
rank above ``max_lora_rank``: EngineDeadError for every request it holds), while ``add_lora`` only
raises. So a request goes to the engine only with an adapter the engine has just taken or still
holds: an adapter's first use here is ``add_lora``, and so is every use after the engine may have
dropped it. The engine keeps at most ``max_cpu_loras`` adapters in host memory, dropping the least
recently used, and loads a dropped one again from its folder when a request names it, inside the
engine: this side keeps the same bounded order (and asks the engine what it holds, every few
seconds), so an adapter it may have dropped is loaded through ``add_lora`` again, whose failure
(the folder deleted meanwhile) fails one job instead of the engine. A folder that is gone is also
refused before any engine call.

Ids are the registry's (shared/adapters.py), unique in the fleet, so every frontend of an engine
group gives the one EngineCore the same id for the same adapter, and two adapters never share one.
"""

from __future__ import annotations

import asyncio
import logging
import os
import zlib
from collections import OrderedDict
from typing import Any

from inferq.shared.errors import InvalidRequest
from inferq.shared.schemas import AdapterRef

log = logging.getLogger(__name__)


class AdapterLoadFailed(InvalidRequest):
    """The engine refused an adapter (its folder is missing, malformed, or of too high a rank)."""

    default_code = "adapter_load_failed"


def lora_id(ref: AdapterRef) -> int:
    """The adapter's id in the engine: the registry's; for a registration written before the
    registry gave ids (0), one derived from name and path, the same in every process."""
    return ref.id or zlib.crc32(f"{ref.name}\0{ref.path}".encode()) % 0x7FFFFFFF + 1


class EngineAdapters:
    """Adapters this engine holds, least recently used first (what the heartbeat reports)."""

    def __init__(self, enabled: bool, capacity: int = 1) -> None:
        self.enabled = enabled
        self.capacity = max(1, capacity)  # vLLM's max_cpu_loras: adapters it keeps in host memory
        self.engine: Any = None  # the engine host's AsyncLLM, set once it has started
        self._held: OrderedDict[int, Any] = OrderedDict()  # lora id -> LoRARequest, least recent first
        self._loading: dict[int, asyncio.Future[Any]] = {}
        self._names: dict[int, str] = {}  # every id this engine was given -> its adapter's name
        self._snapshot: tuple[str, ...] = ()  # for the heartbeat's thread

    def loaded(self) -> list[str]:
        """Names of the adapters this engine holds, least recently used first (any thread)."""
        return list(self._snapshot)

    def name_of(self, lora_int_id: int) -> str | None:
        """The name of the adapter this engine knows by ``lora_int_id`` (any thread)."""
        return self._names.get(lora_int_id)

    def _changed(self) -> None:
        self._snapshot = tuple(req.lora_name for req in self._held.values())

    async def request(self, ref: AdapterRef) -> Any:
        """The ``LoRARequest`` for ``ref``, loading the adapter first unless the engine holds it (on
        the engine loop). Raises :class:`AdapterLoadFailed` with the reason."""
        if not self.enabled:
            raise AdapterLoadFailed(f"adapter {ref.name!r}: this worker runs with LoRA off (INFERQ_ENABLE_LORA)",
                                    param="model")
        key = lora_id(ref)
        if (req := self._held.get(key)) is not None:
            if next(reversed(self._held)) != key:
                self._held.move_to_end(key)
                self._changed()
            return req
        if (pending := self._loading.get(key)) is not None:
            return await asyncio.shield(pending)
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._loading[key] = fut
        try:
            req = await self._add(ref, key)
        except BaseException as e:
            fut.set_exception(e)
            fut.exception()  # a load nobody else waited on is not an unretrieved exception
            raise
        else:
            fut.set_result(req)
            self._held[key] = req
            while len(self._held) > self.capacity:  # as the engine drops its least recently used
                self._held.popitem(last=False)
            self._changed()
            return req
        finally:
            del self._loading[key]

    async def _add(self, ref: AdapterRef, key: int) -> Any:
        from vllm.lora.request import LoRARequest

        if os.path.isabs(ref.path) and not os.path.isdir(ref.path):  # (a Hub id is the engine's to resolve)
            raise AdapterLoadFailed(f"adapter {ref.name!r} could not be loaded: its folder {ref.path} is gone",
                                    param="model")
        req = LoRARequest(lora_name=ref.name, lora_int_id=key, lora_path=ref.path)
        try:
            await self.engine.add_lora(req)
        except Exception as e:  # vLLM wraps the worker's error: keep its first line
            reason = str(e).removeprefix("Call to add_lora method failed: ").split(", please check")[0]
            log.warning("adapter %s (%s) could not be loaded: %s", ref.name, ref.path, reason)
            raise AdapterLoadFailed(f"adapter {ref.name!r} could not be loaded: {reason}", param="model") from None
        self._names[key] = ref.name
        log.info("adapter %s loaded from %s", ref.name, ref.path)
        return req

    async def sync(self) -> None:
        """Keep only what the engine says it holds (its host-memory cache: vLLM's list_loras)."""
        if self.engine is None or not self._held:
            return
        held = set(await self.engine.list_loras())
        gone = [k for k in self._held if k not in held]
        for k in gone:
            del self._held[k]
        if gone:
            self._changed()

    async def keep_synced(self, every_s: float = 2.0) -> None:
        """:meth:`sync` until cancelled (a task on the engine loop)."""
        while True:
            await asyncio.sleep(every_s)
            try:
                await self.sync()
            except Exception as e:  # an engine busy dying: its death path runs elsewhere
                log.debug("could not list the engine's adapters: %s", e)

    async def unload(self, name: str, lora_int_id: int | None = None) -> bool:
        """Drop adapter ``name`` from this engine (``lora_int_id``: only that registration of it,
        else every one); True if it held one."""
        held = [k for k, req in self._held.items()
                if req.lora_name == name and lora_int_id in (None, k)]
        for k in held:
            del self._held[k]
        if held:
            self._changed()
        for k in held:
            try:
                await self.engine.remove_lora(k)
            except Exception as e:  # another frontend of the group may have removed it already
                log.info("adapter %s: remove_lora said %s", name, e)
        return bool(held)
