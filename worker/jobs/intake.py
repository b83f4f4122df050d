"""How a worker takes a job Celery hands it (on one of Celery's threads): count it in the load it
publishes, place it (cache-affine pull: run it here or pass it to the worker whose cache holds its
prefix or adapter), then run it on the engine loop and wait for its end.

The prompt is tokenized on the taking thread (it would wait anyway) while the engine loop claims the
job: no hand-off to a tokenizing thread on the job's way to the engine. With cache-affine pull the
prompt is tokenized before placing (its blocks decide where it runs), and once the job is claimed
here its prefix is recorded as this engine's.
"""

from __future__ import annotations

import concurrent.futures
import threading

from inferq.shared.schemas import JobMessage, JobStatus
from inferq.worker.engine.host import EngineHost
from inferq.worker.jobs.affinity import Affinity
from inferq.worker.jobs.prepare import Prepared
from inferq.worker.jobs.runner import JobRunner


class Intake:
    def __init__(self, host: EngineHost) -> None:
        self.host = host
        self.runner: JobRunner | None = None  # set once the job path has started
        self.affinity: Affinity | None = None  # cache-affine pull; None: plain pull
        self._kept, self._taking = 0, threading.Lock()  # jobs taken here (not passed on, not ended)
        self._publishing = threading.Lock()  # one thread at a time writes the count for the fleet
        self._stale = False  # the count changed since the last write began

    def load(self) -> int:
        """Jobs this worker holds while it decides where a job runs: those taken and not passed on
        or ended, the one being decided included. A burst taken at once counts whole from the
        start: other workers placing jobs meanwhile see it, not only the jobs placed so far."""
        return self._kept

    def _hold(self, n: int) -> None:
        with self._taking:
            self._kept += n
        if self.affinity is not None:
            self._publish(self.affinity)

    def _publish(self, affinity: Affinity) -> None:
        """Write the count as it is now, outside the count's lock: one thread writes at a time, and
        a change made while it writes is written by it again after (the last write always has the
        latest count; changes that meet in one write cost one round trip)."""
        self._stale = True  # before trying: a writer that is busy now sees it when it is done
        while self._stale and self._publishing.acquire(blocking=False):
            try:
                self._stale = False
                affinity.publish_load(self._kept)
            finally:
                self._publishing.release()

    def take(self, msg: JobMessage) -> JobStatus | None:
        """Run the job here and return the state written, or pass it on (None)."""
        self._hold(1)  # counted (and published) from the moment it is taken, placed or not yet
        passed = False
        affinity = self.affinity if self.affinity is not None and self.affinity.on() else None
        try:
            early = self._early(msg) if affinity is not None else None
            if affinity is not None:  # passed to the worker that holds its prefix or adapter, or kept here
                ids = early.ids if isinstance(early, Prepared) else msg.prompt_ids or msg.request.prompt_token_ids
                passed = affinity.route(msg, ids, passed=lambda: self._hold(-1))
                if passed:
                    return None
                if not affinity.wants_claim(msg, ids):  # its claim has nothing to record
                    affinity = None
            return self._run(msg, early, affinity)
        finally:
            if not passed:
                self._hold(-1)

    def _run(self, msg: JobMessage, early: Prepared | Exception | None, affinity: Affinity | None) -> JobStatus | None:
        """Run the job here (``affinity``: the claim is recorded for it) and wait for its end."""
        assert self.runner is not None, "worker runtime not started"
        prepared: concurrent.futures.Future[Prepared] = concurrent.futures.Future()
        claimed: concurrent.futures.Future[bool] | None = concurrent.futures.Future() if affinity else None
        result = self.host.submit(self.runner.run(msg, prepared, claimed))
        if prepared.set_running_or_notify_cancel():  # False: the run ended without waiting for it
            try:
                if isinstance(early, BaseException):
                    raise early
                prepared.set_result(early or self.runner.prepare(msg))
            except BaseException as e:  # raised where the run reads it, after its claim
                prepared.set_exception(e)
                if not isinstance(e, Exception):
                    raise
        if claimed is not None and claimed.result() and prepared.done() and not prepared.cancelled() \
                and prepared.exception() is None and affinity is not None:  # its prefix is this engine's now
            affinity.ran_here(msg, prepared.result().ids)
        return result.result()

    def _early(self, msg: JobMessage) -> Prepared | Exception | None:
        """For cache-affine pull, the prompt tokenized before the claim where neither the gateway
        nor the client gave its token ids (None: they did); what preparing raised is kept for the
        run to report after its claim."""
        if msg.prompt_ids is not None or msg.request.prompt_token_ids is not None or msg.request.embed is not None:
            return None  # (an embedding job is run where it is taken: it has no prefix to follow)
        assert self.runner is not None, "worker runtime not started"
        try:
            return self.runner.prepare(msg)
        except Exception as e:
            return e
