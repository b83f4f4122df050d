"""The LoRA adapters of one engine: vLLM ``LoRARequest`` objects, each adapter loaded before the
first request that names it.

vLLM's engine dies on a request whose adapter cannot be loaded (a missing or malformed folder, a
rank above ``max_lora_rank``: EngineDeadError for every request it holds), while ``add_lora`` only
raises. So an adapter's first use here is ``add_lora``, and a request goes to the engine only with
an adapter the engine took. Ids are derived from the name and path, so that every frontend of an
engine group hands the one EngineCore the same id for the same adapter.
"""

from __future__ import annotations

import asyncio
import logging
import zlib
from collections import OrderedDict
from typing import Any

from inferq.shared.errors import InvalidRequest
from inferq.shared.schemas import AdapterRef

log = logging.getLogger(__name__)


class AdapterLoadFailed(InvalidRequest):
    """The engine refused an adapter (its folder is missing, malformed, or of too high a rank)."""

    default_code = "adapter_load_failed"


def lora_id(name: str, path: str) -> int:
    """A positive 31-bit id for the adapter ``name`` at ``path``, the same in every process."""
    return zlib.crc32(f"{name}\0{path}".encode()) % 0x7FFFFFFF + 1


class EngineAdapters:
    """Adapters this engine has taken, most recently used last (what the heartbeat reports)."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self.engine: Any = None  # the engine host's AsyncLLM, set once it has started
        self._loaded: OrderedDict[tuple[str, str], Any] = OrderedDict()  # (name, path) -> LoRARequest
        self._loading: dict[tuple[str, str], asyncio.Future[Any]] = {}
        self._names: tuple[str, ...] = ()  # a snapshot for the heartbeat's thread

    def loaded(self) -> list[str]:
        """Names of the adapters this engine has taken, least recently used first (any thread)."""
        return list(self._names)

    def _changed(self) -> None:
        self._names = tuple(name for name, _ in self._loaded)

    async def request(self, ref: AdapterRef) -> Any:
        """The ``LoRARequest`` for ``ref``, loading the adapter first if this engine has not (on the
        engine loop). Raises :class:`AdapterLoadFailed` with the engine's reason."""
        if not self.enabled:
            raise AdapterLoadFailed(f"adapter {ref.name!r}: this worker runs with LoRA off (INFERQ_ENABLE_LORA)",
                                    param="model")
        key = (ref.name, ref.path)
        if (req := self._loaded.get(key)) is not None:
            if next(reversed(self._loaded)) != key:
                self._loaded.move_to_end(key)
                self._changed()
            return req
        if (pending := self._loading.get(key)) is not None:
            return await asyncio.shield(pending)
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._loading[key] = fut
        try:
            req = await self._add(ref)
        except BaseException as e:
            fut.set_exception(e)
            fut.exception()  # a load nobody else waited on is not an unretrieved exception
            raise
        else:
            fut.set_result(req)
            self._loaded[key] = req
            self._changed()
            return req
        finally:
            del self._loading[key]

    async def _add(self, ref: AdapterRef) -> Any:
        from vllm.lora.request import LoRARequest

        req = LoRARequest(lora_name=ref.name, lora_int_id=lora_id(ref.name, ref.path), lora_path=ref.path)
        try:
            await self.engine.add_lora(req)
        except Exception as e:  # vLLM wraps the worker's error: keep its first line
            reason = str(e).removeprefix("Call to add_lora method failed: ").split(", please check")[0]
            log.warning("adapter %s (%s) could not be loaded: %s", ref.name, ref.path, reason)
            raise AdapterLoadFailed(f"adapter {ref.name!r} could not be loaded: {reason}", param="model") from None
        log.info("adapter %s loaded from %s", ref.name, ref.path)
        return req

    async def unload(self, name: str) -> bool:
        """Drop every version of adapter ``name`` from this engine; True if it held one."""
        held = [key for key in self._loaded if key[0] == name]
        for key in held:
            req = self._loaded.pop(key)
            self._changed()
            try:
                await self.engine.remove_lora(req.lora_int_id)
            except Exception as e:  # another frontend of the group may have removed it already
                log.info("adapter %s: remove_lora said %s", name, e)
        return bool(held)
