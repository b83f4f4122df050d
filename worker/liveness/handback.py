"""Handing running jobs back to the queue.

:func:`hand_back` is the one way to do it (the reaper uses it for dead workers' jobs): a Lua script
takes the job back only while the given worker (and attempt) still runs it, then a new Celery
message is sent. :class:`LocalHandBack` does it for this worker's own jobs, on the engine loop:
when it drains, when its engine dies, and when it learns that another worker's reaper already
took a job from it (:meth:`LocalHandBack.fence`).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Protocol

from tenacity import AsyncRetrying, stop_after_delay, wait_exponential

from inferq.shared.redis import retried
from inferq.shared.schemas import Resume
from inferq.shared.store import JobStore
from inferq.worker.liveness.unacked import Send

log = logging.getLogger(__name__)
#: How long a hand-back tries to send the job's new message (the broker away); a job whose message
#: was not sent in that time stays marked unsent, and the reaper's next pass sends it.
SEND_BUDGET_S = 5.0
#: Hand-backs of every job where the engine still runs: a job that can be is paused (its progress kept).
PAUSE_REASONS = frozenset({"worker_shutdown", "model_swap"})


async def hand_back(store: JobStore, send: Send, job_id: str, worker_id: str, attempt: int | None,
                    reason: str, max_attempts: int, claimed_before: float | None = None,
                    silent: tuple[str, float] | None = None, send_budget_s: float = SEND_BUDGET_S,
                    resume: Resume | None = None) -> str:
    """Requeue a running job of ``worker_id`` (for another attempt) and send it to the queue again.
    Returns the outcome of :meth:`JobStore.requeue` ('skip': it was not that worker's to give;
    'alive': the worker, judged ``silent``, has beaten since). ``resume``: the progress it keeps (no restart)."""
    outcome = await store.requeue(job_id, worker_id, attempt, reason, max_attempts, claimed_before, silent,
                                  resume)
    if outcome == "requeued":
        await send_again(store, send, job_id, send_budget_s)
    if outcome not in ("skip", "alive"):
        log.warning("job %s handed back (%s): %s", job_id, reason, outcome)
    return outcome


async def send_again(store: JobStore, send: Send, job_id: str, budget_s: float) -> bool:
    """Send the new message of a job just requeued (marked unsent), trying again for ``budget_s``.
    True once it is sent. Never raises: a job whose message could not be sent stays marked unsent
    and queued, and the reaper's sweep sends it (``sweep_unsent``)."""
    try:
        rec = await store.get(job_id)
        if rec is None:  # its record expired: there is nothing to run
            return False
        async for attempt in AsyncRetrying(wait=wait_exponential(multiplier=0.1, max=1.0),
                                           stop=stop_after_delay(budget_s), reraise=True):
            with attempt:
                async with asyncio.timeout(budget_s):  # a broker that does not answer at all counts too
                    await asyncio.to_thread(send, rec.message())
    except Exception as e:
        log.error("job %s: requeued, but its message could not be sent in %g s (%s: %s); the reaper sends it",
                  job_id, budget_s, type(e).__name__, e)
        return False
    try:
        await store.sent(job_id)
    except Exception as e:  # the reaper will send it once more: a duplicate message is harmless
        log.warning("job %s: its message is sent, but could not be marked so (%s)", job_id, e)
    return True


class RunningJobs(Protocol):
    """The attempts this worker runs, as hand-backs see and change them (on the engine loop)."""

    def attempts(self, released: bool = False) -> dict[str, int]:
        """Job id -> attempt of the claimed jobs (with ``released``, also those given up)."""

    def release(self, job_id: str, attempt: int) -> bool:
        """Give the attempt up (its run writes no end); False if not running here or given up before."""

    def stop(self, job_id: str, attempt: int) -> None:
        """End the attempt's run if it still holds the job here."""

    def pause(self, job_id: str, attempt: int, reason: str = "preempted") -> asyncio.Task[Any] | None:
        """Stop the attempt so that its run hands it back (``reason``) with its progress kept; its
        run's task, or None where it cannot be paused."""


