"""Admission: the checks in front of :meth:`JobService.submit`. Every submission (REST,
``WS /v1/generate``, OpenAI chat and completions) comes through :meth:`Admission.submit`.
The per-caller checks are kept in Redis so that every gateway process counts the same way.

- **Request limits**, first: this gateway's configured ``INFERQ_MAX_*``
  (:func:`inferq.shared.request_limits.check_limits`, 400 naming the field).
- **Rate**: at most ``rate_limit_per_minute`` submitting requests per caller in any 60 s (a
  sliding-window log: a sorted set of request times, trimmed and counted in one Lua script).
- **Concurrency**: at most ``max_concurrent_jobs_per_key`` unfinished jobs per caller. A sorted set
  holds the caller's job ids; the same script that admits new ids first drops the ones whose job
  is terminal or gone (expired), reading their status from the job records. Nothing has to
  "decrement" when a job ends, so a crashed worker or gateway cannot leak a slot for longer than
  its job's record lives.
- **Idempotency-Key**: the first request claims the key with ``SET NX`` (value: a fingerprint of
  the request and the job ids it is about to create); a repeat gets those jobs back, a repeat with
  another body is refused (400), a repeat while the first is still submitting waits a little and
  then gets 409. A refused first request releases the key, so the client can retry with it.

A "caller" is :attr:`Principal.subject`: the API key's id, or ``ip:ADDRESS`` when auth is off.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass

from redis.asyncio import Redis

from inferq.api.auth import Principal
from inferq.api.service import JobService, new_job_id
from inferq.shared import keys, lua
from inferq.shared.errors import Conflict, InvalidRequest, NotFound, RateLimited
from inferq.shared.fairshare import Share
from inferq.shared.request_limits import check_limits
from inferq.shared.schemas import JobRecord, JobRequest, ResponseOptions
from inferq.shared.settings import Settings

log = logging.getLogger(__name__)
WINDOW_S = 60
#: A job id admitted this recently may not have its record yet: not "gone".
_CREATE_GRACE_S = 60
@dataclass
class Admitted:
    records: list[JobRecord]
    replayed: bool  # True: an earlier request with the same Idempotency-Key created these jobs


def fingerprint(endpoint: str, body: object) -> str:
    """What makes two requests "the same" for an Idempotency-Key: the endpoint and the parsed body
    (so key order, whitespace and spelled-out defaults do not matter)."""
    canon = json.dumps([endpoint, body], sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canon.encode()).hexdigest()


def check_idempotency_key(value: str) -> str:
    if not 1 <= len(value) <= 255 or not value.isascii() or not value.isprintable():
        raise InvalidRequest("Idempotency-Key must be 1 to 255 printable ASCII characters",
                             param="Idempotency-Key")
    return value


def check_min_tokens(req: JobRequest, default_max_tokens: int) -> None:
    """``min_tokens`` above the ``max_tokens`` a job gets when its request gives none cannot be met:
    400 naming it (the schema checks it against a ``max_tokens`` given)."""
    if req.max_tokens is None and req.min_tokens > default_max_tokens:
        raise InvalidRequest(f"min_tokens ({req.min_tokens}) must be <= max_tokens, which is {default_max_tokens} "
                             "when the request gives none (INFERQ_DEFAULT_MAX_TOKENS)", param="min_tokens")


def allowed_priority(caller: Principal, req: JobRequest) -> JobRequest:
    """``req`` at a priority its caller may use: one it asked for outside its key's priorities is
    refused (400 naming ``priority``: a clamp would quietly run the job later than asked); one it
    left to the default, where the key may not use the default, runs at the key's nearest."""
    allowed = caller.priorities
    if req.priority in allowed:
        return req
    if "priority" in req.model_fields_set:
        raise InvalidRequest(f"priority {req.priority} is not allowed for this API key: it may use priorities "
                             f"{allowed[0]} to {allowed[-1]} (0 runs first)", param="priority",
                             code="priority_not_allowed")
    return req.model_copy(update={"priority": min(max(req.priority, allowed[0]), allowed[-1])})


