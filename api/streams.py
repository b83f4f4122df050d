"""StreamHub: one Redis pub/sub connection per gateway process, fanned out to every local client.

Lossless delivery of a job's events from any ``seq`` on:

1. subscribe to the job's channel and wait until Redis confirms it;
2. replay the job's log after the requested ``seq``;
3. forward live messages, dropping any ``seq`` already sent; a gap in ``seq`` (a message lost
   while the connection was re-established) is filled from the log, and so is a quiet spell.
"""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

from redis.asyncio import Redis
from redis.exceptions import ConnectionError, TimeoutError

from shared import keys
from shared.errors import NotFound
from shared.redis import redis_retrying
from shared.schemas import JobStatus, is_terminal, parse_event
from shared.store import Event, JobStore

log = logging.getLogger(__name__)
_TERMINAL = {s.value for s in JobStatus if s.terminal}


class StreamHub:
    def __init__(self, redis: Redis, store: JobStore, idle_check_s: float = 2.0) -> None:
        self.redis = redis
        self.store = store
        self.idle_check_s = idle_check_s
        self._ps = redis.pubsub()
        self._listeners: dict[str, set[asyncio.Queue[str]]] = {}
        self._confirmed: dict[str, asyncio.Event] = {}
        self._task: asyncio.Task[None] | None = None
        self._home = f"{keys.PREFIX}:gateway:{uuid.uuid4().hex}"

    async def start(self) -> None:
        await self._ps.subscribe(self._home)  # keeps the connection in subscribed mode
        self._task = asyncio.get_running_loop().create_task(self._read(), name="stream-hub")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
        await self._ps.aclose()

    @property
    def channels(self) -> int:
        return len(self._listeners)

    async def _read(self) -> None:
        while True:
            try:
                msg = await self._ps.get_message(timeout=1.0)
            except (ConnectionError, TimeoutError, OSError) as e:
                log.warning("pub/sub connection lost (%s); reconnecting", e)
                await asyncio.sleep(0.5)
                continue
            if msg is None:
                continue
            channel = msg["channel"]
            if msg["type"] == "subscribe" and (ev := self._confirmed.get(channel)) is not None:
                ev.set()
            elif msg["type"] == "message":
                for q in self._listeners.get(channel, ()):
                    q.put_nowait(msg["data"])

    @asynccontextmanager
    async def _listen(self, job_id: str) -> AsyncIterator[asyncio.Queue[str]]:
        channel = keys.job_channel(job_id)
        q: asyncio.Queue[str] = asyncio.Queue()
        listeners = self._listeners.setdefault(channel, set())
        listeners.add(q)
        if len(listeners) == 1:
            self._confirmed[channel] = asyncio.Event()
            await self._command(self._ps.subscribe, channel)
        try:
            await asyncio.wait_for(self._confirmed[channel].wait(), timeout=5.0)
        except (asyncio.TimeoutError, KeyError):
            log.warning("no subscribe confirmation for %s; relying on the log", channel)
        try:
            yield q
        finally:
            listeners.discard(q)
            if not listeners and self._listeners.get(channel) is listeners:
                del self._listeners[channel]
                self._confirmed.pop(channel, None)
                await self._command(self._ps.unsubscribe, channel)

    async def _command(self, command: Callable[[str], Awaitable[object]], channel: str) -> None:
        """(Un)subscribe, never waiting long: the log is always there to fall back on."""
        try:
            await asyncio.wait_for(command(channel), timeout=5.0)
        except (ConnectionError, TimeoutError, OSError, asyncio.TimeoutError) as e:
            log.warning("pub/sub %s %s failed (%r); relying on the log", command.__name__, channel, e)

    async def _read_log(self, job_id: str, after: int) -> list[Event]:
        async for attempt in redis_retrying():
            with attempt:
                return await self.store.read_log(job_id, after)
        raise AssertionError("unreachable")

    async def _status(self, job_id: str) -> str | None:
        """The job's status as stored (JSON), or None if there is no such job."""
        async for attempt in redis_retrying():
            with attempt:
                raw = await self.store.redis.hget(keys.job(job_id), "status")
                return None if raw is None else str(json.loads(raw))
        raise AssertionError("unreachable")

    async def events(self, job_id: str, after: int = 0) -> AsyncIterator[Event]:
        """Every event of the job with ``seq > after``, exactly once and in order, up to the last."""
        async with self._listen(job_id) as q:
            last = after
            while True:
                backlog = await self._read_log(job_id, last)
                for ev in backlog:
                    yield ev
                    last = ev.seq
                    if is_terminal(ev):
                        return
                if not backlog:
                    status = await self._status(job_id)
                    if status is None:
                        raise NotFound(f"job {job_id} not found (or expired)")
                    if status in _TERMINAL:  # ended meanwhile, or `after` is past its last event
                        for ev in await self._read_log(job_id, last):
                            yield ev
                        return
                # Live: forward until a gap or a quiet spell sends us back to the log.
                while True:
                    try:
                        raw = await asyncio.wait_for(q.get(), timeout=self.idle_check_s)
                    except asyncio.TimeoutError:
                        break
                    ev = parse_event(raw)
                    if ev.seq <= last:
                        continue
                    if ev.seq > last + 1:
                        break
                    yield ev
                    last = ev.seq
                    if is_terminal(ev):
                        return