class LocalHandBack:
    """This worker's own hand-backs. Runs on the engine loop (the running jobs live there).

    One hand-back per job attempt at a time: a job that hands itself back (its engine died under
    it) and the engine-death path that hands back everything share it, so :meth:`all` returns only
    once every message is sent."""

    def __init__(self, jobs: RunningJobs, store: JobStore, send: Send, worker_id: str, max_attempts: int) -> None:
        self.jobs = jobs
        self.store = store
        self.send = send
        self.worker_id = worker_id
        self.max_attempts = max_attempts
        self._inflight: dict[tuple[str, int], asyncio.Task[str]] = {}

    async def job(self, job_id: str, attempt: int, reason: str, resume: Resume | None = None) -> str:
        """Hand back one attempt of a job (0: not claimed yet, any attempt of this worker); ``resume``:
        with that progress kept (a paused job, handing itself back)."""
        key = (job_id, attempt)
        task = self._inflight.get(key)
        if task is None:
            task = asyncio.get_running_loop().create_task(self._hand_back(job_id, attempt, reason, resume))
            self._inflight[key] = task
            task.add_done_callback(lambda _: self._inflight.pop(key, None))
        return await asyncio.shield(task)

    async def _hand_back(self, job_id: str, attempt: int, reason: str, resume: Resume | None = None) -> str:
        return await retried(lambda: hand_back(self.store, self.send, job_id, self.worker_id, attempt or None,
                                               reason, self.max_attempts, resume=resume))

    async def all(self, reason: str) -> None:
        """Hand back every active job and end its run (no end written); return when every
        hand-back in flight, including those jobs started themselves, is done. A drain's and a
        model's sleep (``PAUSE_REASONS``: the engine still runs) pause the jobs that can be: they
        hand themselves back with their progress kept (worker/jobs/resume.py)."""
        jobs = self.jobs.attempts(released=True)
        paused = {job_id: task for job_id, attempt in jobs.items()
                  if reason in PAUSE_REASONS and (task := self.jobs.pause(job_id, attempt, reason)) is not None}
        await asyncio.gather(*(self._give_up(job_id, attempt, reason) for job_id, attempt in jobs.items()
                               if job_id not in paused), return_exceptions=True)
        if paused:
            await asyncio.wait(paused.values())
        await self.settle()

    async def preempt(self, job_id: str, attempt: int) -> None:
        """Hand back one running attempt to make room for work with a better claim on its slot (reason
        ``preempted``: not counted against the job's attempts) and end its run (worker/jobs/room.py):
        paused, its progress kept, where a continuation is the same job (worker/jobs/resume.py), else
        to start over. Returns once it is handed back (a paused run hands itself back as it ends)."""
        paused = self.jobs.pause(job_id, attempt)
        if paused is not None:
            await asyncio.wait([paused])
            return
        await self._give_up(job_id, attempt, "preempted")

    async def _give_up(self, job_id: str, attempt: int, reason: str) -> None:
        fresh = self.jobs.release(job_id, attempt)  # False: it hands itself back already, leave its run be
        try:
            await self.job(job_id, attempt, reason)
        except Exception:
            log.exception("job %s: could not hand it back (%s)", job_id, reason)
        finally:
            if fresh:
                self.jobs.stop(job_id, attempt)

    async def settle(self) -> None:
        """Wait for every hand-back in flight."""
        while self._inflight:
            await asyncio.gather(*list(self._inflight.values()), return_exceptions=True)

    def fence(self, job_id: str, attempt: int) -> bool:
        """This attempt no longer owns the job (another worker's reaper took it back): end its
        run without writing an end; Celery then acks its message. Call on the engine loop."""
        if not self.jobs.release(job_id, attempt):
            return False
        log.warning("job %s: attempt %d was taken back from this worker; stopping it", job_id, attempt)
        self.jobs.stop(job_id, attempt)
        return True
