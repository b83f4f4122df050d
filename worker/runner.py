"""JobRunner: runs one job on the shared engine and turns its outputs into stream events.

Life of a job on a worker: claim it (queued -> running; a cancelled or taken job is skipped),
tokenize and check it against the context window (token ids given as the prompt: against the
vocabulary), stream the engine's DELTA outputs as ``token`` events (with what the job gives back
of its prompt: worker/prompt.py), and, whatever happens, write the terminal state and the final
``done``/``error`` event in ``finally``. Cancellation is one mechanism: cancelling the job's asyncio
task, which makes vLLM's ``generate`` abort the request in the engine and free its KV blocks.

Ownership is per attempt: the claim makes this run attempt N of the job, and everything it does
afterwards (events, the end, the writer's state) is keyed by (job, N). A worker runs at most one
attempt of a job: a later attempt that wins its claim here stops the earlier one, and its engine
request starts only after the earlier one's has been aborted.
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
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from inferq.shared import tracing
from inferq.shared.errors import ContextLengthExceeded, DeadlineExceeded, EngineError, InferqError, InvalidRequest
from inferq.shared.logs import job_context
from inferq.shared.redis import TRANSIENT, retried
from inferq.shared.request_limits import check_token_ids
from inferq.shared.schemas import (
    ChoiceEnd,
    ChoiceView,
    DoneEvent,
    ErrorEvent,
    ErrorInfo,
    JobMessage,
    JobStatus,
    TokenEvent,
    Usage,
)
from inferq.shared.store import JobStore
from inferq.worker.engine import EngineHost
from inferq.worker.metrics import JOBS_CLAIMED, JOBS_FINISHED
from inferq.worker.prompt import PromptReturn, encode_request, sampled_logprobs
from inferq.worker.toolcalls import ToolCallStream, parser_class
from inferq.worker.writer import EventWriter, FencedOut

log = logging.getLogger(__name__)


@dataclass
class ActiveJob:
    task: asyncio.Task[Any] | None = None
    cancel_requested: bool = False
    attempt: int = 0
    handed_back: bool = False  # requeued by this worker (drain, engine failure): write no end
    span: tracing.Span = field(default_factory=tracing.Span)  # this attempt's trace span (tracing on)
    superseded: bool = False  # a later attempt of the job won its claim on this worker: write no end


class EventsLost(Exception):
    """Events of this attempt could not be logged (Redis away past the write budget): nothing
    after them may be logged, so the attempt stops and the job goes back to the queue."""


@dataclass
class Progress:
    """What a job has produced so far; becomes the final record and ``done`` event."""

    seq: int = 0
    prompt_tokens: int = 0
    texts: dict[int, list[str]] = field(default_factory=dict)  # per completion, its pieces
    tokens: dict[int, int] = field(default_factory=dict)
    finish: dict[int, ChoiceEnd] = field(default_factory=dict)

    def usage(self) -> Usage:
        done = sum(self.tokens.values())
        return Usage(prompt_tokens=self.prompt_tokens, completion_tokens=done,
                     total_tokens=self.prompt_tokens + done)


@dataclass
class Prepared:
    """A job's prompt as the engine takes it: its token ids and, with ``echo``, its text."""

    ids: list[int]
    echo: str | None = None


