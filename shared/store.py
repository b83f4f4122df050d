"""Job state in Redis: the record hash, its state transitions, and the event log + channel.

Gateway and workers both go through :class:`JobStore`, so every transition is written once.
Transitions that race (a worker claiming a job while a client cancels it) are Lua scripts, so
exactly one side wins. Events are appended to the job's stream with the stream id ``{seq}-0``:
Redis itself refuses an event whose ``seq`` is not larger than the last one, so a log can never
hold a duplicate or go backwards.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from redis.asyncio import Redis
from redis.commands.core import AsyncScript
from redis.exceptions import NoScriptError, ResponseError

from inferq.shared import keys
from inferq.shared.schemas import (
    DoneEvent,
    ErrorEvent,
    ErrorInfo,
    JobRecord,
    JobStatus,
    RestartEvent,
    TokenEvent,
    hash_fields,
    parse_event,
)

Event = TokenEvent | DoneEvent | ErrorEvent | RestartEvent
_Q = json.dumps  # stored form of a string field: JSON

#: Events per append script call: one call holds Redis for well under a millisecond.
APPEND_CHUNK = 256

_LAST_SEQ = """
local function text(v)
  if type(v) == 'string' then return v end
  return ''
end
-- one of the cluster-wide counters (keys.stat): kind|model|a[|b], the model from the job record
local function count(stats, h, kind, a, b)
  local m = redis.call('HGET', h, 'model')
  local f = kind .. '|' .. text(m and cjson.decode(m)) .. '|' .. text(a)
  if b then f = f .. '|' .. text(b) end
  redis.call('HINCRBY', stats, f, 1)
end
local function last_seq(log)
  local last = redis.call('XREVRANGE', log, '+', '-', 'COUNT', 1)
  if #last == 0 then return 0 end
  return tonumber(string.match(last[1][1], '^(%d+)'))
end
"""

# KEYS: job hash, log, worker's job set, queued zset. ARGV: worker id (JSON), now, job id, claim
# token ('' : none). queued -> running, attempt + 1. Returns {status before (JSON), attempt, last
# seq in the log}. The same token again (a retry whose first call took the job but whose answer
# was lost) gets the same answer, not "running": else the job would stay running with nobody on it.
_CLAIM = _LAST_SEQ + f"""
local st = redis.call('HGET', KEYS[1], 'status')
if not st then return nil end
if st ~= '{_Q("queued")}' then
  if ARGV[4] ~= '' and st == '{_Q("running")}' and redis.call('HGET', KEYS[1], 'claim') == ARGV[4] then
    return {{'{_Q("queued")}', tonumber(redis.call('HGET', KEYS[1], 'attempt')), last_seq(KEYS[2])}}
  end
  return {{st, 0, 0}}
end
local attempt = tonumber(redis.call('HGET', KEYS[1], 'attempt') or '0') + 1
redis.call('HSET', KEYS[1], 'status', '{_Q("running")}', 'worker', ARGV[1], 'started_at', ARGV[2],
           'attempt', attempt, 'claim', ARGV[4])
redis.call('SADD', KEYS[3], ARGV[3])
redis.call('ZREM', KEYS[4], ARGV[3])
return {{st, attempt, last_seq(KEYS[2])}}
"""

# KEYS: job hash, log, channel, queued zset, stats. ARGV: now, job id, ttl.
# queued -> cancelled at once (with its final event); running -> flag it; else: nothing.
_CANCEL = _LAST_SEQ + f"""
local st = redis.call('HGET', KEYS[1], 'status')
if not st then return nil end
if st == '{_Q("queued")}' then
  redis.call('HSET', KEYS[1], 'status', '{_Q("cancelled")}', 'finished_at', ARGV[1],
             'finish_reason', '{_Q("cancelled")}')
  local seq = 1
  local last = redis.call('XREVRANGE', KEYS[2], '+', '-', 'COUNT', 1)
  if #last > 0 then seq = tonumber(string.match(last[1][1], '^(%d+)')) + 1 end
  local data = cjson.encode({{type='done', seq=seq, status='cancelled', finish_reason='cancelled'}})
  redis.call('XADD', KEYS[2], seq .. '-0', 'e', data)
  redis.call('EXPIRE', KEYS[2], ARGV[3])
  redis.call('EXPIRE', KEYS[1], ARGV[3])
  redis.call('PUBLISH', KEYS[3], data)
  redis.call('ZREM', KEYS[4], ARGV[2])
  count(KEYS[5], KEYS[1], 'end', 'cancelled', '')
