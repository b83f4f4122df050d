"""How an attempt ends: what its exception means (:func:`outcome_of`), then its terminal state
written, or the job handed back for another attempt (:class:`Ending`).

Ending writes are persisted until Redis answers, however long it is away (:func:`persist`): the
worker is alive, so no reaper would ever end the attempt in its place.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

from tenacity import AsyncRetrying, RetryCallState, retry_if_exception_type, wait_exponential

from inferq.shared.errors import EngineError, InferqError, InvalidRequest
from inferq.shared.redis import TRANSIENT, retried
from inferq.shared.schemas import EngineStats, ErrorInfo, JobStatus, Resume
from inferq.shared.store import JobStore
from inferq.worker.jobs.outputs import Progress
from inferq.worker.jobs.sampling import client_error, engine_dead
from inferq.worker.jobs.writer import EventsLost, EventWriter, FencedOut

log = logging.getLogger(__name__)
T = TypeVar("T")
#: (job id, attempt, reason, progress kept) -> requeue the job and send it again; the requeue's outcome
HandBack = Callable[[str, int, str, Resume | None], Awaitable[str]]


@dataclass
class Outcome:
    """How an attempt ends: the status to write (None: none), its error, or a hand-back."""

    status: JobStatus | None
    error: ErrorInfo | None = None
    hand_back: str | None = None  # set: requeue the job for another attempt instead of ending it
    fenced: bool = False  # stopped as fenced out: an end written anyway is worth a log line
    engine_dead: bool = False  # the engine died under it: the caller hands it back and starts the exit
    resume: Resume | None = None  # a hand-back that keeps the job's progress (paused: worker/jobs/resume.py)


def outcome_of(e: BaseException, job_id: str, attempt: int, writes_end: bool) -> Outcome:
    """What an exception out of a run means for the attempt (``writes_end``: it was not released
    or superseded, so a cancel is the client's)."""
    if isinstance(e, asyncio.CancelledError):
        return Outcome(JobStatus.cancelled if writes_end else None)
    if isinstance(e, FencedOut):
        # normally another attempt (or a cancel) owns the job now and this end is refused; if
        # the record still says running under this attempt, nobody else would ever end it
        log.warning("job %s: attempt %d no longer owns it; stopped", job_id, attempt)
        return Outcome(JobStatus.failed, ErrorInfo(
            type="server_error", code="internal_error", message=f"attempt {attempt} was stopped as if another "
            "attempt owned the job, but none did; the job was ended here rather than left running"), fenced=True)
    if isinstance(e, EventsLost):
        log.error("job %s: attempt %d could not log its events (%s); handing the job back", job_id, attempt, e)
        return Outcome(None, hand_back="event_write_failed")
    if isinstance(e, InferqError):
        return Outcome(JobStatus.failed, ErrorInfo.of(e))
    if engine_dead(e):
        log.error("job %s: the engine died; handing the job back", job_id)
        return Outcome(None, engine_dead=True)
    if client_error(e):  # the engine refused the request itself (vLLM's validation)
        return Outcome(JobStatus.failed, ErrorInfo.of(InvalidRequest(str(e), param=getattr(e, "parameter", None))))
    log.error("job %s failed", job_id, exc_info=e)
    return Outcome(JobStatus.failed, ErrorInfo.of(EngineError(f"{type(e).__name__}: {e}")))


async def persist(op: Callable[[], Awaitable[T]], what: str, budget_s: float) -> T:
    """``await op()`` (a Redis write that ends an attempt, or a claim: writes that must not be given
    up on while this worker lives, and that are safe to repeat) until Redis answers: each try bounded
    by ``budget_s`` (retried within it), then again after a pause growing from 0.1 s to 5 s."""

    def note(state: RetryCallState) -> None:
        e = state.outcome.exception() if state.outcome else None
        log.error("could not %s (%s: %s); trying again", what, type(e).__name__,
                  str(e) or f"no answer in {budget_s:g} s")

    async for attempt in AsyncRetrying(retry=retry_if_exception_type(TRANSIENT), before_sleep=note,
                                       wait=wait_exponential(multiplier=0.1, max=5.0), reraise=True):
        with attempt:
            async with asyncio.timeout(budget_s):  # a Redis that does not answer at all counts too
                return await retried(op, budget_s)
    raise AssertionError("unreachable")  # never stops retrying


class Ending:
    """Writes attempts' ends: the terminal state and final event, or a hand-back."""

    def __init__(self, store: JobStore, writer: EventWriter, worker_id: str, stats: EngineStats,
                 hand_back: HandBack | None = None, max_attempts: int = 3) -> None:
        self.store = store
        self.writer = writer
        self.worker_id = worker_id
        self.stats = stats
        self.hand_back = hand_back  # None: requeue in Redis only (the reaper's sweep re-sends it)
        self.max_attempts = max_attempts

    async def end(self, job_id: str, attempt: int, outcome: Outcome, p: Progress) -> JobStatus | None:
        """End the attempt: write its terminal state, or hand the job back for another attempt.
        Returns the status written (None: the job was handed back, or is not this attempt's)."""
        status, hand_back = outcome.status, outcome.hand_back
        if status is None and hand_back is None:
            return None
        await self.writer.barrier()  # every event emitted is logged (or given up on) before the end
        lost = self.writer.error(job_id, attempt)
        if hand_back is None and status is not JobStatus.failed and lost is not None \
                and not isinstance(lost, FencedOut):
            # the end would follow a hole: never `succeeded` with a stream that does not replay
            log.error("job %s: attempt %d could not log all its events (%s); handing the job back",
                      job_id, attempt, lost)
            hand_back = "event_write_failed"
        if hand_back is not None:  # progress is kept only where every event made it to the log
            await self._hand_back(job_id, attempt, hand_back, outcome.resume if lost is None else None)
            return None
        assert status is not None
        written = await self._finish(job_id, attempt, status, p, outcome.error)
        if outcome.fenced and written is not None:
            log.error("job %s: attempt %d was stopped as fenced out but still owned the job: ended it %s",
                      job_id, attempt, written.value)
        return written

    async def _hand_back(self, job_id: str, attempt: int, reason: str, resume: Resume | None = None) -> None:
        async def once() -> str:
            if self.hand_back is not None:
                return await self.hand_back(job_id, attempt, reason, resume)
            return await self.store.requeue(job_id, self.worker_id, attempt, reason, self.max_attempts,
                                            resume=resume)

        try:
            outcome = await persist(once, f"hand job {job_id} back", self.writer.budget_s)
        except Exception:
            log.exception("job %s: attempt %d could not be handed back (%s)", job_id, attempt, reason)
            return
        kept = f", {len(resume.ids)} tokens kept" if resume is not None else ""
        log.warning("job %s: attempt %d handed back (%s%s): %s", job_id, attempt, reason, kept, outcome)

    async def _finish(self, job_id: str, attempt: int, status: JobStatus, p: Progress,
                      error: ErrorInfo | None) -> JobStatus | None:
        fields, event = p.end(status, error)
        # the end check (in Redis): a `succeeded` or `cancelled` end must directly follow every event
        # this attempt wrote; a failure's end goes after whatever its log holds
        write: Callable[[], Awaitable[JobStatus | None]] = lambda: self.store.finish(  # noqa: E731
            job_id, self.worker_id, attempt, event, check_log=status is not JobStatus.failed,
            queue_list=p.queue_list, **fields)
        try:
            written = await persist(write, f"record the end of job {job_id} ({status.value})", self.writer.budget_s)
        except Exception:
            log.exception("job %s: could not record its end (%s)", job_id, status.value)
            return None
        if written is None:
            log.info("job %s: attempt %d no longer owns it; its end (%s) was not written", job_id, attempt,
                     status.value)
        elif written is not status:
            log.error("job %s: attempt %d's log is incomplete; it ended %s instead of %s", job_id, attempt,
                      written.value, status.value)
        if written is not None:
            self.stats.jobs_finished += 1
        return written
