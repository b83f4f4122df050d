"""EventWriter: one writer per worker that batches every job's events into Redis pipelines.

Jobs call :meth:`EventWriter.emit` for each delta (no await, no connection of their own); a single
drain task sends whatever has accumulated since its last round trip as one pipeline. Under load
that is one round trip per engine step for the whole batch, however many jobs are running. A job
whose events cannot be written is marked failed here; its runner sees it and ends the job.
"""

from __future__ import annotations

import asyncio
import logging

from tenacity import AsyncRetrying, retry_if_exception_type, stop_after_attempt, wait_exponential
from redis.exceptions import ConnectionError, TimeoutError

from shared.store import Event, JobStore, is_duplicate_id

log = logging.getLogger(__name__)
MAX_BATCH = 1024


class EventWriter:
    def __init__(self, store: JobStore) -> None:
        self.store = store
        self._queue: asyncio.Queue[tuple[str, Event, asyncio.Future[None] | None]] = asyncio.Queue()
        self.failed: dict[str, Exception] = {}
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._drain(), name="event-writer")

    def emit(self, job_id: str, event: Event) -> None:
        """Queue an event; it is written with the next batch."""
        self._queue.put_nowait((job_id, event, None))

    async def write(self, job_id: str, event: Event) -> None:
        """Queue an event and wait until it (and all before it) is in Redis."""
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._queue.put_nowait((job_id, event, fut))
        await fut

    def forget(self, job_id: str) -> None:
        self.failed.pop(job_id, None)

    async def _drain(self) -> None:
        while True:
            batch = [await self._queue.get()]
            while len(batch) < MAX_BATCH and not self._queue.empty():
                batch.append(self._queue.get_nowait())
            errors = await self._send(batch)
            for (job_id, ev, fut), err in zip(batch, errors):
                if err is not None and not is_duplicate_id(err):
                    self.failed.setdefault(job_id, err)
                if fut is not None and not fut.done():
                    fut.set_result(None) if err is None else fut.set_exception(err)

    async def _send(self, batch: list[tuple[str, Event, asyncio.Future[None] | None]]) -> list[Exception | None]:
        items = [(job_id, ev) for job_id, ev, _ in batch]
        try:
            async for attempt in AsyncRetrying(
                retry=retry_if_exception_type((ConnectionError, TimeoutError)),
                wait=wait_exponential(multiplier=0.05, max=2.0),
                stop=stop_after_attempt(6),
                reraise=True,
            ):
                with attempt:
                    return await self.store.append(items)
        except Exception as e:  # Redis unreachable for seconds: these jobs cannot stream
            log.error("could not write %d events: %s", len(items), e)
            return [e] * len(items)
        raise AssertionError("unreachable")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
