"""StreamHub: one Redis pub/sub connection per gateway process, fanned out to every local client.

Lossless delivery of a job's events from any ``seq`` on:

1. subscribe to the job's channel and wait until Redis confirms it;
2. replay the job's log after the requested ``seq``;
3. forward live messages, dropping any ``seq`` already sent; a gap in ``seq`` (a message lost
   while the connection was re-established) is filled from the log, and so is a quiet spell.

Events travel as the JSON the worker wrote: :meth:`StreamHub.frames` reads only their type and
``seq`` (a token event's without a JSON parse), so a WebSocket forwards them untouched;
:meth:`StreamHub.events` parses them for the OpenAI streams.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import NamedTuple

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from inferq.api.frames import Frame, StreamItem, frame, merged
from inferq.api.metrics import CATCHUPS, StreamMeter
from inferq.api.pubsub import Subscriber
from inferq.shared import keys
from inferq.shared.errors import job_not_found
from inferq.shared.redis import Where, redis_retrying
from inferq.shared.schemas import TERMINAL_STATUSES
from inferq.shared.store import JobStore

log = logging.getLogger(__name__)
MAX_BATCH = 256  # frames handed on at once to a reader that is behind
class Head(NamedTuple):
    """What a stream reads of the job's record with each log read."""

    status: str
    model: str
    created_at: float


class Listener:
    """One reader's live messages: what pub/sub delivered and it has not taken yet. Cheaper per
    message than an ``asyncio.Queue`` read under ``asyncio.timeout`` (a timer armed and cancelled
    for every token): the hub's sweeper wakes a reader that waited past the idle check instead."""

    __slots__ = ("items", "waiter", "since")

    def __init__(self) -> None:
        self.items: deque[str] = deque()
        self.waiter: asyncio.Future[bool] | None = None
        self.since = 0.0  # when the current wait began (loop time)

    def put(self, data: str) -> None:
        self.items.append(data)
        if (w := self.waiter) is not None and not w.done():
            w.set_result(True)

    def idle(self) -> None:
        """The wait has lasted past the idle check: wake the reader with nothing."""
        if (w := self.waiter) is not None and not w.done():
            w.set_result(False)

    async def wait(self) -> bool:
        """Until something is there (True), or the hub's sweeper calls it idle (False)."""
        if self.items:
            return True
        loop = asyncio.get_running_loop()
        self.waiter, self.since = loop.create_future(), loop.time()
        try:
            return await self.waiter
        finally:
            self.waiter = None

    def take(self, n: int) -> list[str]:
        items = self.items
        return [items.popleft() for _ in range(min(n, len(items)))]


