"""The fleet's prefix index: which engines hold which prompt prefixes, in Redis.

A prompt's token ids are cut into blocks of INFERQ_AFFINITY_BLOCK_TOKENS; each block's hash covers
it, every block before it and the job's adapter (vLLM's prefix cache is per adapter too), so two
prompts share a hash exactly where they share every token up to the end of that block.
``inferq:kv:{model}:{hash}`` is a sorted set of the engines (engine instances: a restarted engine
is a new one) that hold that prefix, each scored by the time its entry lapses; readers take the
members not lapsed and keep only engines that are live.

Two ways to feed it (INFERQ_AFFINITY_INDEX):

- ``events`` (the default): the engine's own KV-cache events (vLLM's ``kv_events_config``). The
  engine publishes every block it stores (with its token ids and its parent block's hash) and
  every block it evicts; :class:`ChainTracker` turns vLLM's block chain into this index's hashes,
  so what the index says an engine holds is what its cache holds: an evicted prefix stops drawing
  jobs, and a restarted engine holds nothing. The hashes are this index's own (blake2b over the
  token ids, seeded by the adapter's name), computed the same way from a prompt and from events;
  vLLM's block hashes only link a block to its parent. A block of the engine's (``block_size``,
  16 on GPUs) ends one of the index's blocks where the token count reaches a multiple of
  INFERQ_AFFINITY_BLOCK_TOKENS.
- ``writes``: the worker that claims a job writes its prompt's hashes (an engine of another
  kind, or events off). An entry names the engine that last ran a prompt with that prefix, for
  INFERQ_AFFINITY_TTL_S: an approximation (an eviction is not seen).

In both, a worker refreshes its entries for a job it claims (the job reuses those blocks), and
entries lapse after INFERQ_AFFINITY_TTL_S without a refresh. A refresh is sent at most once a
quarter of that TTL per entry, and with events only to entries the events wrote.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from array import array
from collections import Counter
from collections.abc import Hashable, Sequence
from dataclasses import dataclass

import redis

from inferq.shared import keys

log = logging.getLogger(__name__)

#: Entries whose last write is remembered (to send no refresh sooner than a quarter of the TTL),
#: past which those old enough to be refreshed anyway are forgotten. Writes only: with events, the
#: engine's own blocks bound them.
WRITTEN_MAX = 100_000


def seed(adapter: str | None) -> bytes:
    """The hash chain's start for a prompt run with ``adapter`` (None: the base model)."""
    return hashlib.blake2b((adapter or "").encode(), digest_size=8).digest()


def step(state: bytes, tokens: Sequence[int]) -> bytes:
    """The chain's hash after one more block of ``tokens``."""
    return hashlib.blake2b(state + array("q", tokens).tobytes(), digest_size=8).digest()


