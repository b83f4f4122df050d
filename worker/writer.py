"""EventWriter: one writer per worker that batches every job's events into Redis pipelines.

Jobs call :meth:`EventWriter.emit` for each delta (no await, no connection of their own); a single
drain task sends whatever has accumulated since its last round trip as one pipeline. Under load
that is one round trip per engine step for the whole batch, however many jobs are running. A job
whose events cannot be written is marked failed here; its runner sees it and ends the job.
"""

from __future__ import annotations

import asyncio
import logging

from shared.redis import redis_retrying
from shared.store import Event, JobStore, is_duplicate_id

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

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._drain(), name="event-writer")

    def emit(self, job_id: str, attempt: int, event: Event) -> None:
        """Queue an event of the job's ``attempt``; it is written with the next batch."""
        self._queue.put_nowait((job_id, attempt, event, None))

    async def barrier(self) -> None:
        """Wait until every event emitted so far has been sent."""
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._queue.put_nowait(("", 0, None, fut))
        await fut

    def forget(self, job_id: str) -> None:
        self.failed.pop(job_id, None)

    async def _drain(self) -> None:
        while True:
            batch = [await self._queue.get()]
            while len(batch) < MAX_BATCH and not self._queue.empty():
                batch.append(self._queue.get_nowait())
            events = [(job_id, attempt, ev) for job_id, attempt, ev, _ in batch if ev is not None]
            results = iter(await self._send(events) if events else [])
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
