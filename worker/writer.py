"""EventWriter: one writer per worker that batches every job's events into Redis pipelines.

Jobs call :meth:`EventWriter.emit` for each delta (no await, no connection of their own); a single
drain task sends whatever has accumulated since its last round trip as one pipeline. Under load
that is one round trip per engine step for the whole batch, however many jobs are running. A job
whose events cannot be written is marked failed here; its runner sees it and ends the job.
"""

from __future__ import annotations

import asyncio
import logging

from inferq.shared.redis import redis_retrying
from inferq.shared.schemas import TokenEvent
from inferq.shared.store import Event, JobStore, is_duplicate_id

log = logging.getLogger(__name__)
MAX_BATCH = 1024


class FencedOut(Exception):
    """This worker's attempt no longer owns the job (it was requeued, cancelled or finished)."""


class EventWriter:
    def __init__(self, store: JobStore) -> None:
        self.store = store
        self._queue: asyncio.Queue[tuple[str, int, Event | None, asyncio.Future[None] | None]] = asyncio.Queue()
        self.failed: dict[str, Exception] = {}
        self._task: asyncio.Task[None] | None = None
        self._open: dict[str, TokenEvent] = {}  # per job: its last token event, not yet sent
        self._sending = False  # a pipeline is in flight: the writer is really behind

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._drain(), name="event-writer")

    def emit(self, job_id: str, attempt: int, event: Event) -> None:
        """Queue an event of the job's ``attempt``; it is written with the next batch."""
        if isinstance(event, TokenEvent):
            self._open[job_id] = event
        else:
            self._open.pop(job_id, None)
        self._queue.put_nowait((job_id, attempt, event, None))

    def extend(self, job_id: str, index: int, text: str, n_tokens: int) -> bool:
        """Append a delta to the job's last token event if that is still waiting to be sent
        (the writer is behind): under load, one message carries several tokens. False if the
        caller must emit a new event (with the next seq)."""
        ev = self._open.get(job_id)
        # only while a round trip is in flight: an event merely waiting for the writer task to be
        # scheduled must go out as it is, or a busy loop would hold a whole job's tokens back
        if not self._sending or ev is None or ev.index != index or ev.logprobs is not None:
            return False
        ev.text += text
        ev.n_tokens += n_tokens
        return True

    async def barrier(self) -> None:
        """Wait until every event emitted so far has been sent."""
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._queue.put_nowait(("", 0, None, fut))
        await fut

    def forget(self, job_id: str) -> None:
        self.failed.pop(job_id, None)
        self._open.pop(job_id, None)

    async def _drain(self) -> None:
        while True:
            batch = [await self._queue.get()]
            while len(batch) < MAX_BATCH and not self._queue.empty():
                batch.append(self._queue.get_nowait())
            for job_id, _, ev, _ in batch:  # from here on these events are frozen
                if ev is not None and self._open.get(job_id) is ev:
                    del self._open[job_id]
            events = [(job_id, attempt, ev) for job_id, attempt, ev, _ in batch if ev is not None]
            self._sending = True
            try:
                results = iter(await self._send(events) if events else [])
            finally:
                self._sending = False
            for job_id, _, ev, fut in batch:
                if ev is None:
                    if fut is not None and not fut.done():
                        fut.set_result(None)
                    continue
                res = next(results)
                err = FencedOut(job_id) if res is False else (res if isinstance(res, Exception) else None)
                if err is not None and not is_duplicate_id(err):
                    self.failed.setdefault(job_id, err)

    async def _send(self, items: list[tuple[str, int, Event]]) -> list[Exception | bool]:
        try:
            async for attempt in redis_retrying():
                with attempt:
                    return await self.store.append(items)
        except Exception as e:  # Redis unreachable for seconds: these jobs cannot stream
            log.error("could not write %d events: %s", len(items), e)
            return [e] * len(items)
        raise AssertionError("unreachable")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