def classed(caller: Principal, req: JobRequest, settings: Settings, streamed: bool, param: str) -> JobRequest:
    """``req`` in its service class: batch work (asked for as ``param``, or every job of a key with
    ``class=batch``) runs at ``INFERQ_BATCH_PRIORITY``, the batch lane; a streamed request cannot be
    batch work (400 naming ``param``, or ``stream`` for a batch key's); a batch key's request that
    asks for interactive work, or a batch job that asks for another priority, is a 400 naming it."""
    asked = "service_class" in req.model_fields_set
    if caller.batch_only:
        if asked and req.service_class == "interactive":
            raise InvalidRequest("this API key runs batch work only (class=batch in the keys file)", param=param,
                                 code="service_class_not_allowed")
        if streamed:
            raise InvalidRequest("this API key runs batch work only (class=batch in the keys file), which is "
                                 "not streamed: ask without stream", param="stream", code="service_class_not_allowed")
        req = req.model_copy(update={"service_class": "batch"})
    if req.service_class != "batch":
        return req
    if streamed:
        raise InvalidRequest(f"{param}: a streamed request is interactive work; batch work runs on the capacity "
                             "interactive work leaves (ask without stream, or use /v1/jobs, a background "
                             "response or the Batch API)", param=param)
    lane = settings.batch_priority
    if "priority" in req.model_fields_set and req.priority != lane:
        raise InvalidRequest(f"priority {req.priority}: batch work runs at priority {lane} (INFERQ_BATCH_PRIORITY, "
                             "the batch lane); leave priority out", param="priority")
    return req.model_copy(update={"priority": lane})


