"""Job state in Redis: the record hash, its state transitions, and the event log + channel.

Gateway and workers both go through :class:`JobStore`, so every transition is written once.
Transitions that race (a worker claiming a job while a client cancels it) are Lua scripts
(shared/lua/job_*.lua), so exactly one side wins. Events are appended to the job's stream with the
stream id ``{seq}-0``: Redis itself refuses an event whose ``seq`` is not larger than the last
one, so a log can never hold a duplicate or go backwards.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from redis.asyncio import Redis
from redis.commands.core import AsyncScript
from redis.exceptions import NoScriptError, ResponseError

from inferq.shared import keys, lua
from inferq.shared.fairshare import MAX_WALK, FairShare, fair_keys
from inferq.shared.redis import stream_entries, text_map
from inferq.shared.schemas import (
    DEFAULT_PRIORITY,
    DoneEvent,
    ErrorEvent,
    ErrorInfo,
    JobRecord,
    JobStatus,
    LoadingEvent,
    RestartEvent,
    Resume,
    TokenEvent,
    hash_fields,
    parse_event,
)

Event = TokenEvent | DoneEvent | ErrorEvent | RestartEvent | LoadingEvent
_Q = json.dumps  # stored form of a string field: JSON

#: Events per append script call: one call holds Redis for well under a millisecond.
APPEND_CHUNK = 256

#: The final event of a job cancelled where it stood (queued, or when it is handed back).
_CANCELLED = lua.event_json(DoneEvent(seq=0, status=JobStatus.cancelled, finish_reason="cancelled"))


def _log_incomplete(attempt: int) -> str:
    """The end of an attempt whose log misses events (the script fills in {last} and {wrote})."""
    return lua.event_json(ErrorEvent(seq=0, error=ErrorInfo(
        type="server_error", code="log_incomplete", message=f"the log ends at event {{last}} but attempt "
        f"{attempt} wrote up to event {{wrote}}: the stream would not replay to the text")))


def _given_up(reason: str) -> str:
    """The end of a job interrupted too often (the script fills in {attempt})."""
    return lua.event_json(ErrorEvent(seq=0, error=ErrorInfo(
        type="service_unavailable", code="worker_lost",
        message=f"the job was interrupted {{attempt}} times (last: {reason}); giving up")))


#: Engine deaths a job may be running at: at the next, it fails instead of going to another worker
#: (a request that kills engines, such as one whose LoRA adapter's folder was deleted, would
#: otherwise take down every worker it reached in turn).
MAX_ENGINE_FAILURES = 2
_ENGINE_FAILURES = lua.event_json(ErrorEvent(seq=0, error=ErrorInfo(
    type="server_error", code="engine_failure",
    message=f"the engine died {MAX_ENGINE_FAILURES} times while running this job; it is not run again")))


def list_keys(queue_list: str) -> list[str]:
    """The keys of a list of a model's queue that the scripts of a job queued on it may touch, in the
    order they declare them: its fair share's (shared/fairshare.py: ``fair_keys``), then its
    cancelled jobs' zset. (None of them is named in a record or passed as an argument.)"""
    return [*fair_keys(queue_list), keys.queue_cancelled(queue_list)]


class AlreadyQueued(Exception):
    """A job with this id was queued before (:meth:`JobStore.submit` wrote nothing)."""


@dataclass
class Claim:
    previous: JobStatus
    attempt: int = 0
    last_seq: int = 0
    resume: Resume | None = None  # the progress a paused job kept: this attempt continues it


