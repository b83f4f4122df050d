"""JobRunner: runs one attempt of a job on the shared engine, from its claim to its end.

Life of a job on a worker: claim it (queued -> running; a cancelled or taken job is skipped),
tokenize and check it against the context window (``prepare``, ``sampling``), stream the engine's
DELTA outputs as ``token`` events (``outputs``, through the batched ``writer``), and, whatever
happens, write the terminal state and the final ``done``/``error`` event in ``finally``
(``ending``). Cancellation is one mechanism: cancelling the job's asyncio task, which makes vLLM's
``generate`` abort the request in the engine and free its KV blocks.

Ownership is per attempt: the claim makes this run attempt N of the job, and everything it does
afterwards (events, the end, the writer's state) is keyed by (job, N). A worker runs at most one
attempt of a job (``attempts``): a later attempt that wins its claim here stops the earlier one,
and its engine request starts only after the earlier one's has been aborted.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import secrets
import threading
import time
from collections.abc import Awaitable, Callable
from contextlib import aclosing
from typing import Any

from inferq.shared import keys, tracing
from inferq.shared.errors import DeadlineExceeded, EngineError
from inferq.shared.logs import job_context
from inferq.shared.pooling import check_task
from inferq.shared.schemas import ErrorInfo, JobMessage, JobStatus
from inferq.shared.store import JobStore
from inferq.worker.engine.host import EngineHost
from inferq.worker.jobs.attempts import Attempt, AttemptTable
from inferq.worker.jobs.ending import Ending, HandBack, Outcome, outcome_of, persist
from inferq.worker.jobs.latency import BatchLimit, Watch
from inferq.worker.jobs.outputs import OutputEvents, Progress
from inferq.worker.jobs.pooling import embed, fitted
from inferq.worker.jobs.prepare import Prepared, Preparer
from inferq.worker.jobs.prompt import PromptReturn
from inferq.worker.jobs.resume import continuation, kept, resumable
from inferq.worker.jobs.sampling import sampling_params
from inferq.worker.jobs.toolcalls import parser_class, tool_streams
from inferq.worker.jobs.writer import AttemptSink, EventWriter
from inferq.worker.metrics import ADAPTER_JOBS, JOBS_CLAIMED, JOBS_FINISHED

log = logging.getLogger(__name__)


class JobRunner:
    def __init__(self, host: EngineHost, store: JobStore, writer: EventWriter, worker_id: str, default_max_tokens: int,
                 priority_scheduling: bool = False, on_engine_dead: Callable[[str, int], Awaitable[None]] | None = None,
                 hand_back: HandBack | None = None, max_attempts: int = 3, tool_call_parser: str | None = None,
                 latency: BatchLimit | None = None, batch_event_interval_s: float = 0.0) -> None:
        self.host = host
        self.batch_event_interval_s = batch_event_interval_s  # a batch job's text goes out at most this often
        # vLLM's tool-call parser for tool_choice "auto" (an unknown name fails the worker's start)
        self.tool_parser = parser_class(tool_call_parser) if tool_call_parser else None
        self.store = store
        self.writer = writer
        self.worker_id = worker_id
        self.default_max_tokens = default_max_tokens
        self.priority_scheduling = priority_scheduling
        self.on_engine_dead = on_engine_dead
        self.latency = latency  # interactive jobs' latencies, which the batch limit follows (service classes)
        self.attempts = AttemptTable()
        self.preparer = Preparer(host)
        self.ending = Ending(store, writer, worker_id, host.stats, hand_back, max_attempts)
        self._engine_busy: dict[str, asyncio.Event] = {}  # job id -> set when its generation ends
        self._runs = 0  # runs in progress, claimed or not
        self.idle = threading.Event()  # set while no run is in progress (a drain waits for it)
        self.idle.set()

    @property
    def active(self) -> dict[str, Attempt]:
        """Job id -> the attempt of it this worker runs (read it; change it through ``attempts``)."""
        return self.attempts.active

    def cancel(self, job_id: str) -> bool:
        """Cancel whatever attempt of the job this worker runs (on the engine loop)."""
        return self.attempts.cancel(job_id)

    def prepare(self, msg: JobMessage) -> Prepared:
        """Tokenize the job's prompt (and render its echo): CPU work for a thread, never the loop."""
        return self.preparer.prepare(msg)

    async def run(self, msg: JobMessage, prepared: concurrent.futures.Future[Prepared] | None = None,
                  claimed: concurrent.futures.Future[bool] | None = None) -> JobStatus | None:
        """Run the job to a terminal state. Returns the state written, or None if it was not this
        run's to end (skipped, fenced out, superseded or handed back). ``prepared``: the job's
        :meth:`prepare`, made by the caller's thread while the claim is in flight (without it,
        the runner tokenizes on a thread of its own after the claim). ``claimed``: whether it won the claim."""
        run = Attempt(task=asyncio.current_task())
        self._runs += 1
        self.idle.clear()
        written: JobStatus | None = None
        try:
            with job_context(msg.id), tracing.span("inferq.job", parent=msg.traceparent, job_id=msg.id,
                                                   model=msg.model) as span:
                run.span = span
                written = await self._run(msg, run, prepared, claimed)
                span.set("inferq.attempt", run.attempt)
                span.set("inferq.status", written.value if written else "not_ended")
            return written
        finally:
            if claimed is not None and not claimed.done():
                claimed.set_result(False)
            if run.attempt:  # this run claimed the job
                outcome = written.value if written else "not_ended"
                JOBS_FINISHED.labels(msg.model, outcome).inc()
                log.info("job %s attempt %d: %s", msg.id, run.attempt, written.value if written else
                         "not ended here", extra={"job_id": msg.id})
            self._runs -= 1
            if not self._runs:
                self.idle.set()

    async def _run(self, msg: JobMessage, run: Attempt, prepared: concurrent.futures.Future[Prepared] | None,
                   claimed: concurrent.futures.Future[bool] | None = None) -> JobStatus | None:
        progress = Progress(queue_list=keys.queue_lists(msg.model)[msg.request.priority])  # its fair share's
        outcome = Outcome(None)
        sink: AttemptSink | None = None  # set once the claim is won
        try:
            if not await self._claim(msg, run, progress):
                return None
            if claimed is not None:
                claimed.set_result(True)
            sink = self.writer.sink(msg.id, run.attempt)
            if not self.attempts.take_over(msg.id, run):
                return None
            outcome.status = JobStatus.running
            await self._execute(msg, run, prepared, progress, sink)
            outcome.status = JobStatus.succeeded
        except (asyncio.CancelledError, Exception) as e:
            outcome = outcome_of(e, msg.id, run.attempt, run.writes_end)
            if run.paused is not None and outcome.status is JobStatus.cancelled and not run.cancel_requested:
                outcome = Outcome(None, hand_back=run.paused, resume=kept(progress))  # worker/jobs/resume.py
            if outcome.engine_dead:
                outcome = await self._engine_died(msg.id, run, e)
        finally:
            self.attempts.done(msg.id, run)
            written = None
            try:
                if sink is not None and run.writes_end:
                    await sink.settle()  # the first-token write goes before the end
                    written = await self.ending.end(msg.id, run.attempt, outcome, progress)
            finally:
                if sink is not None:
                    self.writer.forget(msg.id, run.attempt)
        return written

    async def _claim(self, msg: JobMessage, run: Attempt, progress: Progress) -> bool:
        """Claim the job (queued -> running) as a new attempt; False if it was not queued."""
        token = secrets.token_hex(8)  # a retried claim whose answer was lost (or never came) is still ours
        self.attempts.claiming(msg.id, run)
        try:  # until Redis answers (a claim given up on may have taken the job); rooms: interactive work's only
            room = keys.room(msg.model, msg.tenant) if msg.tenant and msg.request.service_class != "batch" else None
            claim = await persist(lambda: self.store.claim(msg.id, self.worker_id, token, progress.queue_list, room),
                                  f"claim job {msg.id}", self.writer.budget_s)
        finally:
            self.attempts.claimed(msg.id, run)
        if claim is None or claim.previous is not JobStatus.queued:
            log.info("job %s skipped: status %s", msg.id, claim and claim.previous.value)
            return False
        run.attempt, progress.seq, run.resume = claim.attempt, claim.last_seq, claim.resume
        JOBS_CLAIMED.labels(msg.model).inc()
        if msg.adapter is not None:
            ADAPTER_JOBS.labels(msg.model, msg.adapter.name).inc()
        run.span.event("claimed", attempt=run.attempt, worker=self.worker_id)
        self.writer.open(msg.id, run.attempt)
        return True

    async def _execute(self, msg: JobMessage, run: Attempt, prepared: concurrent.futures.Future[Prepared] | None,
                       progress: Progress, sink: AttemptSink) -> None:
        """Run the claimed job (a generation, or an embedding's inputs) to its end; raises on any failure."""
        self.host.stats.jobs_started += 1
        left = (msg.deadline or float("inf")) - time.time()
        if left <= 0:
            raise DeadlineExceeded("the job was still queued at its deadline; it never started")
        if run.cancel_requested:
            raise asyncio.CancelledError
        pre = await self.preparer.prepared(msg, prepared)
        check_task(self.host.tasks, msg.request.embed is not None, msg.model)
        extra: dict[str, Any] = {"priority": msg.request.priority} if self.priority_scheduling else {}
        try:
            async with asyncio.timeout(left if left != float("inf") else None):
                if msg.adapter is not None:
                    extra["lora_request"] = await self.host.adapters.request(msg.adapter)
                if (spec := msg.request.embed) is not None and pre.inputs is not None:  # an embedding job
                    inputs = fitted(pre.inputs, spec, self.host.max_model_len)
                    progress.embedding_tokens = [len(ids) for ids in inputs]
                    progress.prompt_tokens = sum(progress.embedding_tokens)
                    progress.embeddings = await embed(self.host.engine, msg.id, inputs, spec, extra)
                    return
                progress.prompt_tokens = len(pre.ids)
                req, resume, tok = msg.request, run.resume, self.host.tokenizer
                params = sampling_params(req, len(pre.ids), self.host.max_model_len, self.default_max_tokens)
                hold = self.batch_event_interval_s if req.service_class == "batch" else 0.0
                calls = tool_streams(self.tool_parser, tok, req) if resume is None else None  # resume.py
                ids = continuation(progress, pre.ids, resume, params, resumable(req, calls is not None))
                if ids is None:  # paused on its last token: nothing is left to generate
                    return
                events = OutputEvents(progress, PromptReturn(pre.ids, pre.echo, req.logprobs, self.host.tokenizer),
                                      self.host.tokenizer, params.logprobs, sink, calls, hold)
                watched = req.service_class == "interactive" and resume is None  # a continuation has no TTFT
                watch = Watch(self.latency if watched else None, msg.created_at)
                await self._generate(msg.id, run, ids, params, events, sink, extra, watch)
        except TimeoutError:
            raise DeadlineExceeded("the job ran past its deadline and was aborted") from None

    async def _generate(self, job_id: str, run: Attempt, ids: list[int], params: Any, events: OutputEvents,
                        sink: AttemptSink, extra: dict[str, Any], watch: Watch) -> None:
        """``extra``: the engine request's priority and LoRA adapter, where it has them."""
        from vllm.inputs import TokensPrompt

        # one generation per job on this worker: an earlier attempt's must have ended (its engine
        # request aborted) before this one starts with the same request id
        while (busy := self._engine_busy.get(job_id)) is not None:
            await busy.wait()
        done = self._engine_busy[job_id] = asyncio.Event()
        first = True
        run.pausable = events.p.ids is not None  # it may be paused from here on (worker/jobs/resume.py)
        try:
            # closing the generator (on any exit) is what aborts the engine request
            async with aclosing(self.host.engine.generate(TokensPrompt(prompt_token_ids=ids), params,
                                                          request_id=job_id, **extra)) as outputs:
                async for out in outputs:
                    watch.output()  # an interactive job's latencies, for the batch limit
                    if first and run.resume is None:  # a continuation's first token was its first attempt's
                        sink.first_output()
                    sink.check()
                    events.feed(out)
                    if first:
                        first = False
                        sink.first_output_fed()
                        run.span.event("first_token")
        finally:
            run.pausable = False
            events.flush()  # held text (batch work) goes out before the attempt's end
            del self._engine_busy[job_id]
            done.set()
            watch.flush()

    async def _engine_died(self, job_id: str, run: Attempt, e: BaseException) -> Outcome:
        """The engine died under the job: hand it back (its exit path starts) or, with nobody to tell, fail it."""
        if self.on_engine_dead is None:
            return Outcome(JobStatus.failed, ErrorInfo.of(EngineError(f"{type(e).__name__}: {e}")))
        run.released = True
        await self.on_engine_dead(job_id, run.attempt)
        return Outcome(None)