class StreamHub:
    def __init__(self, redis: Where, store: JobStore, idle_check_s: float = 2.0) -> None:
        self.store = store
        self.idle_check_s = idle_check_s
        self._listeners: dict[str, set[Listener]] = {}
        self._sweeper: asyncio.Task[None] | None = None
        self._confirmed: dict[str, asyncio.Event] = {}
        self.gaps = 0  # live messages that showed a gap in seq and sent their reader back to the log
        self._sub = Subscriber(redis, self._dispatch, self._subscribed)

    async def start(self) -> None:
        await self._sub.start()
        try:
            async with asyncio.timeout(5.0):
                await self._sub.connected.wait()
        except TimeoutError:  # streams fall back on the log until it connects
            log.warning("pub/sub not connected yet; it keeps trying")

    async def stop(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sweeper
        await self._sub.stop()

    async def _sweep(self) -> None:
        """Wake every reader that has waited ``idle_check_s`` (within a quarter of it) with nothing:
        it reads the log, which covers a message pub/sub lost."""
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(self.idle_check_s / 4)
            due = loop.time() - self.idle_check_s
            for listeners in list(self._listeners.values()):
                for li in listeners:
                    if li.waiter is not None and li.since <= due:
                        li.idle()

    @property
    def channels(self) -> int:
        return len(self._listeners)

    def _dispatch(self, channel: str, data: str) -> None:
        for li in self._listeners.get(channel, ()):
            li.put(data)

    def _subscribed(self, channel: str) -> None:
        if (ev := self._confirmed.get(channel)) is not None:
            ev.set()

    @asynccontextmanager
    async def _listen(self, job_id: str) -> AsyncIterator[Listener]:
        channel = keys.job_channel(job_id)
        q = Listener()
        if self._sweeper is None or self._sweeper.done():
            self._sweeper = asyncio.get_running_loop().create_task(self._sweep(), name="stream-idle-sweeper")
        listeners = self._listeners.setdefault(channel, set())
        listeners.add(q)
        try:  # from here on, whatever happens (a client leaving at once), the listener is removed
            if len(listeners) == 1:
                self._confirmed[channel] = asyncio.Event()
                await self._command(self._sub.subscribe, channel)
            if self._sub.connected.is_set():  # when down, the log and the idle check cover the gap
                try:
                    async with asyncio.timeout(5.0):
                        await self._confirmed[channel].wait()
                except (TimeoutError, KeyError):
                    log.warning("no subscribe confirmation for %s; relying on the log", channel)
            yield q
        finally:
            listeners.discard(q)
            if not listeners and self._listeners.get(channel) is listeners:
                del self._listeners[channel]
                self._confirmed.pop(channel, None)
                await self._command(self._sub.unsubscribe, channel)

    async def _command(self, command: Callable[[str], Awaitable[object]], channel: str) -> None:
        """(Un)subscribe, never waiting long: the log is always there to fall back on."""
        try:
            async with asyncio.timeout(5.0):  # not wait_for: on 3.11 it can swallow a cancellation
                await command(channel)
        except (RedisConnectionError, RedisTimeoutError, OSError, TimeoutError) as e:
            log.warning("pub/sub %s %s failed (%r); relying on the log", command.__name__, channel, e)

    async def _read(self, job_id: str, after: int) -> tuple[Head, list[Frame]]:
        """The job's status and its logged events after ``after``, read together (MULTI): a
        terminal status with nothing after ``after`` means there is nothing more. A job without
        a record is not found, whatever its log still holds: a log is never replayed without the
        record that says whose it is."""
        async for attempt in redis_retrying():
            with attempt:
                async with self.store.redis.pipeline(transaction=True) as p:
                    p.hmget(keys.job(job_id), "status", "model", "created_at")
                    p.xrange(keys.job_log(job_id), min=f"{after + 1}-0", max="+")
                    (status, model, created), rows = await p.execute()
                if status is None:
                    raise job_not_found(job_id)
                head = Head(str(json.loads(status)), str(json.loads(model or '""')), float(created or 0))
                return head, [frame(fields["e"]) for _, fields in rows]
        raise AssertionError("unreachable")

    async def events(self, job_id: str, after: int = 0, merge: bool = False,
                     kind: str | None = None) -> AsyncIterator[StreamItem]:
        """Every event of the job with ``seq > after``, exactly once and in order, up to the last.
        With ``merge``, plain token events come as :class:`PlainToken`, and those that were already
        waiting together as one (a reader that is behind gets fewer, larger deltas; their ``seq``
        is the last one's). ``kind``: a client stream of that kind (``ws``, ``sse``), counted in the
        gateway's metrics. (The OpenAI streams read api/openai/sent_events.py's filter instead.)"""
        async for batch in self.batches(job_id, after, kind):
            for ev in merged(batch) if merge else [f.event() for f in batch]:
                yield ev

    async def frames(self, job_id: str, after: int = 0, kind: str | None = None) -> AsyncIterator[Frame]:
        """:meth:`events`, unparsed."""
        async for batch in self.batches(job_id, after, kind):
            for f in batch:
                yield f

    async def batches(self, job_id: str, after: int = 0, kind: str | None = None) -> AsyncIterator[list[Frame]]:
        """:meth:`frames` in lists: what the log held, or what arrived while the reader was busy."""
        async with self._listen(job_id) as q, StreamMeter(kind) as meter:
            last, why = after, "start"
            while True:
                job, backlog = await self._read(job_id, last)
                if backlog:
                    CATCHUPS.labels(why).inc()
                    head = _upto_terminal(backlog)
                    meter.sent(head, job.model, job.created_at, live=job.status not in TERMINAL_STATUSES)
                    yield head
                    if head[-1].terminal:
                        return
                    last = head[-1].seq
                elif job.status in TERMINAL_STATUSES:  # `after` is past its last event
                    return
                # Live: forward until a gap or a quiet spell sends us back to the log.
                while True:
                    if not await q.wait():
                        why = "idle"
                        break
                    batch, gap = _following(q.take(MAX_BATCH), last)  # behind: everything already here at once
                    if batch:
                        last = batch[-1].seq
                        meter.sent(batch, job.model, job.created_at, live=True)
                        yield batch
                        if batch[-1].terminal:
                            return
                    if gap:  # what follows the gap is in the log too
                        self.gaps += 1
                        why = "gap"
                        break


def _following(raws: list[str], last: int) -> tuple[list[Frame], bool]:
    """The live messages' frames that follow ``seq`` ``last`` in order (seen ones dropped), up to a
    terminal one; and True when a gap in ``seq`` cut them short."""
    batch: list[Frame] = []
    for raw in raws:
        f = frame(raw)
        if f.seq <= last:
            continue
        if f.seq > last + 1:
            return batch, True
        batch.append(f)
        last = f.seq
        if f.terminal:
            break
    return batch, False


def _upto_terminal(frames: list[Frame]) -> list[Frame]:
    end = next((i for i, f in enumerate(frames) if f.terminal), len(frames) - 1)
    return frames[:end + 1]
