"""EventWriter: one writer per worker that batches every job's events into Redis pipelines.

Jobs call :meth:`EventWriter.emit` for each delta (no await, no connection of their own); a single
drain task sends whatever has accumulated since its last round trip as one pipeline. Under load
that is one round trip per engine step for the whole batch, however many jobs are running.

Everything is kept per attempt, ``(job id, attempt)``: an attempt whose events cannot be written
is marked failed here and its runner ends it; a late answer about an attempt that already ended
is dropped, so it can never touch a later attempt of the same job. Once one event of an attempt
is lost, none of its later events is sent: a log never has a hole.
"""

from __future__ import annotations

import asyncio
import logging
import time

from inferq.shared.redis import retried
from inferq.shared.schemas import TokenEvent
from inferq.shared.store import Event, JobStore, is_duplicate_id
from inferq.worker.metrics import EVENT_BATCH, EVENT_WRITE

log = logging.getLogger(__name__)
MAX_BATCH = 1024
Key = tuple[str, int]  # (job id, attempt)


class FencedOut(Exception):
    """This worker's attempt no longer owns the job (it was requeued, cancelled or finished)."""


class EventsLost(Exception):
    """Events of this attempt could not be logged (Redis away past the write budget): nothing
    after them may be logged, so the attempt stops and the job goes back to the queue."""


class EventWriter:
    def __init__(self, store: JobStore, budget_s: float = 30.0, model: str = "") -> None:
        self.store = store
        self._batch_size, self._write_time = EVENT_BATCH.labels(model), EVENT_WRITE.labels(model)
        self.budget_s = budget_s  # a batch not written after this long (a Redis outage) is lost
        self._queue: asyncio.Queue[tuple[str, int, Event | None, asyncio.Future[None] | None, float | None]] = \
            asyncio.Queue()
        self.failed: dict[Key, Exception] = {}  # per attempt: why its events stopped being written
        self._live: set[Key] = set()  # attempts between open() and forget()
        self._task: asyncio.Task[None] | None = None
        self._open: dict[Key, TokenEvent] = {}  # per attempt: its last token event, not yet sent
        self._sending = False  # a pipeline is in flight: the writer is really behind

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._drain(), name="event-writer")

    def open(self, job_id: str, attempt: int) -> None:
        """An attempt starts writing (call it once its claim is won)."""
        key = (job_id, attempt)
        self._live.add(key)
        self.failed.pop(key, None)

    def error(self, job_id: str, attempt: int) -> Exception | None:
        """Why the attempt's events stopped being written (:class:`FencedOut`: another attempt or
        a terminal state owns the job), or None while they are written."""
        return self.failed.get((job_id, attempt))

    def emit(self, job_id: str, attempt: int, event: Event, first_token_at: float | None = None) -> None:
        """Queue an event of the job's ``attempt``; it is written with the next batch (with
        ``first_token_at``, that field of the job's record is written with it)."""
        key = (job_id, attempt)
        if key in self.failed:  # an earlier event is lost: this one must not follow it into the log
            return
        if isinstance(event, TokenEvent):
            self._open[key] = event
        else:
            self._open.pop(key, None)
        self._queue.put_nowait((job_id, attempt, event, None, first_token_at))

    def extend(self, job_id: str, attempt: int, index: int, text: str, n_tokens: int) -> bool:
        """Append a delta to the attempt's last token event if that is still waiting to be sent
        (the writer is behind): under load, one message carries several tokens. False if the
        caller must emit a new event (with the next seq)."""
        ev = self._open.get((job_id, attempt))
        # only while a round trip is in flight: an event merely waiting for the writer task to be
        # scheduled must go out as it is, or a busy loop would hold a whole job's tokens back
        if not self._sending or ev is None or ev.index != index or ev.logprobs is not None \
                or ev.prompt_logprobs is not None:
            return False
        ev.text += text
        ev.n_tokens += n_tokens
        return True

    def sink(self, job_id: str, attempt: int) -> AttemptSink:
        """The attempt's events as an :class:`~inferq.worker.jobs.outputs.EventSink`."""
        return AttemptSink(self, job_id, attempt)

    async def note_first_token(self, job_id: str, at: float) -> None:
        """Write the job's ``first_token_at`` on its own, within the budget (a Redis that does not
        answer at all counts too): the job's end waits for it. A failure is logged, and the job
        goes on without the field."""
        try:
            async with asyncio.timeout(self.budget_s):
                await self.store.update(job_id, first_token_at=at)
        except Exception as e:  # a timestamp is not worth failing the job for
            why = f"no answer from Redis in {self.budget_s:g} s" if isinstance(e, TimeoutError) and not str(e) \
                else f"{type(e).__name__}: {e}"
            log.warning("job %s: could not record first_token_at (%s); the job goes on without it", job_id, why)

    async def barrier(self) -> None:
        """Wait until every event emitted so far has been sent (or given up on)."""
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._queue.put_nowait(("", 0, None, fut, None))
        await fut

    def forget(self, job_id: str, attempt: int) -> None:
        """The attempt has ended: drop its state; answers still in flight for it are ignored."""
        key = (job_id, attempt)
        self._live.discard(key)
        self.failed.pop(key, None)
        self._open.pop(key, None)

    async def _drain(self) -> None:
        while True:
            batch = [await self._queue.get()]
            while len(batch) < MAX_BATCH and not self._queue.empty():
                batch.append(self._queue.get_nowait())
            events: list[tuple[str, int, Event, float | None]] = []
            for job_id, attempt, ev, _, first in batch:  # from here on these events are frozen
                if ev is None:
                    continue
                key = (job_id, attempt)
                if self._open.get(key) is ev:
                    del self._open[key]
                if key not in self.failed:  # queued before its attempt failed: never sent
                    events.append((job_id, attempt, ev, first))
            self._sending = True
            started = time.perf_counter()
            try:
                results = await self._send(events) if events else []
            finally:
                self._sending = False
            if events:
                self._write_time.observe(time.perf_counter() - started)
                self._batch_size.observe(len(events))
            for (job_id, attempt, _, _), res in zip(events, results, strict=False):
                err = FencedOut(job_id) if res is False else (res if isinstance(res, Exception) else None)
                key = (job_id, attempt)
                if err is not None and not is_duplicate_id(err) and key in self._live:
                    self.failed.setdefault(key, err)
            for _, _, ev, fut, _ in batch:
                if ev is None and fut is not None and not fut.done():
                    fut.set_result(None)

    async def _send(self, items: list[tuple[str, int, Event, float | None]]) -> list[Exception | bool]:
        try:
            async with asyncio.timeout(self.budget_s):  # a Redis that does not answer at all counts too
                return await retried(lambda: self.store.append(items), self.budget_s)
        except Exception as e:  # Redis unreachable past the budget: these attempts cannot stream
            if isinstance(e, TimeoutError) and not str(e):
                e = TimeoutError(f"no answer from Redis in {self.budget_s:g} s")
            jobs = sorted({job_id for job_id, *_ in items})
            log.error("could not write %d events of %d jobs (%s: %s); their attempts stop: %s",
                      len(items), len(jobs), type(e).__name__, e, ", ".join(jobs[:8]))
            return [e] * len(items)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()


