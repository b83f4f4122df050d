"""The attempts this worker runs, one per job at most, and every change to their state.

Lives on the engine loop. Everything outside the runner (cancel messages, hand-backs, the
heartbeat's reconciliation) changes an attempt only through these methods.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import Any

from inferq.shared import tracing
from inferq.shared.schemas import Resume

log = logging.getLogger(__name__)


@dataclass
class Attempt:
    """One run of a job on this worker; ``attempt`` is 0 until its claim is won."""

    task: asyncio.Task[Any] | None = None
    cancel_requested: bool = False
    attempt: int = 0
    released: bool = False  # handed back or taken away: its run writes no end
    superseded: bool = False  # a later attempt of the job won its claim on this worker: write no end
    pausable: bool = False  # generating, and a continuation would be the same job (worker/jobs/resume.py)
    paused: str | None = None  # stopped to be handed back with its progress kept, for this reason
    resume: Resume | None = None  # the progress its claim found kept: this attempt continues it
    span: tracing.Span = field(default_factory=tracing.Span)  # this attempt's trace span (tracing on)

    @property
    def writes_end(self) -> bool:
        """Whether this attempt's run, once claimed, ends the job itself."""
        return not self.released and not self.superseded

    def stop(self) -> None:
        """Cancel the attempt's task (its engine request is aborted as the task unwinds)."""
        if self.task is not None:
            self.task.cancel()


class AttemptTable:
    """Job id -> the attempt of it this worker runs, and the runs still waiting for their claim."""

    def __init__(self) -> None:
        self.active: dict[str, Attempt] = {}
        self._claiming: dict[str, list[Attempt]] = {}

    # --- the runner's side --------------------------------------------------------------------
    def claiming(self, job_id: str, run: Attempt) -> None:
        """``run`` sends its claim (a cancel meanwhile only flags it: its claim may win)."""
        self._claiming.setdefault(job_id, []).append(run)

    def claimed(self, job_id: str, run: Attempt) -> None:
        """``run``'s claim came back (won or not)."""
        waiting = self._claiming[job_id]
        waiting.remove(run)
        if not waiting:
            del self._claiming[job_id]

    def take_over(self, job_id: str, run: Attempt) -> bool:
        """Register a run whose claim was won. An earlier attempt of the job still running here
        (the job was requeued while it ran) is stopped. False if a later attempt of the job
        already runs here (its claim's answer came back first): this one is superseded."""
        old = self.active.get(job_id)
        if old is not None and old.attempt > run.attempt:
            log.warning("job %s: attempt %d already runs here; attempt %d stops", job_id, old.attempt, run.attempt)
            run.superseded = True
            return False
        self.active[job_id] = run
        if old is not None:
            log.warning("job %s: attempt %d replaces attempt %d on this worker", job_id, run.attempt, old.attempt)
            old.superseded = True
            old.stop()
        return True

    def done(self, job_id: str, run: Attempt) -> None:
        """``run`` is ending: it no longer holds the job here."""
        if self.active.get(job_id) is run:
            del self.active[job_id]

    # --- everyone else's ----------------------------------------------------------------------
    def cancel(self, job_id: str) -> bool:
        """Cancel whatever attempt of the job this worker runs. A run still waiting for its claim
        is only flagged (its claim may already have taken the job in Redis: it must write the end)."""
        pending = self._claiming.get(job_id, [])
        for waiting in pending:
            waiting.cancel_requested = True
        run = self.active.get(job_id)
        if run is None:
            return bool(pending)
        run.cancel_requested = True
        run.stop()
        return True

    def attempts(self, released: bool = False) -> dict[str, int]:
        """Job id -> attempt of the claimed jobs this worker runs (with ``released``, also those
        given up and still ending). Safe from another thread: one C-level copy."""
        active = dict(self.active)
        return {job_id: run.attempt for job_id, run in active.items()
                if run.attempt and (released or not run.released)}

    def release(self, job_id: str, attempt: int) -> bool:
        """This worker gives the attempt up (handed back, or taken from it): its run will write
        no end. True if the attempt runs here and was not released before."""
        run = self.active.get(job_id)
        if run is None or run.attempt != attempt or run.released:
            return False
        run.released = True
        return True

    def pause(self, job_id: str, attempt: int, reason: str = "preempted") -> asyncio.Task[Any] | None:
        """Stop the attempt's generation so that its run hands the job back with its progress kept
        (worker/jobs/resume.py); its run's task (done once it is handed back), or None where the
        attempt does not run here, was given up, or cannot be paused (hand it back to start over)."""
        run = self.active.get(job_id)
        if run is None or run.attempt != attempt or run.released or not run.pausable or run.task is None:
            return None
        run.paused = reason
        run.stop()
        return run.task

    def stop(self, job_id: str, attempt: int) -> None:
        """End the attempt's run if it still holds the job here (a run that already left is
        writing its end, refused now: it is left be)."""
        run = self.active.get(job_id)
        if run is not None and run.attempt == attempt:
            run.stop()

    def __len__(self) -> int:
        return len(self.active)