def block_hashes(ids: Sequence[int], adapter: str | None, block: int, limit: int = 64) -> list[str]:
    """The hashes of the prompt's whole blocks of ``block`` tokens (at most ``limit``), each of a
    block and every block before it, and of the adapter."""
    state, out = seed(adapter), []
    for i in range(min(len(ids) // block, limit)):
        state = step(state, ids[i * block:(i + 1) * block])
        out.append(state.hex())
    return out


@dataclass(slots=True)
class _Node:
    state: bytes  # the chain after the index's last whole block within this engine block
    tail: tuple[int, ...]  # the tokens after that block, up to the end of this engine block
    depth: int  # tokens from the prompt's start to the end of this engine block
    ours: tuple[str, ...]  # the index's hashes that end within this engine block


class ChainTracker:
    """vLLM's KV-cache events (blocks stored and removed, in its own hashes) -> the index's hashes
    newly held and no longer held by this engine. Pure: no I/O."""

    def __init__(self, block: int, limit: int = 64) -> None:
        self.block = block
        self.max_depth = block * limit
        self._nodes: dict[Hashable, _Node] = {}
        self._held: Counter[str] = Counter()  # index hash -> engine blocks that end it (1, barring a collision)

    def held(self) -> list[str]:
        return list(self._held)

    def stored(self, parent: Hashable | None, hashes: Sequence[Hashable], token_ids: Sequence[int],
               block_size: int, adapter: str | None) -> list[str]:
        """Blocks stored (or reused) under ``parent``: the index hashes they hold, for the index to
        add or refresh. A parent this tracker has not seen (its events came before this worker
        listened) or one past the deepest block the index tracks: nothing."""
        if parent is None:
            node = _Node(seed(adapter), (), 0, ())
        elif (got := self._nodes.get(parent)) is not None:
            node = got
        else:
            return []
        out: list[str] = []
        for i, h in enumerate(hashes):
            tokens = token_ids[i * block_size:(i + 1) * block_size]
            if len(tokens) < block_size or node.depth >= self.max_depth:
                break
            if (known := self._nodes.get(h)) is not None:  # stored again, or reused: refresh
                out += known.ours
                node = known
                continue
            state, buf, ours = node.state, node.tail + tuple(tokens), []
            while len(buf) >= self.block:
                state = step(state, buf[:self.block])
                ours.append(state.hex())
                buf = buf[self.block:]
            node = _Node(state, buf, node.depth + block_size, tuple(ours))
            self._nodes[h] = node
            self._held.update(ours)
            out += ours
        return out

    def removed(self, hashes: Sequence[Hashable]) -> list[str]:
        """Blocks evicted: the index hashes this engine no longer holds."""
        out = []
        for h in hashes:
            node = self._nodes.pop(h, None)
            for o in node.ours if node is not None else ():
                self._held[o] -= 1
                if self._held[o] <= 0:
                    del self._held[o]
                    out.append(o)
        return out

    def cleared(self) -> list[str]:
        """Every block dropped (a reset of the prefix cache): everything it held."""
        out = list(self._held)
        self._nodes.clear()
        self._held.clear()
        return out


class PrefixIndex:
    """The index's Redis side for one model (a synchronous client that decodes responses)."""

    def __init__(self, client: redis.Redis, model: str, ttl_s: float) -> None:
        self.redis = client
        self.model = model
        self.ttl_s = ttl_s
        #: whether this process's engine events write every entry it has (kv_feed.py): then an entry
        #: this index did not write is not there, and a refresh of it is not sent
        self.fed = False
        self._written: dict[tuple[str, str], float] = {}  # (engine, hash) -> when this index last wrote it
        self._lock = threading.Lock()
        self.clock = time.monotonic

    def key(self, block_hash: str) -> str:
        return keys.prefix_holders(self.model, block_hash)

    def read(self, pipe: redis.client.Pipeline, hashes: Sequence[str], now: float) -> None:
        """Queue, on ``pipe``, one reply per hash: the engines holding that prefix."""
        for h in hashes:
            pipe.zrangebyscore(self.key(h), now, "+inf")

    def hold(self, engine: str, hashes: Sequence[str], refresh_only: bool = False) -> None:
        """``engine`` holds these prefixes (``refresh_only``: where the index already says so).

        An entry this index wrote less than a quarter of the TTL ago is not written again (a hot
        prefix costs a command every few minutes, not one a job); with ``fed``, a refresh goes only
        to entries this index wrote (a new prompt's blocks are not in the index at its claim: the
        engine's events write them once it has computed them)."""
        now = self.clock()
        with self._lock:
            todo = [h for h in hashes if self._due((engine, h), now, refresh_only)]
            for h in todo:
                self._written[(engine, h)] = now
            if not self.fed and len(self._written) > WRITTEN_MAX:  # (fed: the engine's blocks bound it)
                self._written = {e: at for e, at in self._written.items() if now - at < self.ttl_s / 4}
        if not todo:
            return
        until = time.time() + self.ttl_s
        with self.redis.pipeline(transaction=False) as p:
            for h in todo:
                p.zadd(self.key(h), {engine: until}, xx=refresh_only)
                p.expire(self.key(h), int(self.ttl_s) + 1)
            p.execute()

    def _due(self, entry: tuple[str, str], now: float, refresh_only: bool) -> bool:
        at = self._written.get(entry)
        if at is None:
            return not (refresh_only and self.fed)
        return now - at >= self.ttl_s / 4

    def drop(self, engine: str, hashes: Sequence[str]) -> None:
        """``engine`` no longer holds these prefixes."""
        if not hashes:
            return
        with self._lock:
            for h in hashes:
                self._written.pop((engine, h), None)
        with self.redis.pipeline(transaction=False) as p:
            for h in hashes:
                p.zrem(self.key(h), engine)
            p.execute()
