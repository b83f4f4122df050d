"""Embedding requests that meet in the gateway share one job, as text-embeddings-inference batches them.

A job costs the queue the same whatever its inputs (the submit, a Celery message, the worker's
claim, the answer's log), so one-input requests pay it once per input. Here a ``/v1/embeddings``
request of a caller joins the open group of its key (the same caller, model and options); a group
is sent as one job at once while fewer than ``embed_coalesce_inflight`` of that key's groups are
in flight, else when one of them ends (or when it holds ``embed_coalesce_max_inputs`` inputs).
An idle gateway adds no wait; under load the groups grow with it. Each request then gets its own
inputs' vectors and prompt tokens from the job's answer (the worker reports tokens per input).

Each request is checked against the limits and counted by the rate limit on its own before it
joins; only requests of one API key (one client IP without auth) share a job, so a job's record
holds no other caller's inputs. A group's job that fails (an input over the context window, an
engine error) is run again as one job per request, so that each request gets its own answer or
its own error; a refusal at submit (429, 503, 404) is every member's.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from inferq.api.admission import Admission
from inferq.api.auth import Principal
from inferq.api.metrics import EMBED_SHARED
from inferq.api.openai.embeddings import Vectors
from inferq.shared.pooling import EmbedInputs
from inferq.shared.schemas import JobRecord, JobRequest

log = logging.getLogger(__name__)

#: A job's answer once it ends, from its id: its vectors (with its tokens per input), or its error raised.
Collect = Callable[[str], Awaitable[Vectors]]


@dataclass
class Answer:
    """One request's share of a job: the job's record, its vectors and its prompt tokens."""

    record: JobRecord
    packed: list[str]
    prompt_tokens: int


@dataclass
class _Member:
    job: JobRequest
    n: int  # its inputs
    answer: asyncio.Future[Answer] = field(default_factory=lambda: _future())


@dataclass
class _Group:
    key: tuple[Any, ...]
    caller: Principal
    members: list[_Member] = field(default_factory=list)
    inputs: int = 0


def _count(job: JobRequest) -> int:
    """The job's inputs."""
    e = job.embed
    return len((e.texts or e.token_ids or ()) if e is not None else ())


def group_key(caller: Principal, job: JobRequest) -> tuple[Any, ...] | None:
    """The requests that may share ``job``'s group: the same caller and every option but the inputs
    (None: a job that does not coalesce)."""
    e = job.embed
    if e is None or e.text_max_tokens is not None:
        return None
    form = "texts" if e.texts is not None else "token_ids"
    return (caller.subject, caller.key_id, job.model, job.user, job.priority, job.service_class, form,
            e.dimensions, e.truncate_prompt_tokens, e.add_special_tokens, e.use_activation)


def merged(members: list[_Member]) -> JobRequest:
    """One job of every member's inputs, in order (the first member's options: the group's)."""
    specs = [m.job.embed for m in members if m.job.embed is not None]
    first = specs[0]
    texts = [t for e in specs for t in (e.texts or ())] if first.texts is not None else None
    ids = [x for e in specs for x in (e.token_ids or ())] if texts is None else None
    spec = EmbedInputs.model_validate({**first.model_dump(), "texts": texts, "token_ids": ids})
    return members[0].job.model_copy(update={"embed": spec})


