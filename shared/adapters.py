"""The fleet's LoRA adapter registry (``inferq:adapters``): one home for reading, registering,
replacing and removing adapters, used by gateways (run-time loads, resolving ``model``) and by
workers (the adapters their settings name).

Every registration gets a new id from a counter (``inferq:adapter-ids``), so ids are unique by
construction: two adapters never share one, whatever their names, and an adapter replaced in
place gets a new id (an engine that still holds the old weights under the old id cannot serve the
new ones by mistake). A worker's own adapters keep their id while the registry holds them with the
same base model and folder. Each change is one script (shared/lua/adapter_*.lua): a check and its
write cannot interleave with another gateway's.

Ownership: an adapter loaded at run time belongs to the key that loaded it (``owner``, the key's
id); only that key, or an operator key, may replace or unload it. Adapters named in settings are
the operator's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from redis.asyncio import Redis

from inferq.shared import keys, lua
from inferq.shared.schemas import AdapterInfo

Outcome = Literal["put", "kept", "exists", "owned", "removed", "missing"]


@dataclass(frozen=True)
class Change:
    """What a registration or a removal did: its outcome, the adapter now registered (or removed)
    and the one it replaced."""

    outcome: Outcome
    info: AdapterInfo | None
    replaced: AdapterInfo | None = None


def _info(raw: str | bytes | None) -> AdapterInfo | None:
    return AdapterInfo.model_validate_json(raw) if raw else None


class AdapterRegistry:
    def __init__(self, redis: Redis) -> None:
        self.redis = redis

    async def get(self, name: str) -> AdapterInfo | None:
        return _info(await self.redis.hget(keys.ADAPTERS, name))

    async def all(self) -> list[AdapterInfo]:
        """Every registered adapter, by name."""
        raw = await self.redis.hgetall(keys.ADAPTERS)
        return sorted((AdapterInfo.model_validate_json(v) for v in raw.values()), key=lambda a: a.name)

    async def put(self, info: AdapterInfo, mode: Literal["settings", "new", "replace"], owner: str | None = None,
                  operator: bool = True) -> Change:
        """Register ``info`` under a new id. ``mode``: ``settings`` keeps a registration with the same
        parent and folder ('kept'); ``new`` refuses a taken name ('exists'); ``replace`` replaces
        it, if the caller owns it or is an operator (else 'owned')."""
        body = info.model_copy(update={"id": 0}).model_dump_json()
        outcome, now, old = await lua.register(self.redis, "adapter_put")(
            keys=[keys.ADAPTERS, keys.ADAPTER_IDS], args=[info.name, body, mode, owner or "", int(operator)])
        return Change(_text(outcome), _info(now), _info(old or None))  # type: ignore[arg-type]

    async def remove(self, name: str, owner: str | None = None, operator: bool = True,
                     only_id: int | None = None) -> Change:
        """Remove adapter ``name`` if the caller owns it or is an operator; ``only_id``: only while the
        registration is that one (undoing a load that failed)."""
        outcome, old = await lua.register(self.redis, "adapter_remove")(
            keys=[keys.ADAPTERS], args=[name, owner or "", int(operator), int(only_id is not None), only_id or 0])
        return Change(_text(outcome), _info(old or None))  # type: ignore[arg-type]


def _text(v: str | bytes) -> str:
    return v.decode() if isinstance(v, bytes) else v