elseif st == '{_Q("running")}' then
  redis.call('HSET', KEYS[1], 'cancel_requested', 'true')
end
return st
"""

# KEYS: job hash, worker's job set, log, channel, stats. ARGV: attempt, job id, final event seq ('': right
# after the last logged event), final event JSON, ttl, field, value, ... Writes the end (fields +
# final event) only while this attempt owns the running job: a worker that lost the job is fenced
# out. The end check: the final event must directly follow the last logged one, i.e. the log holds
# every event the attempt wrote; if not, its stream would not replay to its text, so the job ends
# failed (log_incomplete) instead. Returns 0 (fenced out), 1 (written) or 2 (log_incomplete).
_FINISH = _LAST_SEQ + f"""
if redis.call('HGET', KEYS[1], 'status') ~= '{_Q("running")}' then return 0 end
if redis.call('HGET', KEYS[1], 'attempt') ~= ARGV[1] then return 0 end
local last = last_seq(KEYS[3])
local seq, data, result = last + 1, ARGV[4], 1
redis.call('HSET', KEYS[1], unpack(ARGV, 6))
if ARGV[3] == '' then
  data = string.gsub(data, '"seq":%d+', '"seq":' .. seq, 1)
elseif tonumber(ARGV[3]) ~= seq then
  local err = {{type='server_error', code='log_incomplete', message='the log ends at event ' .. last .. ' but attempt ' ..
    ARGV[1] .. ' wrote up to event ' .. (tonumber(ARGV[3]) - 1) ..
    ': the stream would not replay to the text'}}
  data = cjson.encode({{type='error', seq=seq, error=err}})
  redis.call('HSET', KEYS[1], 'status', '{_Q("failed")}', 'error', cjson.encode(err))
  result = 2
end
local st, code = cjson.decode(redis.call('HGET', KEYS[1], 'status')), ''
local e = redis.call('HGET', KEYS[1], 'error')
if st == 'failed' and e and e ~= 'null' then code = cjson.decode(e).code end
count(KEYS[5], KEYS[1], 'end', st, code)
redis.call('SREM', KEYS[2], ARGV[2])
redis.call('XADD', KEYS[3], seq .. '-0', 'e', data)
redis.call('EXPIRE', KEYS[3], ARGV[5])
redis.call('EXPIRE', KEYS[1], ARGV[5])
redis.call('PUBLISH', KEYS[4], data)
return result
"""

# KEYS: per event its job hash, log and channel. ARGV: per event its attempt, seq, JSON, ttl ('' =
# leave the TTL) and the job's first_token_at to record with it ('' = none). Appends many events (of
# many jobs) in one call; per event 1 (written), 0 (that attempt no longer owns the job) or an error
# text. An event that does not follow the last logged one is refused: XADD refuses a seq already
# logged, and a seq past the next one is an error (an earlier event was lost), so a log never has a hole.
_APPEND = _LAST_SEQ + f"""
local out = {{}}
for i = 0, #KEYS / 3 - 1 do
  local h, log, ch = KEYS[3 * i + 1], KEYS[3 * i + 2], KEYS[3 * i + 3]
  local attempt, seq, data, ttl, first = ARGV[5 * i + 1], ARGV[5 * i + 2], ARGV[5 * i + 3], ARGV[5 * i + 4],
    ARGV[5 * i + 5]
  if redis.call('HGET', h, 'status') ~= '{_Q("running")}' or redis.call('HGET', h, 'attempt') ~= attempt then
    out[i + 1] = 0
  else
    local last = last_seq(log)
    if tonumber(seq) > last + 1 then
      out[i + 1] = 'GAP event ' .. seq .. ' does not follow the last logged event ' .. last
    else
      local added = redis.pcall('XADD', log, seq .. '-0', 'e', data)
      if type(added) == 'table' and added.err then
        out[i + 1] = added.err
      else
        if ttl ~= '' then
          redis.call('EXPIRE', log, ttl)
          redis.call('EXPIRE', h, ttl)
        end
        if first ~= '' then
          redis.call('HSET', h, 'first_token_at', first)
        end
        redis.call('PUBLISH', ch, data)
        out[i + 1] = 1
      end
    end
  end
