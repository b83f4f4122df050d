"""JobRunner: runs one job on the shared engine and turns its outputs into stream events.

Life of a job on a worker: claim it (queued -> running; a cancelled or taken job is skipped),
tokenize and check it against the context window, stream the engine's DELTA outputs as ``token``
events, and, whatever happens, write the terminal state and the final ``done``/``error`` event in
``finally``. Cancellation is one mechanism: cancelling the job's asyncio task, which makes vLLM's
``generate`` abort the request in the engine and free its KV blocks.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from inferq.shared.errors import ContextLengthExceeded, EngineError, InferqError, InvalidRequest
from inferq.shared.schemas import (
    ChoiceEnd,
    ChoiceView,
    DoneEvent,
    ErrorEvent,
    ErrorInfo,
    JobMessage,
    JobStatus,
    TokenEvent,
    TokenLogprob,
    TopLogprob,
    Usage,
)
from inferq.shared.redis import redis_retrying
from inferq.shared.store import JobStore
from inferq.worker.engine import EngineHost
from inferq.worker.writer import EventWriter, FencedOut

log = logging.getLogger(__name__)


@dataclass
class ActiveJob:
    task: asyncio.Task[Any] | None = None
    cancel_requested: bool = False
    attempt: int = 0
    handed_back: bool = False  # requeued by this worker (drain, engine failure): write no end
    ended: asyncio.Event = field(default_factory=asyncio.Event)


class DeadlineExceeded(InferqError):
    type = "deadline_exceeded"


@dataclass
class Progress:
    """What a job has produced so far; becomes the final record and ``done`` event."""

    seq: int = 0
    prompt_tokens: int = 0
    texts: dict[int, str] = field(default_factory=dict)
    tokens: dict[int, int] = field(default_factory=dict)
    finish: dict[int, ChoiceEnd] = field(default_factory=dict)

    def usage(self) -> Usage:
        done = sum(self.tokens.values())
        return Usage(prompt_tokens=self.prompt_tokens, completion_tokens=done,
                     total_tokens=self.prompt_tokens + done)


class JobRunner:
    def __init__(self, host: EngineHost, store: JobStore, writer: EventWriter, worker_id: str,
                 default_max_tokens: int, priority_scheduling: bool = False,
                 on_engine_dead: Callable[[str, int], Awaitable[None]] | None = None) -> None:
        self.host = host
        self.store = store
        self.writer = writer
        self.worker_id = worker_id
        self.default_max_tokens = default_max_tokens
        self.priority_scheduling = priority_scheduling
        self.on_engine_dead = on_engine_dead
        self.active: dict[str, ActiveJob] = {}
        self.idle = threading.Event()  # set while no job is active (a drain waits for it)
        self.idle.set()
        self._tok_lock = threading.Lock()

    # --- called from the control channel -----------------------------------------------------
    def cancel(self, job_id: str) -> bool:
        job = self.active.get(job_id)
        if job is None:
            return False
        job.cancel_requested = True
        if job.task is not None:
            job.task.cancel()
        return True

    # --- preparing a job (runs in a thread: tokenization is CPU work) -------------------------
    def prompt_ids(self, msg: JobMessage) -> list[int]:
        req, tok = msg.request, self.host.tokenizer
        with self._tok_lock:
            if req.messages is not None:
                text = tok.apply_chat_template([m.model_dump() for m in req.messages], tokenize=False,
                                               add_generation_prompt=True)
                return list(tok.encode(text, add_special_tokens=False))
            return list(tok.encode(req.prompt))

    def sampling_params(self, msg: JobMessage, prompt_tokens: int) -> Any:
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind, StructuredOutputsParams

        o = msg.request
        max_tokens = o.max_tokens or min(self.default_max_tokens, self.host.max_model_len - prompt_tokens)
        if max_tokens < 1 or prompt_tokens + max_tokens > self.host.max_model_len:
            raise ContextLengthExceeded(prompt_tokens, max(max_tokens, 1), self.host.max_model_len)
        structured = None
        if o.json_schema is not None:
            structured = StructuredOutputsParams(json=o.json_schema)
        elif o.json_object:
            structured = StructuredOutputsParams(json_object=True)
        try:
            return SamplingParams(
                n=o.n, max_tokens=max_tokens, temperature=o.temperature, top_p=o.top_p,
                top_k=o.top_k, min_p=o.min_p, stop=o.stop or None, seed=o.seed,
                presence_penalty=o.presence_penalty, frequency_penalty=o.frequency_penalty,
                repetition_penalty=o.repetition_penalty, ignore_eos=o.ignore_eos,
                logprobs=o.logprobs, structured_outputs=structured,
                output_kind=RequestOutputKind.DELTA,
            )
        except ValueError as e:  # vLLM's own validation
            raise InvalidRequest(str(e)) from e

    # --- running a job (on the engine loop) ---------------------------------------------------
    async def run(self, msg: JobMessage) -> JobStatus | None:
        """Run the job to a terminal state. Returns that state, or None if it was not ours to end."""
        job = ActiveJob(task=asyncio.current_task())
        previous = self.active.setdefault(msg.id, job)  # an older attempt of this job, still ending here?
        self.idle.clear()
        progress = Progress()
        status: JobStatus | None = None
        error: ErrorInfo | None = None
        try:
            claim = None
            async for retry in redis_retrying():
                with retry:
                    claim = await self.store.claim(msg.id, self.worker_id)
            if claim is None or claim.previous is not JobStatus.queued:
                log.info("job %s skipped: status %s", msg.id, claim and claim.previous.value)
                return None
            job.attempt, progress.seq, status = claim.attempt, claim.last_seq, JobStatus.running
            if previous is not job:  # the older attempt lost the job to this one
                await self._take_over(msg.id, previous, job)
            self.host.stats.jobs_started += 1
            left = (msg.deadline or float("inf")) - time.time()
            if left <= 0:
                raise DeadlineExceeded("the job was still queued at its deadline; it never started")
            if job.cancel_requested:
                raise asyncio.CancelledError
            ids = await asyncio.to_thread(self.prompt_ids, msg)
            progress.prompt_tokens = len(ids)
            params = self.sampling_params(msg, len(ids))
            try:
                async with asyncio.timeout(left if left != float("inf") else None):
                    await self._generate(msg.id, job.attempt, ids, params, progress, msg.request.priority)
            except TimeoutError:
                raise DeadlineExceeded("the job ran past its deadline and was aborted") from None
            status = JobStatus.succeeded
        except asyncio.CancelledError:
            status = None if job.handed_back else JobStatus.cancelled
        except FencedOut:
            log.warning("job %s: attempt %d no longer owns it; stopped", msg.id, job.attempt)
            status = None
        except InferqError as e:
            status, error = JobStatus.failed, ErrorInfo(type=e.code or e.type, message=e.message)
        except Exception as e:
            if _engine_dead(e) and self.on_engine_dead is not None:
                log.error("job %s: the engine died; handing the job back", msg.id)
                job.handed_back, status = True, None
                await self.on_engine_dead(msg.id, job.attempt)
            else:
                log.exception("job %s failed", msg.id)
                status, error = JobStatus.failed, ErrorInfo(type=EngineError.type, message=f"{type(e).__name__}: {e}")
        finally:
            ours = self.active.get(msg.id) is job
            if ours:
                del self.active[msg.id]
            if not self.active:
                self.idle.set()
            if status is not None:
                await self._finish(msg.id, job.attempt, status, progress, error)
            if ours:
                self.writer.forget(msg.id)
            job.ended.set()
        return status

    async def _take_over(self, job_id: str, previous: ActiveJob, job: ActiveJob) -> None:
        """This worker got the job again (another worker's reaper took it back and re-sent it)
        while its older attempt is still ending here: end that one (no end written), let its last
        events be sent and refused, then run the new attempt with a clean slate."""
        previous.handed_back = True
        if previous.task is not None:
            previous.task.cancel()
        await previous.ended.wait()
        await self.writer.barrier()
        self.writer.forget(job_id)
        self.active[job_id] = job

    async def _generate(self, job_id: str, attempt: int, ids: list[int], params: Any, p: Progress,
                        priority: int) -> None:
        from vllm.inputs import TokensPrompt

        first = True
        extra = {"priority": priority} if self.priority_scheduling else {}
        async for out in self.host.engine.generate(TokensPrompt(prompt_token_ids=ids), params,
                                                   request_id=job_id, **extra):
            if (err := self.writer.failed.get(job_id)) is not None:
                if isinstance(err, FencedOut):
                    raise err
                raise EngineError(f"could not publish tokens: {err}")
            for c in out.outputs:
                if c.text or c.token_ids:
                    p.texts[c.index] = p.texts.get(c.index, "") + c.text
                    p.tokens[c.index] = p.tokens.get(c.index, 0) + len(c.token_ids)
                    merged = params.logprobs is None and self.writer.extend(job_id, c.index, c.text,
                                                                            len(c.token_ids))
                    if not merged:
                        p.seq += 1
                        self.writer.emit(job_id, attempt, TokenEvent(
                            seq=p.seq, index=c.index, text=c.text, n_tokens=len(c.token_ids),
                            logprobs=_logprobs(c, self.host.tokenizer, params.logprobs or 0)))
                if c.finish_reason is not None:
                    p.finish[c.index] = ChoiceEnd(index=c.index, finish_reason=c.finish_reason,
                                                  stop_reason=c.stop_reason)
            if first:
                first = False
                try:
                    await self.store.update(job_id, first_token_at=time.time())
                except Exception as e:  # a timestamp is not worth failing the job for
                    log.warning("job %s: could not record first_token_at: %s", job_id, e)

    async def _finish(self, job_id: str, attempt: int, status: JobStatus, p: Progress,
                      error: ErrorInfo | None) -> None:
        n = max([*p.texts, *p.finish, 0]) + 1
        ends = [p.finish.get(i, ChoiceEnd(index=i, finish_reason=None)) for i in range(n)]
        if status is JobStatus.cancelled:
            ends = [ChoiceEnd(index=e.index, finish_reason=e.finish_reason or "cancelled") for e in ends]
        choices = [ChoiceView(index=i, text=p.texts.get(i, ""), finish_reason=ends[i].finish_reason) for i in range(n)]
        fields: dict[str, object] = dict(status=status, finished_at=time.time(), usage=p.usage(),
                                         choices=[c.model_dump() for c in choices],
                                         finish_reason=ends[0].finish_reason)
        event: DoneEvent | ErrorEvent
        if error is not None:
            fields["error"] = error
            event = ErrorEvent(seq=p.seq + 1, error=error)
        else:
            event = DoneEvent(seq=p.seq + 1, status=status, finish_reason=ends[0].finish_reason,
                              choices=ends, usage=p.usage())
        try:
            await self.writer.barrier()  # every token event is in the log before the end
            async for retry in redis_retrying():
                with retry:
                    if await self.store.finish(job_id, self.worker_id, attempt, event, **fields):
                        self.host.stats.jobs_finished += 1
        except Exception:
            log.exception("job %s: could not record its end (%s)", job_id, status.value)


def _logprobs(c: Any, tokenizer: Any, k: int) -> list[TokenLogprob] | None:
    """The sampled tokens' log-probs with the ``k`` most likely alternatives each."""
    if not c.logprobs:
        return None
    out = []
    for tid, entry in zip(c.token_ids, c.logprobs):
        chosen = entry.get(tid)
        top = sorted(entry.items(), key=lambda kv: kv[1].rank or 0)[:k]
        out.append(TokenLogprob(
            token=_tok(chosen, tid, tokenizer),
            logprob=float(chosen.logprob) if chosen else float("-inf"),
            top_logprobs=[TopLogprob(token=_tok(lp, t, tokenizer), logprob=float(lp.logprob)) for t, lp in top],
        ))
    return out


def _tok(lp: Any, tid: int, tokenizer: Any) -> str:
    if lp is not None and lp.decoded_token is not None:
        return str(lp.decoded_token)
    return str(tokenizer.decode([tid]))


def _engine_dead(e: BaseException) -> bool:
    from vllm.v1.engine.exceptions import EngineDeadError

    while e is not None:
        if isinstance(e, EngineDeadError):
            return True
        e = e.__cause__  # type: ignore[assignment]
    return False
