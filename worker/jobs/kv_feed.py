"""Feeds the prefix index (prefix_index.py) from the engine's own KV-cache events.

vLLM's EngineCore, started with ``kv_events_config`` (worker/engine/args.py), publishes a batch of
events per step on a ZMQ PUB socket (here an ``ipc://`` endpoint private to the worker): blocks
stored, blocks removed, all blocks cleared. This thread subscribes before the engine starts,
decodes each batch (msgpack, read as plain lists and maps so that any vLLM version's fields do),
turns vLLM's blocks into the index's hashes (:class:`ChainTracker`) and writes what changed in one
Redis round trip per batch. A batch lost on the way (ZMQ drops past its high-water mark; the
publisher numbers its batches) makes the index forget everything this engine held: a missing
entry costs a prefix hit, a wrong one would pass jobs to a cache that lost them.

pyzmq and msgspec come with vLLM (its own transport and encoding); only a worker imports this.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from inferq.worker.jobs.prefix_index import ChainTracker, PrefixIndex

log = logging.getLogger(__name__)

#: Storage tiers whose blocks count as held: the engine's own KV cache (vLLM names it "GPU" on
#: every platform); blocks offloaded to another tier need loading back first.
PRIMARY = {None, "GPU"}


class KVEventFeed:
    """One engine's events -> the index, on a thread of its own, under the engine instance's id."""

    def __init__(self, endpoint: str, index: PrefixIndex, engine: str, block: int,
                 adapter_name: Callable[[int], str | None] = lambda _: None) -> None:
        self.endpoint = endpoint
        self.index = index
        index.fed = True  # every entry of this engine's is written here: a refresh goes only to those
        self.engine = engine
        self.tracker = ChainTracker(block)
        self.adapter_name = adapter_name  # vLLM's lora_int_id -> the adapter's name (older events)
        self.batches = 0  # batches applied (tests and the log read it)
        self._stop = threading.Event()
        self._next_seq: int | None = None
        self._thread = threading.Thread(target=self._run, name="kv-events", daemon=True)
        import zmq

        self._sock: Any = zmq.Context.instance().socket(zmq.SUB)
        self._sock.setsockopt(zmq.SUBSCRIBE, b"")
        self._sock.setsockopt(zmq.RCVHWM, 100_000)
        self._sock.connect(endpoint)  # before the engine binds: ZMQ connects once it is there

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout)
        self._sock.close(linger=0)
        if self.endpoint.startswith("ipc://"):  # (the engine's socket file: its process bound it and is gone)
            Path(self.endpoint.removeprefix("ipc://")).unlink(missing_ok=True)
        try:  # what the engine held is not held by anyone now
            self.index.drop(self.engine, self.tracker.cleared())
        except Exception as e:
            log.debug("could not clear this engine's prefix index entries: %s", e)

    def _run(self) -> None:
        import zmq

        poller = zmq.Poller()
        poller.register(self._sock, zmq.POLLIN)
        while not self._stop.is_set():
            try:
                if not poller.poll(200):
                    continue
                frames = self._sock.recv_multipart(zmq.NOBLOCK)
                self.apply(frames)
            except zmq.ZMQError as e:
                if self._stop.is_set():
                    return
                log.warning("KV events: %s", e)
            except Exception as e:  # Redis away, a batch this version cannot read: the next one may do
                log.warning("KV events: a batch could not be applied (%s)", e)

    def apply(self, frames: list[bytes]) -> None:
        """Apply one published batch (``[topic, seq, payload]``)."""
        import msgspec

        seq = int.from_bytes(frames[-2], "big", signed=True) if len(frames) >= 3 else None
        if seq is not None and self._next_seq is not None and seq != self._next_seq:
            log.warning("KV events: %d batches lost; this engine's index entries are dropped",
                        seq - self._next_seq)
            self.index.drop(self.engine, self.tracker.cleared())
        self._next_seq = seq + 1 if seq is not None else None
        batch = msgspec.msgpack.decode(frames[-1])
        added, dropped = self.translate(batch[1] if isinstance(batch, list) else batch.get("events", []))
        self.index.drop(self.engine, dropped)
        self.index.hold(self.engine, added)
        self.batches += 1

    def translate(self, events: list[Any]) -> tuple[list[str], list[str]]:
        """The index hashes these events newly hold (or refresh) and no longer hold."""
        added: list[str] = []
        dropped: list[str] = []
        for ev in events:
            kind = ev.get("type") if isinstance(ev, dict) else None
            if kind == "AllBlocksCleared":
                dropped += self.tracker.cleared()
                added.clear()
            elif ev.get("medium") not in PRIMARY:
                continue
            elif kind == "BlockStored":
                if any(extra and not _lora_only(extra, ev.get("lora_name")) for extra in ev.get("extra_keys") or ()):
                    continue  # blocks keyed by more than tokens and adapter (images, a cache salt)
                lora = ev.get("lora_name") or (self.adapter_name(ev["lora_id"]) if ev.get("lora_id") else None)
                added += self.tracker.stored(_key(ev.get("parent_block_hash")), [_key(h) for h in ev["block_hashes"]],
                                             ev["token_ids"], ev["block_size"], lora)
            elif kind == "BlockRemoved":
                gone = self.tracker.removed([_key(h) for h in ev["block_hashes"]])
                dropped += gone
                if gone:
                    added = [h for h in added if h not in set(gone)]
        return added, dropped


def _key(h: Any) -> Any:
    """vLLM's block hash as a dict key (bytes or int; a list if a version sends one)."""
    return tuple(h) if isinstance(h, list) else h


def _lora_only(extra: Any, lora: str | None) -> bool:
    """Whether a block's extra hash keys are only its adapter's name."""
    return bool(lora) and list(extra) == [lora]