class Admission:
    def __init__(self, settings: Settings, redis: Redis, service: JobService,
                 replay_wait_s: float = 10.0, shares: Callable[[str | None], Share] | None = None) -> None:
        self.settings = settings
        self.redis = redis
        self.service = service
        self.shares = shares or (lambda _owner: Share())  # an owner's fair share (KeyRing.share)
        self.replay_wait_s = replay_wait_s
        self._rate = lua.register(redis, "rate")
        self._reserve = lua.register(redis, "reserve")
        self._release = lua.register(redis, "lock_release")

    async def submit(self, caller: Principal, reqs: list[JobRequest], *, idempotency_key: str | None = None,
                     fingerprint: Callable[[], str] | None = None,
                     response: ResponseOptions | None = None, streamed: bool = False,
                     class_param: str = "service_class", count_rate: bool = True) -> Admitted:
        """Admit and queue one job per request, owned by ``caller``; all or none of them.
        ``fingerprint`` is called only with an Idempotency-Key, and only once the requests passed
        their limits (it serializes them: their free-form JSON must be known to be shallow).
        ``response``: a ``/v1/responses`` request's options, kept on its job's record. ``streamed``:
        the answer is streamed (no batch work); ``class_param``: the field that asks for batch work;
        ``count_rate`` False: the requests were counted by the rate limit already (:meth:`check`)."""
        for req in reqs:  # before anything is counted or claimed: a refused request leaves no trace
            self.check(req)
        reqs = [classed(caller, req, self.settings, streamed, class_param) for req in reqs]
        reqs = [req if req.service_class == "batch" else allowed_priority(caller, req) for req in reqs]
        if idempotency_key is None:
            return Admitted(await self._admit(caller, reqs, [new_job_id() for _ in reqs], response, count_rate),
                            False)
        digest = hashlib.sha256(check_idempotency_key(idempotency_key).encode()).hexdigest()[:32]
        fp = fingerprint() if fingerprint is not None else ""
        key = keys.idempotency(caller.subject, digest)
        deadline = time.monotonic() + self.replay_wait_s
        while True:
            ids = [new_job_id() for _ in reqs]
            mine = json.dumps({"fp": fp, "ids": ids, "at": time.time()})
            if await self.redis.set(key, mine, nx=True, ex=self.settings.idempotency_ttl_s):
                try:
                    return Admitted(await self._admit(caller, reqs, ids, response, count_rate), False)
                except BaseException:
                    await asyncio.shield(self._release(keys=[key], args=[mine]))
                    raise
            raw = await self.redis.get(key)
            if raw is None:  # released or expired in between: claim it again
                continue
            prior = json.loads(raw)
            if prior["fp"] != fp:
                raise InvalidRequest("this Idempotency-Key was already used with a different request",
                                     param="Idempotency-Key", code="idempotency_key_reused")
            records = [await self.service.store.get(i) for i in prior["ids"]]
            if all(r is not None for r in records):
                return Admitted([r for r in records if r is not None], True)
            if time.time() - prior["at"] > _CREATE_GRACE_S:
                raise NotFound("the jobs this Idempotency-Key created have expired",
                               param="Idempotency-Key", code="job_not_found")
            if time.monotonic() > deadline:
                raise Conflict("a request with this Idempotency-Key is still being submitted; retry later",
                               param="Idempotency-Key", code="idempotency_in_progress", retry_after=1.0)
            await asyncio.sleep(0.05)

    def check(self, req: JobRequest) -> None:
        """``req`` within the configured limits, else 400 naming the field."""
        check_limits(req, self.settings)
        check_min_tokens(req, self.settings.default_max_tokens)

    async def _admit(self, caller: Principal, reqs: list[JobRequest], ids: list[str],
                     response: ResponseOptions | None, count_rate: bool = True) -> list[JobRecord]:
        if count_rate:
            await self.check_rate(caller.subject)
        return await self.queue(caller.subject, caller.key_id, reqs, ids, response=response)

    async def queue(self, subject: str, owner: str | None, reqs: list[JobRequest], ids: list[str],
                    limit: int | None = None, max_depth: int | None = None,
                    all_or_none: bool = True, response: ResponseOptions | None = None) -> list[JobRecord]:
        """Take ``subject``'s slots for ``ids`` and queue the jobs, all or none (no rate check: a
        batch's lines are queued this way, its creation was the request that counted; ``limit``
        and ``max_depth``: fewer slots than the key has and a shallower queue than the model's, so
        that interactive requests keep some of each). Without ``all_or_none``, the jobs queued
        before one failed stay queued (a batch queues the rest of its line later, by their ids)."""
        await self.reserve(subject, ids, limit)
        records: list[JobRecord] = []
        share = self.shares(owner)
        try:
            for req, job_id in zip(reqs, ids, strict=True):
                records.append(await self.service.submit(req, owner=owner, job_id=job_id, max_depth=max_depth,
                                                         response=response, share=share))
        except BaseException:
            await asyncio.shield(self._undo(subject, records if all_or_none else [], ids[len(records):]))
            raise
        return records

    async def _undo(self, subject: str, submitted: list[JobRecord], unsent: list[str]) -> None:
        for rec in submitted:
            try:
                await self.service.cancel(rec.id)
            except Exception:  # best effort: the job may already have ended
                log.warning("could not cancel %s after a failed submission", rec.id, exc_info=True)
        if unsent and self.settings.max_concurrent_jobs_per_key:
            await self.redis.zrem(keys.active_jobs(subject), *unsent)

    async def check_rate(self, subject: str) -> None:
        """Count one submitting request for ``subject``; 429 when its last minute is full."""
        limit = self.settings.rate_limit_per_minute
        if not limit:
            return
        member = f"{time.time():.6f}-{secrets.token_hex(4)}"
        wait = await self._rate(keys=[keys.rate(subject)], args=[limit, WINDOW_S, member])
        if wait is not None:
            raise RateLimited(f"rate limit reached: {limit} requests per minute; retry later",
                              code="rate_limit_exceeded", retry_after=max(1.0, float(wait)))

    async def reserve(self, subject: str, job_ids: list[str], limit: int | None = None) -> None:
        """Take one unfinished-job slot per id for ``subject``; 429 when they do not fit."""
        limit = self.settings.max_concurrent_jobs_per_key if limit is None else limit
        if not limit:
            return
        n = await self._reserve(keys=[keys.active_jobs(subject)],
                                args=[limit, _CREATE_GRACE_S, keys.job(""), self.settings.job_ttl_s, *job_ids])
        if int(n) >= 0:
            raise RateLimited(f"too many unfinished jobs: {n} of at most {limit} (this request adds "
                              f"{len(job_ids)}); retry when one ends", code="too_many_jobs",
                              retry_after=1.0)