class AttemptSink:
    """One attempt's side of the writer. The first event emitted after :meth:`first_output`
    carries the first output's time to the job's record (``first_token_at``)."""

    def __init__(self, writer: EventWriter, job_id: str, attempt: int) -> None:
        self.writer, self.job_id, self.attempt = writer, job_id, attempt
        self.first_at: float | None = None  # the first output's time, until an event carries it
        self._note: asyncio.Task[None] | None = None

    def first_output(self) -> None:
        """The first output came (call before feeding it)."""
        self.first_at = time.time()

    def first_output_fed(self) -> None:
        """The first output is fed. Usually its first event carried the time to the record; where
        it made no event (a tool-call parser holding text back), a write of its own, without
        holding up the tokens behind it: a slow or absent Redis delays this write, not the job."""
        at, self.first_at = self.first_at, None
        if at is not None:
            self._note = asyncio.get_running_loop().create_task(self.writer.note_first_token(self.job_id, at))

    async def settle(self) -> None:
        """Wait for the first-token write, if one was made (bounded by the budget; never raises)."""
        if self._note is not None:
            await self._note

    def emit(self, event: TokenEvent) -> None:
        self.writer.emit(self.job_id, self.attempt, event, first_token_at=self.first_at)
        self.first_at = None

    def extend(self, index: int, text: str, n_tokens: int) -> bool:
        return self.writer.extend(self.job_id, self.attempt, index, text, n_tokens)

    def check(self) -> None:
        """Raise if the attempt's events stopped being written: :class:`FencedOut` (another attempt
        or a terminal state owns the job) or :class:`EventsLost`."""
        if (err := self.writer.error(self.job_id, self.attempt)) is not None:
            if isinstance(err, FencedOut):
                raise err
            raise EventsLost(f"{type(err).__name__}: {err}")
