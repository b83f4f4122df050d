"""JobService: what the gateway does with a job, independent of the protocol that asked.

Submit = resolve the model (its live workers, read at most once a second), check the request
against the model's context window (tokenizing its prompt where the gateway can: api/prompt_ids.py),
then write the job record and its Celery task (task id = job
id) in one Redis script that first checks the queue's depth. REST, WebSocket
and OpenAI routes all go through here.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections.abc import Sequence

from celery import Celery
from redis.asyncio import Redis

from inferq.api.adapters import Adapters
from inferq.api.auth import Principal
from inferq.api.metrics import PROMPTS
from inferq.api.prompt_ids import Published, tokenize
from inferq.api.standby import StandbyCache
from inferq.shared import keys, tracing
from inferq.shared.celery_app import job_message
from inferq.shared.errors import ContextLengthExceeded, InvalidRequest, NotFound, RateLimited, job_not_found
from inferq.shared.fairshare import Share, fair_share, job_cost
from inferq.shared.pooling import check_task
from inferq.shared.redis import texts
from inferq.shared.request_limits import check_vocabulary
from inferq.shared.schemas import (
    AdapterRef,
    ChoiceView,
    ControlMessage,
    JobLinks,
    JobRecord,
    JobRequest,
    JobStatus,
    JobView,
    ResponseOptions,
    WorkerInfo,
)
from inferq.shared.settings import Settings
from inferq.shared.store import AlreadyQueued, JobStore

log = logging.getLogger(__name__)


#: How long a gateway uses what it saw of a model's workers without looking again; after that, up to
#: a worker TTL, it still answers from what it saw while it looks again in the background.
WORKERS_CACHE_S = 1.0


def new_job_id() -> str:
    """128 random bits: job ids are unguessable."""
    return "job-" + secrets.token_hex(16)


def links(job_id: str) -> JobLinks:
    return JobLinks(self=f"/v1/jobs/{job_id}", stream=f"/v1/jobs/{job_id}/stream")


class JobService:
    def __init__(self, settings: Settings, redis: Redis, store: JobStore, celery: Celery) -> None:
        self.settings = settings
        self.redis = redis
        self.store = store
        self.celery = celery
        self._served: dict[str, tuple[float, WorkerInfo]] = {}  # model -> (when seen, one live worker)
        self._looking: dict[str, asyncio.Task[WorkerInfo | None]] = {}  # model -> its background look-up
        self._cancelling: set[asyncio.Task[JobStatus]] = set()  # cancels of jobs whose client went away
        self.published = Published(redis)  # tokenizers workers published (a gateway on another host)
        self.adapters = Adapters(settings, redis)  # the fleet's LoRA adapters (names clients may send)
        self.standby = StandbyCache(redis, settings.worker_ttl_s)  # models held asleep by multi-model workers

    async def live_workers(self, model: str) -> list[WorkerInfo]:
        ids = texts(await self.redis.zrangebyscore(keys.workers(model), time.time() - self.settings.worker_ttl_s,
                                                   "+inf"))
        raw = await self.redis.mget([keys.worker(i) for i in ids]) if ids else []
        return [WorkerInfo.model_validate_json(r) for r in raw if r]

    async def live_models(self) -> list[str]:
        return texts(await self.redis.zrangebyscore(keys.MODELS, time.time() - self.settings.worker_ttl_s, "+inf"))

    async def resolve_model(self, requested: str | None) -> tuple[str, WorkerInfo | None]:
        """The model name to queue for, and one live worker's description of it (if any). A model
        found served is remembered: for :data:`WORKERS_CACHE_S` as it is, then, up to a worker TTL
        after it was last seen, while one background look-up refreshes it (a submission reads the
        registry only for a model not seen served lately). One found unserved is looked up again on
        the next request; it is queued for (not a 404) while a multi-model worker holds it asleep
        (then with that worker's description of it, as of its last wake), or when it is one of
        INFERQ_MODELS (a fleet scaled to zero)."""
        model = requested or self.settings.model_name
        seen = self._served.get(model)
        if seen is not None:
            age = time.monotonic() - seen[0]
            if age >= WORKERS_CACHE_S and model not in self._looking:
                task = asyncio.get_running_loop().create_task(self._look_up(model, background=True))
                self._looking[model] = task
                task.add_done_callback(lambda _t: self._looking.pop(model, None))
            if age < self.settings.worker_ttl_s:
                return model, seen[1]
        info = await self._look_up(model)
        if info is None:  # no worker holds it awake: one that holds it asleep, or a model of the fleet's?
            asleep = await self.standby.get(model)
            if asleep is None and model not in self.settings.model_names:
                raise NotFound(f"model {model!r} is not served here", param="model", code="model_not_found")
            return model, asleep.info if asleep is not None else None
        return model, info

    async def resolve(self, requested: str | None) -> tuple[str, WorkerInfo | None, AdapterRef | None]:
        """:meth:`resolve_model`, where ``requested`` may also name a LoRA adapter: then its base
        model (whose queue its jobs go on) and the adapter. A model's name wins over an adapter's."""
        try:
            return (*await self.resolve_model(requested), None)
        except NotFound:
            adapter = await self.adapters.get(requested) if requested else None
            if adapter is None:
                raise
        model, info = await self.resolve_model(adapter.parent)
        return model, info, AdapterRef(name=adapter.name, path=adapter.path, id=adapter.id)

    async def _look_up(self, model: str, background: bool = False) -> WorkerInfo | None:
        """Read the model's live workers; remember one (or forget the model) and return it."""
        try:
            workers = await self.live_workers(model)
        except Exception:
            if not background:
                raise
            log.warning("could not look up the workers of model %r (the next request tries again)", model,
                        exc_info=True)
            return None
        if not workers:
            self._served.pop(model, None)
            return None
        if len(self._served) > 1024:  # only names workers announced get here; bound it anyway
            self._served.clear()
        self._served[model] = (time.monotonic(), workers[0])
        return workers[0]

    async def check_context(self, req: JobRequest, info: WorkerInfo) -> list[int] | None:
        """Refuse what cannot fit the context window, or what the model's workers cannot parse,
        before it is queued (the worker re-checks). Returns the prompt's token ids where they may
        go with the job (api/prompt_ids.py)."""
        check_task(info.tasks, req.embed is not None, info.model)
        if req.embed is not None:  # each input is tokenized and checked by the worker
            return None
        if req.parse_tool_calls and not info.tool_call_parser:
            raise InvalidRequest('tool_choice "auto" (the default when tools are given) needs a tool-call '
                                 "parser, and this model's workers have none (INFERQ_TOOL_CALL_PARSER); use "
                                 'tool_choice "required", a named function, or "none"', param="tool_choice")
        limit = info.max_model_len
        if info.vocab_size:
            check_vocabulary(req, info.vocab_size)
        fallback = self.settings.tokenizer_dir if info.model == self.settings.model_name else None
        n, ids = await tokenize(req, info, str(fallback) if fallback is not None else None,
                                self.published.get(info.tokenizer_files))
        if n is not None and n + (req.max_tokens or 1) > limit:
            raise ContextLengthExceeded(n, req.max_tokens or 1, limit, req.prompt_param)
        if req.max_tokens is not None and req.max_tokens >= limit:  # no room for any prompt, counted or not
            raise ContextLengthExceeded(n, req.max_tokens, limit)
        return ids

    async def submit(self, req: JobRequest, *, owner: str | None = None, job_id: str | None = None,
                     max_depth: int | None = None, response: ResponseOptions | None = None,
                     share: Share | None = None) -> JobRecord:
        """Queue the job: its record and its Celery message are written together, in one Redis
        script, unless the model's queue holds ``max_depth`` (default ``INFERQ_MAX_QUEUE_DEPTH``)
        messages already (429 ``queue_full``). A ``job_id`` that was queued before is not queued
        again: its record is returned as it is (a batch's lines have ids of their own that way).
        ``response``: the options of a ``/v1/responses`` request, kept on the record. ``share``:
        whose fair share of the queue the job takes (shared/fairshare.py; default: anonymous)."""
        model, info, adapter = await self.resolve(req.model)
        ids = await self.check_context(req, info) if info is not None else None
        share = share or Share()
        record = JobRecord(id=job_id or new_job_id(), model=model, request=req, owner=owner, adapter=adapter,
                           response=response, tenant=share.tenant, tenant_weight=share.weight)
        record.deadline = record.created_at + (req.timeout or self.settings.default_timeout_s)
        limit = self.settings.max_queue_depth if max_depth is None else max_depth
        with tracing.span("inferq.submit", job_id=record.id, model=model, priority=req.priority) as span:
            record.traceparent = span.traceparent
            queue_list, message = job_message(self.celery, record.message(ids))
            weight = 1.0 if req.embed is not None else self.settings.fair_prompt_weight
            cost = job_cost(req, len(ids) if ids is not None else None, self.settings.default_max_tokens, weight)
            fair = fair_share(share, cost, self.settings.fair_share, weight)
            try:
                depth = await self.store.submit(record, queue_list, message, limit, fair,
                                                announce=req.service_class == "interactive")
            except AlreadyQueued:
                if (prior := await self.store.get(record.id)) is None:  # ended and expired meanwhile
                    raise job_not_found(record.id) from None
                return prior
        if depth is not None:
            raise RateLimited(f"model {model!r} has {depth} jobs queued (limit {limit}); retry later",
                              code="queue_full", retry_after=1.0)
        await self._say_loading(record.id, model)
        PROMPTS.labels(model, "client" if req.prompt_token_ids is not None else
                       "gateway" if ids is not None else "worker").inc()
        log.info("job %s queued (model %s, priority %d)", record.id, model, req.priority,
                 extra={"job_id": record.id, "model": model})
        return record

    async def _say_loading(self, job_id: str, model: str) -> None:
        """A job queued for a model no worker holds awake, while workers hold it asleep: its first
        event says that it waits for a wake, and how long that should take (api/standby.py); the
        workers holding it asleep hear of it at once (worker/multi/wanted.py). What this gateway
        remembers of the model's awake workers is read again when it is a second old: a model that
        has just gone to sleep is seen asleep by its next job."""
        seen = self._served.get(model)
        if seen is not None and time.monotonic() - seen[0] >= WORKERS_CACHE_S:
            pending = self._looking.get(model)  # the look-up resolving the model started, if it did
            await (asyncio.shield(pending) if pending is not None else self._look_up(model, background=True))
        if model in self._served:  # a worker holds it awake
            return
        asleep = await self.standby.get(model)
        if asleep is not None:
            await self.store.loading(job_id, asleep.event())

    async def record(self, job_id: str, caller: Principal | None = None) -> JobRecord:
        """The job, as ``caller`` may see it. The one place that decides whether a job exists for
        a caller (REST poll and cancel, WebSocket streams): an id that is not a job id never
        reaches Redis; otherwise one script reads the record only if the caller may see it, so a
        missing record (expired: its log may outlive it by moments) and another key's job raise
        the same error after the same work (:meth:`JobStore.get_visible`)."""
        if not keys.is_job_id(job_id):
            raise job_not_found(job_id)
        rec = await self.store.get_visible(job_id, caller.key_id if caller is not None else None)
        if rec is None:
            raise job_not_found(job_id)
        return rec

    async def view(self, job_id: str, caller: Principal | None = None) -> JobView:
        rec = await self.record(job_id, caller)
        choices = rec.choices
        if choices is None:  # still running: the text so far is in the log
            texts: dict[int, str] = {}
            for ev in await self.store.read_log(job_id):
                if ev.type == "token":
                    texts[ev.index] = texts.get(ev.index, "") + ev.text
                elif ev.type == "restart":  # the text so far was thrown away
                    texts = {}
            choices = [ChoiceView(index=i, text=texts.get(i, "")) for i in range(rec.request.n)]
        return JobView(
            id=rec.id, model=rec.served_name, status=rec.status, text=choices[0].text if choices else "",
            choices=choices, finish_reason=rec.finish_reason, usage=rec.usage,
            created_at=rec.created_at, started_at=rec.started_at, first_token_at=rec.first_token_at,
            finished_at=rec.finished_at, worker=rec.worker, error=rec.error, links=links(rec.id),
        )

    async def cancel(self, job_id: str, caller: Principal | None = None) -> JobStatus:
        """Cancel the job: a queued one never runs; a running one is aborted by its worker."""
        if caller is not None:
            await self.record(job_id, caller)
        prev = await self.store.request_cancel(job_id)
        if prev is None:
            raise job_not_found(job_id)
        if prev is JobStatus.running:
            await self.redis.publish(keys.CONTROL_CHANNEL, ControlMessage(job_id=job_id).model_dump_json())
        log.info("job %s: cancel requested (was %s)", job_id, prev.value)
        return prev

    def cancel_soon(self, job_ids: Sequence[str]) -> None:
        """Cancel jobs from a path that may itself be cancelled (the request of a client that went
        away): each cancel is a task of its own, held here until it ends."""
        for job_id in job_ids:
            task = asyncio.get_running_loop().create_task(self.cancel(job_id))
            self._cancelling.add(task)
            task.add_done_callback(self._cancelled)

    def _cancelled(self, task: asyncio.Task[JobStatus]) -> None:
        self._cancelling.discard(task)
        if not task.cancelled() and (e := task.exception()) is not None:
            log.warning("cancel of a job whose client went away failed: %r", e)

    async def settle(self, timeout_s: float = 5.0) -> None:
        """Wait (up to ``timeout_s``) for the cancels :meth:`cancel_soon` started: the lifespan's
        last step before Redis closes, so that streams cut at shutdown still cancel their jobs."""
        if self._cancelling:
            await asyncio.wait(set(self._cancelling), timeout=timeout_s)