class EmbedCoalescer:
    """The gateway's groups of embedding requests, per key (one per gateway process)."""

    def __init__(self, admission: Admission, collect: Collect, inflight: int, max_inputs: int) -> None:
        self.admission = admission
        self.collect = collect
        self.inflight = inflight  # a key's groups in flight before the next one waits (0: off)
        self.max_inputs = max_inputs
        self._open: dict[tuple[Any, ...], _Group] = {}
        self._running: dict[tuple[Any, ...], int] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self.jobs = 0  # jobs sent, and the requests they carried
        self.requests = 0

    def takes(self, job: JobRequest) -> bool:
        """Whether ``job`` may join a group (coalescing on, a job that groups, small enough)."""
        return self.inflight > 0 and job.embed is not None and job.embed.text_max_tokens is None \
            and 0 < _count(job) <= self.max_inputs // 2

    async def embed(self, caller: Principal, job: JobRequest) -> Answer:
        """``job``'s answer, from a job it shares with other requests of the caller's key, or its
        error. The caller's wait may be cancelled (its client left): the group's job goes on."""
        key = group_key(caller, job)
        assert key is not None
        member = _Member(job, _count(job))
        group = self._open.get(key)
        if group is not None and group.inputs + member.n > self.max_inputs:
            self._send(group)  # full: it goes now, and this request opens the next one
            group = None
        if group is None:
            group = self._open[key] = _Group(key, caller)
        group.members.append(member)
        group.inputs += member.n
        if self._running.get(key, 0) < self.inflight or group.inputs >= self.max_inputs:
            self._send(group)
        return await asyncio.shield(member.answer)

    def _send(self, group: _Group) -> None:
        if self._open.get(group.key) is group:
            del self._open[group.key]
        self._running[group.key] = self._running.get(group.key, 0) + 1
        self.jobs += 1
        self.requests += len(group.members)
        EMBED_SHARED.labels("jobs").inc()
        EMBED_SHARED.labels("requests").inc(len(group.members))
        task = asyncio.get_running_loop().create_task(self._run(group), name="embed-group")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _run(self, group: _Group) -> None:
        try:
            await self._answer(group)
        except BaseException as e:  # cancelled (shutdown), or a bug: no member is left waiting
            for m in group.members:
                _fail(m, e if isinstance(e, Exception) else RuntimeError("the gateway is shutting down"))
            if not isinstance(e, Exception):
                raise
        finally:
            left = self._running[group.key] = self._running[group.key] - 1
            if not left:
                del self._running[group.key]
            if (waiting := self._open.get(group.key)) is not None:
                self._send(waiting)

    async def _answer(self, group: _Group) -> None:
        members = group.members
        job = merged(members) if len(members) > 1 else members[0].job
        try:  # a refusal at submit is every member's
            rec = (await self.admission.submit(group.caller, [job], count_rate=False)).records[0]
        except Exception as e:
            for m in members:
                _fail(m, e)
            return
        try:
            got = await self.collect(rec.id)
        except Exception as e:
            if len(members) == 1:
                _fail(members[0], e)
                return
            log.info("embedding job %s of %d requests failed (%s); each request runs on its own", rec.id,
                     len(members), e)
            await self._each(group)
            return
        if len(members) == 1:
            _done(members[0], Answer(rec, got.packed, got.prompt_tokens))
            return
        if got.tokens is None:  # a worker that does not say tokens per input
            await self._each(group)
            return
        at = 0
        for m in members:
            _done(m, Answer(rec, got.packed[at:at + m.n], sum(got.tokens[at:at + m.n])))
            at += m.n

    async def _each(self, group: _Group) -> None:
        """Every member as a job of its own (after its group's job failed)."""
        async def one(m: _Member) -> None:
            try:
                rec = (await self.admission.submit(group.caller, [m.job], count_rate=False)).records[0]
                got = await self.collect(rec.id)
                _done(m, Answer(rec, got.packed, got.prompt_tokens))
            except Exception as e:
                _fail(m, e)
        await asyncio.gather(*(one(m) for m in group.members))

    async def stop(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)


def _future() -> asyncio.Future[Answer]:
    """A member's answer; its error counts as seen even if its client left before it came."""
    fut: asyncio.Future[Answer] = asyncio.get_running_loop().create_future()
    fut.add_done_callback(lambda f: f.cancelled() or f.exception())
    return fut


def _done(m: _Member, answer: Answer) -> None:
    if not m.answer.done():
        m.answer.set_result(answer)


def _fail(m: _Member, e: Exception) -> None:
    if not m.answer.done():
        m.answer.set_exception(e)