end
return out
"""

# KEYS: job hash, log, channel, worker's job set, queued zset, the model's live workers zset (or any
# key), stats.
# ARGV: worker id (JSON) or '', attempt or '', max attempts, now, reason, job id, ttl, claimed before
# ('' = any time), the worker's last beat as the caller saw it ('' = don't check), worker id. Takes a running job back from a
# worker that died, drains or lost its engine: cancelled if a cancel was pending, failed after max
# attempts, else queued again with a `restart` event. Returns 'requeued', 'failed', 'cancelled' or 'skip'.
# The job leaves the worker's set only when it is handed back, or when it is not that worker's running
# job at all (a stale entry); a newer attempt of the same worker, or a job it claimed after the caller
# looked (`started_at` above ARGV[8]), stays. A reaper passes the beat it judged (ARGV[9]): if the
# worker has beaten since, nothing changes and the answer is 'alive'.
_REQUEUE = _LAST_SEQ + f"""
if ARGV[9] ~= '' then
  local seen = redis.call('ZSCORE', KEYS[6], ARGV[10])
  if seen and tonumber(seen) > tonumber(ARGV[9]) then return 'alive' end
end
local st = redis.call('HGET', KEYS[1], 'status')
if ARGV[1] ~= '' and (st ~= '{_Q("running")}' or redis.call('HGET', KEYS[1], 'worker') ~= ARGV[1]) then
  redis.call('SREM', KEYS[4], ARGV[6])
  return 'skip'
end
if st ~= '{_Q("running")}' then return 'skip' end
if ARGV[2] ~= '' and redis.call('HGET', KEYS[1], 'attempt') ~= ARGV[2] then return 'skip' end
if ARGV[8] ~= '' and tonumber(redis.call('HGET', KEYS[1], 'started_at') or '0') > tonumber(ARGV[8]) then
  return 'skip'
end
redis.call('SREM', KEYS[4], ARGV[6])
local attempt = tonumber(redis.call('HGET', KEYS[1], 'attempt') or '0')
local seq = last_seq(KEYS[2]) + 1
local ev, outcome
if redis.call('HGET', KEYS[1], 'cancel_requested') == 'true' then
  ev = {{type='done', seq=seq, status='cancelled', finish_reason='cancelled'}}
  redis.call('HSET', KEYS[1], 'status', '{_Q("cancelled")}', 'finished_at', ARGV[4],
             'finish_reason', '{_Q("cancelled")}')
  outcome = 'cancelled'
  count(KEYS[7], KEYS[1], 'end', 'cancelled', '')
elseif attempt >= tonumber(ARGV[3]) then
  local err = {{type='service_unavailable', code='worker_lost',
    message='the job was interrupted ' .. attempt .. ' times (last: ' .. ARGV[5] .. '); giving up'}}
  ev = {{type='error', seq=seq, error=err}}
  redis.call('HSET', KEYS[1], 'status', '{_Q("failed")}', 'finished_at', ARGV[4], 'error', cjson.encode(err))
  outcome = 'failed'
  count(KEYS[7], KEYS[1], 'end', 'failed', 'worker_lost')