class JobStore:
    """Typed access to job records and event logs (the client must use ``decode_responses=True``)."""

    def __init__(self, redis: Redis, ttl_s: int) -> None:
        self.redis = redis
        self.ttl_s = ttl_s
        self.max_walk = MAX_WALK  # how far into a list a submit walks to place a message (fair share)
        self._claim = lua.register(redis, "job_claim")
        self._cancel = lua.register(redis, "job_cancel")
        self._finish = lua.register(redis, "job_finish")
        self._append = lua.register(redis, "job_append")
        self._requeue = lua.register(redis, "job_requeue")
        self._update = lua.register(redis, "job_update")
        self._fail_queued = lua.register(redis, "job_fail_queued")
        self._get_visible = lua.register(redis, "job_get_visible")
        self._submit = lua.register(redis, "job_submit")
        self._loading = lua.register(redis, "job_loading")

    async def create(self, record: JobRecord) -> None:
        """Write the job's record alone, without a Celery message (a job some other way sends)."""
        await self._write(record)

    async def submit(self, record: JobRecord, queue_list: str, message: str, max_depth: int,
                     share: FairShare | None = None, announce: bool = False) -> int | None:
        """Write the job's record and put its Celery message on ``queue_list`` in one step, unless
        the model's queue already holds ``max_depth`` jobs (as :func:`queue_depths` counts them): then
        nothing is written and the depth is returned. :class:`AlreadyQueued` when a job with the
        record's id exists: nothing is written then either. ``share``: the job's fair share
        (shared/fairshare.py), which places the message in the list; ``announce``: a tenant's first
        queued job is announced to the model's workers (``keys.waiting``: interactive work)."""
        return await self._write(record, queue_list, message, max_depth, share, announce)

    async def _write(self, record: JobRecord, queue_list: str | None = None, message: str = "",
                     max_depth: int | None = None, share: FairShare | None = None,
                     announce: bool = False) -> int | None:
        lists = keys.queue_lists(record.model)
        queue_list = queue_list or lists[record.request.priority]  # where its messages go (job_message)
        # the record names the zset its job joins if it is cancelled while its message waits in that list
        fields = [x for kv in record.to_hash().items() for x in kv] + ["queue_cancelled",
                                                                        keys.queue_cancelled(queue_list)]
        depth = int(await self._submit(
            keys=[keys.job(record.id), keys.QUEUED, keys.STATS, queue_list, *list_keys(queue_list), *lists,
                  *map(keys.queue_cancelled, lists)],
            args=["" if max_depth is None else max_depth, self.queued_ttl(record), record.id, repr(record.created_at),
                  keys.stat("submitted", record.model), message, share.model_dump_json() if share else "",
                  self.max_walk, keys.waiting(record.model) if announce else "", *fields]))
        if depth == -2:
            raise AlreadyQueued(record.id)
        return None if depth < 0 else depth

    def queued_ttl(self, record: JobRecord) -> int:
        """How long a job's record lives from its submission: until its deadline and a full TTL
        after it, so that a job still queued at its deadline is there to be failed (and read)
        however long it waited; the TTL alone for a job without a deadline."""
        if record.deadline is None:
            return self.ttl_s
        return self.ttl_s + max(0, math.ceil(record.deadline - record.created_at))

    async def expire_soon(self, job_id: str, ttl_s: int) -> None:
        """Keep an ended job's record and log ``ttl_s`` more seconds at most (an answer delivered:
        its vectors need not stay for a whole TTL)."""
        ttl = min(ttl_s, self.ttl_s)
        async with self.redis.pipeline(transaction=False) as p:
            p.expire(keys.job(job_id), ttl)
            p.expire(keys.job_log(job_id), ttl)
            await p.execute()

    async def get(self, job_id: str) -> JobRecord | None:
        h = await self.redis.hgetall(keys.job(job_id))
        return JobRecord.from_hash(text_map(h)) if h else None

    async def get_visible(self, job_id: str, owner: str | None) -> JobRecord | None:
        """The record if the job exists and ``owner`` may see it (the rule of
        ``Principal.may_see``: ``None`` sees every job, a key only its own); else None, after the
        same work whether the job is missing or another owner's."""
        flat = await self._get_visible(keys=[keys.job(job_id)], args=[_Q(owner) if owner is not None else ""])
        h = dict(zip(flat[::2], flat[1::2], strict=False))
        return JobRecord.from_hash(text_map(h)) if h else None

    async def list_keys(self, job_id: str, queue_list: str | None = None) -> list[str]:
        """The keys of the list the job was queued on (:func:`list_keys`) that its scripts are given:
        ``queue_list``'s (as the worker's message says it: its model's list at its priority), else
        the list its record says (one more read); none for a job without a record."""
        if queue_list is None:
            model, request = await self.redis.hmget(keys.job(job_id), ["model", "request"])
            if model is None or request is None:
                return []
            priority = json.loads(request).get("priority", DEFAULT_PRIORITY)
            queue_list = keys.queue_lists(json.loads(model))[priority]
        return list_keys(queue_list)

    async def claim(self, job_id: str, worker_id: str, token: str = "", queue_list: str | None = None,
                    room: str | None = None) -> Claim | None:
        """queued -> running for ``worker_id`` (a new attempt). None: no such job. A call repeated
        with the same ``token`` after its answer was lost gets the answer the first call had.
        ``queue_list``: the list the job was queued on (its fair share's keys; else read from its
        record); ``room``: its tenant's room counter (``keys.room``: one room made for it is used up)."""
        listed = await self.list_keys(job_id, queue_list)
        res = await self._claim(keys=[keys.job(job_id), keys.job_log(job_id), keys.worker_jobs(worker_id),
                                      keys.QUEUED, *listed, *([room] if room and listed else [])],
                                args=[_Q(worker_id), str(time.time()), job_id, token, self.ttl_s])
        if res is None:
            return None
        resume = Resume.model_validate_json(res[3]) if len(res) > 3 and res[3] else None
        return Claim(JobStatus(json.loads(res[0])), int(res[1]), int(res[2]), resume)

    async def request_cancel(self, job_id: str) -> JobStatus | None:
        """Cancel: a queued job ends now; a running one is flagged (its worker aborts it)."""
        st = await self._cancel(keys=[keys.job(job_id), keys.job_log(job_id), keys.job_channel(job_id), keys.QUEUED,
                                      keys.STATS, *await self.list_keys(job_id)],
                                args=[str(time.time()), job_id, self.ttl_s, _CANCELLED])
        return JobStatus(json.loads(st)) if st else None

    async def update(self, job_id: str, **fields: object) -> bool:
        """Set fields of an existing record (False: there is none; a record that expired or was
        never written is not brought back as a partial hash without a TTL)."""
        flat = [x for kv in hash_fields(**fields).items() for x in kv]
        return bool(await self._update(keys=[keys.job(job_id)], args=flat))

    async def finish(self, job_id: str, worker_id: str, attempt: int, event: Event, *, check_log: bool = True,
                     queue_list: str | None = None, **fields: object) -> JobStatus | None:
        """Write the job's end (terminal fields and final event) atomically, while this attempt
        still owns the running job. ``check_log``: ``event.seq`` must directly follow the last
        logged event (the log holds everything the attempt wrote), or the job ends failed with
        ``log_incomplete`` instead; without it the event is written after whatever the log holds
        (a failure's end); ``queue_list`` as for :meth:`claim`. Returns the status written, or None
        (fenced out)."""
        flat: list[str] = [x for kv in hash_fields(**fields).items() for x in kv]
        res = await self._finish(
            keys=[keys.job(job_id), keys.worker_jobs(worker_id), keys.job_log(job_id), keys.job_channel(job_id),
                  keys.STATS, *await self.list_keys(job_id, queue_list)],
            args=[str(attempt), job_id, event.seq if check_log else "",
                  event.model_dump_json(exclude_none=True), self.ttl_s, _log_incomplete(attempt), *flat])
        if not res:
            return None
        return JobStatus.failed if int(res) == 2 else JobStatus(fields.get("status", JobStatus.succeeded))

    async def requeue(self, job_id: str, worker_id: str | None, attempt: int | None, reason: str,
                      max_attempts: int, claimed_before: float | None = None,
                      silent: tuple[str, float] | None = None, resume: Resume | None = None) -> str:
        """Take a running job back from its worker: 'requeued', 'failed', 'cancelled' or 'skip'.
        ``resume``: queued again with that progress kept (no ``restart``: the next attempt continues it).
        ``attempt``: only that attempt; ``claimed_before``: only if it was claimed before that time
        (a reaper passes the time it read the worker's job set); ``silent``: (model, last beat) as
        a reaper judged the worker: 'alive' (and nothing changes) if it has beaten since. A job
        'requeued' is marked unsent until :meth:`sent` (its new message is the caller's to send)."""
        wid = worker_id or ""
        model, beat = silent if silent is not None else ("", None)
        return str(await self._requeue(
            keys=[keys.job(job_id), keys.job_log(job_id), keys.job_channel(job_id), keys.worker_jobs(wid),
                  keys.QUEUED, keys.workers(model) if model else keys.QUEUED, keys.STATS, keys.UNSENT],
            args=[_Q(wid) if wid else "", "" if attempt is None else str(attempt), max_attempts,
                  str(time.time()), reason, job_id, self.ttl_s,
                  "" if claimed_before is None else repr(claimed_before),
                  "" if beat is None else repr(beat), wid, _CANCELLED, _given_up(reason),
                  lua.event_json(RestartEvent(seq=0, attempt=0, reason=reason)), MAX_ENGINE_FAILURES,
                  _ENGINE_FAILURES, resume.model_dump_json() if resume is not None else ""]))

    async def sent(self, job_id: str) -> None:
        """The new message of a job :meth:`requeue` queued again is sent: it is no longer unsent."""
        await self.redis.zrem(keys.UNSENT, job_id)

    async def loading(self, job_id: str, event: LoadingEvent) -> bool:
        """Log the job's ``loading`` event (its first) if it is still queued with an empty log."""
        return bool(await self._loading(keys=[keys.job(job_id), keys.job_log(job_id), keys.job_channel(job_id),
                                              keys.WANTED_CHANNEL], args=[lua.event_json(event), event.model]))

    async def fail_queued(self, job_id: str, error: ErrorInfo, *, message_waits: bool = False) -> bool:
        """End a job that is still queued as failed, with its final ``error`` event (a job whose
        message no worker can decode; one past its deadline). True if it was queued; otherwise
        nothing changes. ``message_waits``: its message is still in its queue's list (a worker will
        pop and skip it): it leaves the queue's depth as a cancelled job's does."""
        return bool(await self._fail_queued(
            keys=[keys.job(job_id), keys.job_log(job_id), keys.job_channel(job_id), keys.QUEUED, keys.STATS,
                  *await self.list_keys(job_id)],
            args=[str(time.time()), job_id, lua.event_json(ErrorEvent(seq=0, error=error)), self.ttl_s,
                  "1" if message_waits else ""]))

    async def append(self, items: Sequence[tuple[str, int, Event] | tuple[str, int, Event, float | None]]
                     ) -> list[Exception | bool]:
        """Log and publish many jobs' events (job id, attempt, event[, the job's first_token_at to
        record with it]) in one round trip: one script call per :data:`APPEND_CHUNK` events, in
        order. Per item: True (written), False (that attempt no longer owns the job) or the error.

        The calls go as plain EVALSHA in a pipeline: redis-py's pipeline of registered scripts asks
        SCRIPT EXISTS before every execute, a second round trip per batch. A Redis that lost the
        script (restarted) answers NOSCRIPT; it is loaded and the batch sent again (what the first
        try wrote is refused as duplicates, which the writer ignores)."""
        calls: list[tuple[int, list[str | int]]] = []
        for start in range(0, len(items), APPEND_CHUNK):
            ks: list[str | int] = []
            args: list[str | int] = []
            for job_id, attempt, ev, *first in items[start:start + APPEND_CHUNK]:
                ks += (keys.job(job_id), keys.job_log(job_id), keys.job_channel(job_id))
                args += (str(attempt), ev.seq, ev.model_dump_json(exclude_none=True),
                         str(self.ttl_s) if ev.seq == 1 or ev.type != "token" else "",
                         json.dumps(first[0]) if first and first[0] is not None else "")
            calls.append((len(ks), [*ks, *args]))
        results = await self._evalsha_all(self._append, calls)
        out: list[Exception | bool] = []
        for chunk, res in zip(range(0, len(items), APPEND_CHUNK), results, strict=False):
            n = len(items[chunk:chunk + APPEND_CHUNK])
            if isinstance(res, Exception):  # the whole call failed (e.g. Redis restarted mid-way)
                out += [res] * n
            else:
                out += [ResponseError(r) if isinstance(r, str) else bool(r) for r in res]
        return out

    async def _evalsha_all(self, script: AsyncScript, calls: list[tuple[int, list[str | int]]]) -> list[Any]:
        """``script`` once per (number of keys, keys + args), in order, in one round trip."""
        for _ in range(2):
            async with self.redis.pipeline(transaction=False) as p:
                for numkeys, args in calls:
                    p.evalsha(script.sha, numkeys, *args)
                results = await p.execute(raise_on_error=False)
            if not any(isinstance(r, NoScriptError) for r in results):
                break
            script.sha = await self.redis.script_load(script.script)
        return list(results)

    async def read_log(self, job_id: str, after: int = 0) -> list[Event]:
        """Every logged event with ``seq > after``, in order."""
        return [parse_event(raw) for raw in await self.read_log_raw(job_id, after)]

    async def read_log_raw(self, job_id: str, after: int = 0) -> list[str]:
        """:meth:`read_log` as stored: each event's JSON text."""
        rows = await self.redis.xrange(keys.job_log(job_id), min=f"{after + 1}-0", max="+")
        return [fields["e"] for _, fields in stream_entries(rows)]


async def queue_depths(redis: Redis, model: str) -> list[int]:
    """Jobs waiting in each of the model's queue lists (by priority), in one round trip: each list's
    messages less those of jobs cancelled while queued (a worker pops and skips them later;
    shared/lua/job_submit.lua counts the same)."""
    lists = keys.queue_lists(model)
    async with redis.pipeline(transaction=False) as p:
        for name in lists:
            p.llen(name)
            p.zcard(keys.queue_cancelled(name))
        counts = await p.execute()
    return [max(0, n - cancelled) for n, cancelled in zip(counts[::2], counts[1::2], strict=True)]


def is_duplicate_id(err: Exception | None) -> bool:
    """True for Redis' refusal of an event whose seq was already logged."""
    return isinstance(err, ResponseError) and "equal or smaller" in str(err)