class JobRunner:
    def __init__(self, host: EngineHost, store: JobStore, writer: EventWriter, worker_id: str,
                 default_max_tokens: int, priority_scheduling: bool = False,
                 on_engine_dead: Callable[[str, int], Awaitable[None]] | None = None,
                 hand_back: Callable[[str, int, str], Awaitable[str]] | None = None,
                 max_attempts: int = 3, tool_call_parser: str | None = None) -> None:
        self.host = host
        # vLLM's tool-call parser for tool_choice "auto" (an unknown name fails the worker's start)
        self.tool_parser = parser_class(tool_call_parser) if tool_call_parser else None
        self.store = store
        self.writer = writer
        self.worker_id = worker_id
        self.default_max_tokens = default_max_tokens
        self.priority_scheduling = priority_scheduling
        self.on_engine_dead = on_engine_dead
        # (job id, attempt, reason) -> requeue the job and send it again; None: requeue it in Redis
        # only (the reaper's sweep re-sends a queued job that has no message)
        self.hand_back = hand_back
        self.max_attempts = max_attempts
        self.active: dict[str, ActiveJob] = {}  # job id -> the attempt of it this worker runs
        self._claiming: dict[str, list[ActiveJob]] = {}  # job id -> runs waiting for their claim
        self._engine_busy: dict[str, asyncio.Event] = {}  # job id -> set when its generation ends
        self._first_token_notes: dict[tuple[str, int], asyncio.Task[None]] = {}  # its first_token_at write
        self._tok_lock = threading.Lock()
        self._runs = 0  # runs in progress, claimed or not
        self.idle = threading.Event()  # set while no run is in progress (a drain waits for it)
        self.idle.set()

    # --- called from the control channel -----------------------------------------------------
    def cancel(self, job_id: str) -> bool:
        """Cancel whatever attempt of the job this worker runs. A run still waiting for its claim
        is only flagged (its claim may already have taken the job in Redis: it must write the end)."""
        pending = self._claiming.get(job_id, [])
        for job in pending:
            job.cancel_requested = True
        job = self.active.get(job_id)
        if job is None:
            return bool(pending)
        job.cancel_requested = True
        if job.task is not None:
            job.task.cancel()
        return True

    # --- preparing a job (runs in a thread: tokenization is CPU work) -------------------------
    def prepare(self, msg: JobMessage) -> Prepared:
        """Tokenize the job's prompt (and render its echo): CPU work for a thread, never the loop."""
        ids = self.prompt_ids(msg)
        return Prepared(ids, self.echo_text(msg, ids) if msg.request.echo else None)

    def prompt_ids(self, msg: JobMessage) -> list[int]:
        """The job's prompt as token ids: as the gateway tokenized it, as given, or tokenized here."""
        req = msg.request
        if msg.prompt_ids is not None:
            return self._checked_ids(msg.prompt_ids)
        if req.prompt_token_ids is not None:
            return self._checked_ids(req.prompt_token_ids)
        with self._tok_lock:
            return encode_request(self.host.tokenizer, req)

    def _checked_ids(self, ids: list[int]) -> list[int]:
        """A prompt given as token ids, each in the model's vocabulary (vLLM refuses others too,
        without naming the field)."""
        if self.host.vocab_size:  # 0: unknown (the engine still checks, naming no field)
            check_token_ids(ids, self.host.vocab_size)
        return list(ids)

    def echo_text(self, msg: JobMessage, ids: list[int]) -> str | None:
        """With ``echo``, the prompt's text: as given, or its token ids decoded (as vLLM does)."""
        req = msg.request
        if not req.echo:
            return None
        if req.prompt is not None:
            return req.prompt
        with self._tok_lock:
            return str(self.host.tokenizer.decode(ids))

    def sampling_params(self, msg: JobMessage, prompt_tokens: int) -> Any:
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind, StructuredOutputsParams

        o = msg.request
        max_tokens = o.max_tokens or min(self.default_max_tokens, self.host.max_model_len - prompt_tokens)
        if max_tokens < 1 or prompt_tokens + max_tokens > self.host.max_model_len:
            raise ContextLengthExceeded(prompt_tokens, max(max_tokens, 1), self.host.max_model_len,
                                        o.prompt_param)
        structured = None
        if o.json_schema is not None:
            structured = StructuredOutputsParams(json=o.json_schema)
        elif o.json_object:
            structured = StructuredOutputsParams(json_object=True)
        elif o.choice is not None:
            structured = StructuredOutputsParams(choice=list(o.choice))
        elif o.regex is not None:
            structured = StructuredOutputsParams(regex=o.regex)
        elif o.grammar is not None:
            structured = StructuredOutputsParams(grammar=o.grammar)
        prompt_logprobs = o.prompt_logprobs
        if prompt_logprobs is None and o.echo:  # an echo with logprobs has the prompt's (as vLLM)
            prompt_logprobs = o.logprobs
        try:
            return SamplingParams(
                n=o.n, max_tokens=max_tokens, temperature=o.temperature, top_p=o.top_p,
                top_k=o.top_k, min_p=o.min_p, stop=o.stop or None, seed=o.seed,
                presence_penalty=o.presence_penalty, frequency_penalty=o.frequency_penalty,
                repetition_penalty=o.repetition_penalty, ignore_eos=o.ignore_eos,
                min_tokens=o.min_tokens, stop_token_ids=o.stop_token_ids or None,
                logprobs=o.logprobs, structured_outputs=structured, logit_bias=o.logit_bias or None,
                prompt_logprobs=prompt_logprobs,
                output_kind=RequestOutputKind.DELTA,
            )
        except Exception as e:
            if isinstance(e, ValueError) or _client_error(e):  # vLLM's own validation of the request
                raise InvalidRequest(str(e), param=getattr(e, "parameter", None)) from e
            raise

    # --- running a job (on the engine loop) ---------------------------------------------------
    async def run(self, msg: JobMessage,
                  prepared: concurrent.futures.Future[Prepared] | None = None) -> JobStatus | None:
        """Run the job to a terminal state. Returns the state written, or None if it was not this
        run's to end (skipped, fenced out, superseded or handed back). ``prepared``: the job's
        :meth:`prepare`, made by the caller's thread while the claim is in flight (without it,
        the runner tokenizes on a thread of its own after the claim)."""
        job = ActiveJob(task=asyncio.current_task())
        self._runs += 1
        self.idle.clear()
        written: JobStatus | None = None
        try:
            with job_context(msg.id), tracing.span("inferq.job", parent=msg.traceparent, job_id=msg.id,
                                                   model=msg.model) as span:
                job.span = span
                written = await self._run(msg, job, prepared)
                span.set("inferq.attempt", job.attempt)
                span.set("inferq.status", written.value if written else "not_ended")
            return written
        finally:
            if job.attempt:  # this run claimed the job
                JOBS_FINISHED.labels(msg.model, written.value if written else "not_ended").inc()
                log.info("job %s attempt %d: %s", msg.id, job.attempt, written.value if written else "not ended here",
                         extra={"job_id": msg.id})
            self._runs -= 1
            if not self._runs:
                self.idle.set()

    async def _run(self, msg: JobMessage, job: ActiveJob,
                   prepared: concurrent.futures.Future[Prepared] | None) -> JobStatus | None:
        progress = Progress()
        status: JobStatus | None = None
        error: ErrorInfo | None = None
        hand_back: str | None = None  # set: requeue the job for another attempt instead of ending it
        claimed = fenced = False
        try:
            claim, token = None, secrets.token_hex(8)  # a retried claim whose answer was lost is still ours
            self._claiming.setdefault(msg.id, []).append(job)
            try:
                claim = await retried(lambda: self.store.claim(msg.id, self.worker_id, token))
            finally:
                self._claiming[msg.id].remove(job)
                if not self._claiming[msg.id]:
                    del self._claiming[msg.id]
            if claim is None or claim.previous is not JobStatus.queued:
                log.info("job %s skipped: status %s", msg.id, claim and claim.previous.value)
                return None
            job.attempt, progress.seq, claimed = claim.attempt, claim.last_seq, True
            JOBS_CLAIMED.labels(msg.model).inc()
            job.span.event("claimed", attempt=job.attempt, worker=self.worker_id)
            self.writer.open(msg.id, job.attempt)
            if not self._take_over(msg.id, job):
                return None
            status = JobStatus.running
            self.host.stats.jobs_started += 1
            left = (msg.deadline or float("inf")) - time.time()
            if left <= 0:
                raise DeadlineExceeded("the job was still queued at its deadline; it never started")
            if job.cancel_requested:
                raise asyncio.CancelledError
            pre = await self._prepared(msg, prepared)
            ids = pre.ids
            progress.prompt_tokens = len(ids)
            params = self.sampling_params(msg, len(ids))
            calls = self._tool_calls(msg)
            prompt = PromptReturn(ids, pre.echo, msg.request.logprobs, self.host.tokenizer)
            try:
                async with asyncio.timeout(left if left != float("inf") else None):
                    await self._generate(msg.id, job.attempt, ids, params, progress, msg.request.priority, prompt,
                                         calls)
            except TimeoutError:
                raise DeadlineExceeded("the job ran past its deadline and was aborted") from None
            status = JobStatus.succeeded
        except asyncio.CancelledError:
            status = None if job.handed_back or job.superseded else JobStatus.cancelled
        except FencedOut:
            # normally another attempt (or a cancel) owns the job now and this end is refused; if
            # the record still says running under this attempt, nobody else would ever end it
            log.warning("job %s: attempt %d no longer owns it; stopped", msg.id, job.attempt)
            fenced, status, error = True, JobStatus.failed, ErrorInfo(
                type="server_error", code="internal_error", message=f"attempt {job.attempt} was stopped as if another attempt "
                "owned the job, but none did; the job was ended here rather than left running")
        except EventsLost as e:
            log.error("job %s: attempt %d could not log its events (%s); handing the job back",
                      msg.id, job.attempt, e)
            status, hand_back = None, "event_write_failed"
        except InferqError as e:
            status, error = JobStatus.failed, ErrorInfo.of(e)
        except Exception as e:
            if _engine_dead(e) and self.on_engine_dead is not None:
                log.error("job %s: the engine died; handing the job back", msg.id)
                job.handed_back, status = True, None
                await self.on_engine_dead(msg.id, job.attempt)
            elif _client_error(e):  # the engine refused the request itself (vLLM's validation)
                status, error = JobStatus.failed, ErrorInfo.of(InvalidRequest(str(e), param=getattr(e, "parameter", None)))
            else:
                log.exception("job %s failed", msg.id)
                status, error = JobStatus.failed, ErrorInfo.of(EngineError(f"{type(e).__name__}: {e}"))
        finally:
            if self.active.get(msg.id) is job:
                del self.active[msg.id]
            written = None
            try:
                if claimed and not job.handed_back and not job.superseded:
                    written = await self._end(msg.id, job.attempt, status, progress, error, hand_back)
                    if fenced and written is not None:
                        log.error("job %s: attempt %d was stopped as fenced out but still owned the job: "
                                  "ended it %s", msg.id, job.attempt, written.value)
            finally:
                if claimed:
                    self.writer.forget(msg.id, job.attempt)
                    self._first_token_notes.pop((msg.id, job.attempt), None)  # an attempt ended without _end
        return written

    async def _prepared(self, msg: JobMessage, fut: concurrent.futures.Future[Prepared] | None) -> Prepared:
        """The job's prompt: from the caller's thread if it made it (usually done by the time the
        claim is back: no hand-off at all), else tokenized on a thread now. Raises what
        :meth:`prepare` raised (a refused chat template, token ids outside the vocabulary)."""
        if fut is None:
            return await asyncio.to_thread(self.prepare, msg)
        if not fut.done():
            await asyncio.wrap_future(fut)
        return fut.result()

    def _take_over(self, job_id: str, job: ActiveJob) -> bool:
        """Register a run whose claim was won. If this worker still runs an earlier attempt of the
        job (the job was requeued while it ran here), that one is stopped: its engine request is
        aborted before this one's starts (see :meth:`_generate`). False if a later attempt of the
        job already runs here (its claim's answer came back first): this one is fenced out."""
        old = self.active.get(job_id)
        if old is not None and old.attempt > job.attempt:
            log.warning("job %s: attempt %d already runs here; attempt %d stops", job_id, old.attempt,
                        job.attempt)
            job.superseded = True
            return False
        self.active[job_id] = job
        if old is not None:
            log.warning("job %s: attempt %d replaces attempt %d on this worker", job_id, job.attempt,
                        old.attempt)
            old.superseded = True
            if old.task is not None:
                old.task.cancel()
        return True

    def _tool_calls(self, msg: JobMessage) -> Callable[[], ToolCallStream] | None:
        """For tool_choice "auto": a maker of one parser stream per completion; else None."""
        if not msg.request.parse_tool_calls:
            return None
        if self.tool_parser is None:
            raise InvalidRequest('tool_choice "auto" needs a tool-call parser, and this worker has none '
                                 "(INFERQ_TOOL_CALL_PARSER)", param="tool_choice")
        return partial(ToolCallStream, self.tool_parser, self.host.tokenizer, msg.request)

    async def _generate(self, job_id: str, attempt: int, ids: list[int], params: Any, p: Progress,
                        priority: int, prompt: PromptReturn,
                        make_calls: Callable[[], ToolCallStream] | None = None) -> None:
        from vllm.inputs import TokensPrompt

        first = True
        first_at: float | None = None  # the first output's time, until an event carries it to the record

        def emit(ev: TokenEvent) -> None:
            nonlocal first_at
            self.writer.emit(job_id, attempt, ev, first_token_at=first_at)
            first_at = None

        extra = {"priority": priority} if self.priority_scheduling else {}
        # one generation per job on this worker: an earlier attempt's must have ended (its engine
        # request aborted) before this one starts with the same request id
        while (busy := self._engine_busy.get(job_id)) is not None:
            await busy.wait()
        done = self._engine_busy[job_id] = asyncio.Event()
        calls: dict[int, ToolCallStream] = {}  # per completion, with make_calls
        try:
            # closing the generator (on any exit) is what aborts the engine request
            async with aclosing(self.host.engine.generate(TokensPrompt(prompt_token_ids=ids), params,
                                                          request_id=job_id, **extra)) as outputs:
                async for out in outputs:
                    if first:
                        first_at = time.time()
                    if (err := self.writer.error(job_id, attempt)) is not None:
                        if isinstance(err, FencedOut):
                            raise err
                        raise EventsLost(f"{type(err).__name__}: {err}")
                    if (plp := prompt.take(out)) is not None:  # in an event of their own, once
                        p.seq += 1
                        emit(TokenEvent(seq=p.seq, text="", prompt_logprobs=plp))
                    for c in out.outputs:
                        tc = calls.get(c.index)
                        if tc is None and make_calls is not None:  # one parser stream per completion
                            tc = calls[c.index] = make_calls()
                        if c.text or c.token_ids:
                            text = c.text
                            lps = sampled_logprobs(c, self.host.tokenizer, params.logprobs or 0)
                            if (echoed := prompt.echo(c.index)) is not None:  # the prompt first
                                text = echoed[0] + text
                                lps = None if echoed[1] is None else [*echoed[1], *(lps or [])]
                            p.texts.setdefault(c.index, []).append(text)  # joined once, at the end
                            p.tokens[c.index] = p.tokens.get(c.index, 0) + len(c.token_ids)
                            if tc is not None:  # what the parser says is content, and the calls
                                content, pieces = tc.feed(c.text, list(c.token_ids))
                                if content or pieces:
                                    p.seq += 1
                                    emit(TokenEvent(seq=p.seq, index=c.index, text=content, n_tokens=len(c.token_ids),
                                                    logprobs=lps, tool_calls=pieces or None))
                            elif not (params.logprobs is None and self.writer.extend(
                                    job_id, attempt, c.index, text, len(c.token_ids))):
                                p.seq += 1
                                emit(TokenEvent(seq=p.seq, index=c.index, text=text, n_tokens=len(c.token_ids),
                                                logprobs=lps))
                        if c.finish_reason is not None:
                            reason = c.finish_reason
                            if tc is not None and tc.called:  # as vLLM: a parsed call ends the turn
                                if rest := tc.finish():
                                    p.seq += 1
                                    emit(TokenEvent(seq=p.seq, index=c.index, text="", tool_calls=rest))
                                reason = "tool_calls"
                            p.finish[c.index] = ChoiceEnd(index=c.index, finish_reason=reason,
                                                          stop_reason=c.stop_reason)
                    if first:
                        first = False
                        self._note_first_token(job_id, attempt, first_at)
                        first_at = None
        finally:
            del self._engine_busy[job_id]
            done.set()

    def _note_first_token(self, job_id: str, attempt: int, at: float | None) -> None:
        """Record when the first token came. Usually its first event carried the time to the record
        (``at`` None); where the first output made no event (a tool-call parser holding text back),
        a write of its own, without holding up the tokens behind it: a slow or absent Redis delays
        this write, not the job (the writer's budget bounds it)."""
        if (job := self.active.get(job_id)) is not None:
            job.span.event("first_token")
        if at is None:
            return

        async def note() -> None:
            try:
                async with asyncio.timeout(self.writer.budget_s):
                    await self.store.update(job_id, first_token_at=at)
            except Exception as e:  # a timestamp is not worth failing the job for
                log.warning("job %s: could not record first_token_at: %s", job_id, e or type(e).__name__)

        self._first_token_notes[(job_id, attempt)] = asyncio.get_running_loop().create_task(note())

    async def _end(self, job_id: str, attempt: int, status: JobStatus | None, p: Progress,
                   error: ErrorInfo | None, hand_back: str | None) -> JobStatus | None:
        """End the attempt: write its terminal state, or hand the job back for another attempt.
        Returns the status written (None: the job was handed back, or is not this attempt's)."""
        if (note := self._first_token_notes.pop((job_id, attempt), None)) is not None:
            await note  # written before the end (bounded by the writer's budget; it never raises)
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
        if hand_back is not None:
            await self._hand_back(job_id, attempt, hand_back)
            return None
        assert status is not None
        return await self._finish(job_id, attempt, status, p, error)

    async def _hand_back(self, job_id: str, attempt: int, reason: str) -> None:
        async def once() -> str:
            if self.hand_back is not None:
                return await self.hand_back(job_id, attempt, reason)
            return await self.store.requeue(job_id, self.worker_id, attempt, reason, self.max_attempts)

        try:
            outcome = await self._persist(once, f"hand job {job_id} back")
        except Exception:
            log.exception("job %s: attempt %d could not be handed back (%s)", job_id, attempt, reason)
            return
        log.warning("job %s: attempt %d handed back (%s): %s", job_id, attempt, reason, outcome)

    async def _persist(self, op: Callable[[], Awaitable[Any]], what: str) -> Any:
        """Run ``op`` (a Redis write that ends an attempt) until Redis answers, however long it is
        away: this worker is alive, so no reaper will ever end the attempt in its place."""
        budget, pause = self.writer.budget_s, 0.1
        while True:
            try:
                async with asyncio.timeout(budget):  # a Redis that does not answer at all counts too
                    return await retried(op, budget)
            except TRANSIENT as e:
                log.error("could not %s (%s: %s); trying again", what, type(e).__name__,
                          str(e) or f"no answer in {budget:g} s")
                await asyncio.sleep(pause)
                pause = min(pause * 2, 5.0)

    async def _finish(self, job_id: str, attempt: int, status: JobStatus, p: Progress,
                      error: ErrorInfo | None) -> JobStatus | None:
        n = max([*p.texts, *p.finish, 0]) + 1
        ends = [p.finish.get(i) or ChoiceEnd(index=i, finish_reason=None) for i in range(n)]
        if status is JobStatus.cancelled:
            ends = [ChoiceEnd(index=e.index, finish_reason=e.finish_reason or "cancelled") for e in ends]
        choices = [ChoiceView(index=i, text="".join(p.texts.get(i, ())), finish_reason=ends[i].finish_reason)
                   for i in range(n)]
        usage = p.usage()
        fields: dict[str, object] = dict(status=status, finished_at=time.time(), usage=usage,
                                         choices=[c.model_dump() for c in choices],
                                         finish_reason=ends[0].finish_reason)
        event: DoneEvent | ErrorEvent
        if error is not None:
            fields["error"] = error
            event = ErrorEvent(seq=p.seq + 1, error=error)
        else:
            event = DoneEvent(seq=p.seq + 1, status=status, finish_reason=ends[0].finish_reason,
                              choices=ends, usage=usage)
        # the end check (in Redis): a `succeeded` or `cancelled` end must directly follow every event
        # this attempt wrote; a failure's end goes after whatever its log holds
        try:
            written = await self._persist(
                lambda: self.store.finish(job_id, self.worker_id, attempt, event,
                                          check_log=status is not JobStatus.failed, **fields),
                f"record the end of job {job_id} ({status.value})")
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
            self.host.stats.jobs_finished += 1
        return written


def _engine_dead(e: BaseException) -> bool:
    from vllm.v1.engine.exceptions import EngineDeadError

    while e is not None:
        if isinstance(e, EngineDeadError):
            return True
        e = e.__cause__  # type: ignore[assignment]
    return False


def _client_error(e: BaseException) -> bool:
    """An error vLLM raises for the request itself (``VLLMClientError``, from vLLM 0.3x on; before
    that its validation raised ValueError, and ``VLLMValidationError`` is no longer one)."""
    return any(c.__name__ == "VLLMClientError" for c in type(e).__mro__)