else
  ev = {{type='restart', seq=seq, attempt=attempt, reason=ARGV[5]}}
  redis.call('HSET', KEYS[1], 'status', '{_Q("queued")}')
  redis.call('ZADD', KEYS[5], ARGV[4], ARGV[6])
  redis.call('HDEL', KEYS[1], 'worker')
  outcome = 'requeued'
  count(KEYS[7], KEYS[1], 'requeue', ARGV[5])
end
local data = cjson.encode(ev)
redis.call('XADD', KEYS[2], seq .. '-0', 'e', data)
redis.call('EXPIRE', KEYS[2], ARGV[7])
redis.call('EXPIRE', KEYS[1], ARGV[7])
redis.call('PUBLISH', KEYS[3], data)
return outcome
"""

# KEYS: job hash. ARGV: field, value, ... Sets them only if the record exists.
_UPDATE = "if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end redis.call('HSET', KEYS[1], unpack(ARGV)) return 1"

# KEYS: job hash, log, channel, queued zset, stats. ARGV: now, job id, error (JSON), ttl.
# queued -> failed with its final `error` event (a job no worker can run); else: nothing.
_FAIL_QUEUED = _LAST_SEQ + f"""
if redis.call('HGET', KEYS[1], 'status') ~= '{_Q("queued")}' then return 0 end
redis.call('HSET', KEYS[1], 'status', '{_Q("failed")}', 'finished_at', ARGV[1], 'error', ARGV[3])
local seq = last_seq(KEYS[2]) + 1
local data = cjson.encode({{type='error', seq=seq, error=cjson.decode(ARGV[3])}})
redis.call('XADD', KEYS[2], seq .. '-0', 'e', data)
redis.call('EXPIRE', KEYS[2], ARGV[4])
redis.call('EXPIRE', KEYS[1], ARGV[4])
redis.call('PUBLISH', KEYS[3], data)
redis.call('ZREM', KEYS[4], ARGV[2])
count(KEYS[5], KEYS[1], 'end', 'failed', cjson.decode(ARGV[3]).code)
return 1
"""

# KEYS: job hash, queued zset, stats, the message's list, then every list of the model's queue.
# ARGV: most messages the queue may hold ('' : no limit), ttl, job id, created_at, stats field,
# the message ('': none), then the record's fields and values. The record and its Celery message
# together, or neither: the queue's depth when it is full, -2 when a message comes with a job that
# already exists (a job is queued once: its record is never overwritten), else -1.
_SUBMIT = """
if ARGV[6] ~= '' and redis.call('EXISTS', KEYS[1]) == 1 then return -2 end
if ARGV[1] ~= '' then
  local depth = 0
  for i = 5, #KEYS do depth = depth + redis.call('LLEN', KEYS[i]) end
  if depth >= tonumber(ARGV[1]) then return depth end
end
redis.call('HSET', KEYS[1], unpack(ARGV, 7))
redis.call('EXPIRE', KEYS[1], ARGV[2])
redis.call('ZADD', KEYS[2], ARGV[4], ARGV[3])
redis.call('HINCRBY', KEYS[3], ARGV[5], 1)
if ARGV[6] ~= '' then redis.call('LPUSH', KEYS[4], ARGV[6]) end
return -1
"""

# KEYS: job hash. ARGV: owner as stored (JSON) or '' (anyone may see it). The whole record when
# the job exists and is that owner's, else nothing: the same work whether the job is missing or
# another owner's, and a reply of the same size.
_GET_VISIBLE = """
if ARGV[1] ~= '' and redis.call('HGET', KEYS[1], 'owner') ~= ARGV[1] then return {} end
return redis.call('HGETALL', KEYS[1])
"""


class AlreadyQueued(Exception):
    """A job with this id was queued before (:meth:`JobStore.submit` wrote nothing)."""


@dataclass
class Claim:
    previous: JobStatus
    attempt: int = 0
    last_seq: int = 0


class JobStore:
    """Typed access to job records and event logs (the client must use ``decode_responses=True``)."""

    def __init__(self, redis: Redis, ttl_s: int) -> None:
        self.redis = redis
        self.ttl_s = ttl_s
        self._claim = redis.register_script(_CLAIM)
        self._cancel = redis.register_script(_CANCEL)
        self._finish = redis.register_script(_FINISH)
        self._append = redis.register_script(_APPEND)
        self._requeue = redis.register_script(_REQUEUE)
        self._update = redis.register_script(_UPDATE)
        self._fail_queued = redis.register_script(_FAIL_QUEUED)
        self._get_visible = redis.register_script(_GET_VISIBLE)
        self._submit = redis.register_script(_SUBMIT)

    async def create(self, record: JobRecord) -> None:
        """Write the job's record alone, without a Celery message (a job some other way sends)."""
        await self._write(record)

    async def submit(self, record: JobRecord, queue_list: str, message: str, max_depth: int) -> int | None:
        """Write the job's record and put its Celery message on ``queue_list`` in one step, unless
        the model's queue already holds ``max_depth`` messages: then nothing is written and the
        depth is returned. :class:`AlreadyQueued` when a job with the record's id exists: nothing
        is written then either."""
        return await self._write(record, queue_list, message, max_depth)

    async def _write(self, record: JobRecord, queue_list: str | None = None, message: str = "",
                     max_depth: int | None = None) -> int | None:
        fields = [x for kv in record.to_hash().items() for x in kv]
        lists = keys.queue_lists(record.model)
        depth = int(await self._submit(
            keys=[keys.job(record.id), keys.QUEUED, keys.STATS, queue_list or lists[0], *lists],
            args=["" if max_depth is None else max_depth, self.ttl_s, record.id, repr(record.created_at),
                  keys.stat("submitted", record.model), message, *fields]))
        if depth == -2:
            raise AlreadyQueued(record.id)
        return None if depth < 0 else depth

    async def get(self, job_id: str) -> JobRecord | None:
        h = await self.redis.hgetall(keys.job(job_id))
        return JobRecord.from_hash(h) if h else None

    async def get_visible(self, job_id: str, owner: str | None) -> JobRecord | None:
        """The record if the job exists and ``owner`` may see it (the rule of
        ``Principal.may_see``: ``None`` sees every job, a key only its own); else None, after the
        same work whether the job is missing or another owner's."""
        flat = await self._get_visible(keys=[keys.job(job_id)], args=[_Q(owner) if owner is not None else ""])
        h = dict(zip(flat[::2], flat[1::2], strict=False))
        return JobRecord.from_hash(h) if h else None

    async def claim(self, job_id: str, worker_id: str, token: str = "") -> Claim | None:
        """queued -> running for ``worker_id`` (a new attempt). None: no such job. A call repeated
        with the same ``token`` after its answer was lost gets the answer the first call had."""
        res = await self._claim(keys=[keys.job(job_id), keys.job_log(job_id), keys.worker_jobs(worker_id),
                                      keys.QUEUED],
                                args=[_Q(worker_id), str(time.time()), job_id, token])
        if res is None:
            return None
        return Claim(JobStatus(json.loads(res[0])), int(res[1]), int(res[2]))

    async def request_cancel(self, job_id: str) -> JobStatus | None:
        """Cancel: a queued job ends now; a running one is flagged (its worker aborts it)."""
        st = await self._cancel(keys=[keys.job(job_id), keys.job_log(job_id), keys.job_channel(job_id), keys.QUEUED,
                                      keys.STATS],
                                args=[str(time.time()), job_id, self.ttl_s])
        return JobStatus(json.loads(st)) if st else None

    async def update(self, job_id: str, **fields: object) -> bool:
        """Set fields of an existing record (False: there is none; a record that expired or was
        never written is not brought back as a partial hash without a TTL)."""
        flat = [x for kv in hash_fields(**fields).items() for x in kv]
        return bool(await self._update(keys=[keys.job(job_id)], args=flat))

    async def finish(self, job_id: str, worker_id: str, attempt: int, event: Event, *, check_log: bool = True,
                     **fields: object) -> JobStatus | None:
        """Write the job's end (terminal fields and final event) atomically, while this attempt
        still owns the running job. ``check_log``: ``event.seq`` must directly follow the last
        logged event (the log holds everything the attempt wrote), or the job ends failed with
        ``log_incomplete`` instead; without it the event is written after whatever the log holds
        (a failure's end). Returns the status written, or None (fenced out)."""
        flat: list[str] = [x for kv in hash_fields(**fields).items() for x in kv]
        res = await self._finish(
            keys=[keys.job(job_id), keys.worker_jobs(worker_id), keys.job_log(job_id), keys.job_channel(job_id),
                  keys.STATS],
            args=[str(attempt), job_id, event.seq if check_log else "",
                  event.model_dump_json(exclude_none=True), self.ttl_s, *flat])
        if not res:
            return None
        return JobStatus.failed if int(res) == 2 else JobStatus(fields.get("status", JobStatus.succeeded))

    async def requeue(self, job_id: str, worker_id: str | None, attempt: int | None, reason: str,
                      max_attempts: int, claimed_before: float | None = None,
                      silent: tuple[str, float] | None = None) -> str:
        """Take a running job back from its worker: 'requeued', 'failed', 'cancelled' or 'skip'.
        ``attempt``: only that attempt; ``claimed_before``: only if it was claimed before that time
        (a reaper passes the time it read the worker's job set); ``silent``: (model, last beat) as
        a reaper judged the worker: 'alive' (and nothing changes) if it has beaten since."""
        wid = worker_id or ""
        model, beat = silent if silent is not None else ("", None)
        return str(await self._requeue(
            keys=[keys.job(job_id), keys.job_log(job_id), keys.job_channel(job_id), keys.worker_jobs(wid),
                  keys.QUEUED, keys.workers(model) if model else keys.QUEUED, keys.STATS],
            args=[_Q(wid) if wid else "", "" if attempt is None else str(attempt), max_attempts,
                  str(time.time()), reason, job_id, self.ttl_s,
                  "" if claimed_before is None else repr(claimed_before),
                  "" if beat is None else repr(beat), wid]))

    async def fail_queued(self, job_id: str, error: ErrorInfo) -> bool:
        """End a job that is still queued as failed, with its final ``error`` event (a job whose
        message no worker can decode). True if it was queued; otherwise nothing changes."""
        return bool(await self._fail_queued(
            keys=[keys.job(job_id), keys.job_log(job_id), keys.job_channel(job_id), keys.QUEUED, keys.STATS],
            args=[str(time.time()), job_id, hash_fields(error=error)["error"], self.ttl_s]))

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

    async def queue_depth(self, model: str) -> int:
        """Messages waiting in the model's Celery queue, all priorities together (one round trip)."""
        async with self.redis.pipeline(transaction=False) as p:
            for name in keys.queue_lists(model):
                p.llen(name)
            return sum(await p.execute())

    async def read_log(self, job_id: str, after: int = 0) -> list[Event]:
        """Every logged event with ``seq > after``, in order."""
        return [parse_event(raw) for raw in await self.read_log_raw(job_id, after)]

    async def read_log_raw(self, job_id: str, after: int = 0) -> list[str]:
        """:meth:`read_log` as stored: each event's JSON text."""
        rows = await self.redis.xrange(keys.job_log(job_id), min=f"{after + 1}-0", max="+")
        return [fields["e"] for _, fields in rows]


def is_duplicate_id(err: Exception | None) -> bool:
    """True for Redis' refusal of an event whose seq was already logged."""
    return isinstance(err, ResponseError) and "equal or smaller" in str(err)
