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
from typing import Sequence

from redis.asyncio import Redis
from redis.exceptions import ResponseError

from shared import keys
from shared.schemas import (
    DoneEvent,
    ErrorEvent,
    JobRecord,
    JobStatus,
    TokenEvent,
    hash_fields,
    parse_event,
)

Event = TokenEvent | DoneEvent | ErrorEvent
_Q = json.dumps  # stored form of a string field: JSON

# KEYS[1]=job hash. ARGV[1]=worker id, ARGV[2]=now. Returns the status before the call (JSON) or nil.
_CLAIM = f"""
local st = redis.call('HGET', KEYS[1], 'status')
if not st then return nil end
if st == '{_Q("queued")}' then
  redis.call('HSET', KEYS[1], 'status', '{_Q("running")}', 'worker', ARGV[1], 'started_at', ARGV[2])
end
return st
"""

# KEYS[1]=job hash, KEYS[2]=log, KEYS[3]=channel. ARGV[1]=now, ARGV[2]=cancelled event JSON, ARGV[3]=ttl.
# queued -> cancelled at once (with its final event); running -> flag it; else: nothing.
_CANCEL = f"""
local st = redis.call('HGET', KEYS[1], 'status')
if not st then return nil end
if st == '{_Q("queued")}' then
  redis.call('HSET', KEYS[1], 'status', '{_Q("cancelled")}', 'finished_at', ARGV[1],
             'finish_reason', '{_Q("cancelled")}')
  redis.call('XADD', KEYS[2], '1-0', 'e', ARGV[2])
  redis.call('EXPIRE', KEYS[2], ARGV[3])
  redis.call('PUBLISH', KEYS[3], ARGV[2])
elseif st == '{_Q("running")}' then
  redis.call('HSET', KEYS[1], 'cancel_requested', 'true')
end
return st
"""

# KEYS[1]=job hash. ARGV = field, value, ... Writes only while the job is running.
_FINISH = f"""
if redis.call('HGET', KEYS[1], 'status') ~= '{_Q("running")}' then return 0 end
redis.call('HSET', KEYS[1], unpack(ARGV))
return 1
"""


class JobStore:
    """Typed access to job records and event logs (the client must use ``decode_responses=True``)."""

    def __init__(self, redis: Redis, ttl_s: int) -> None:
        self.redis = redis
        self.ttl_s = ttl_s
        self._claim = redis.register_script(_CLAIM)
        self._cancel = redis.register_script(_CANCEL)
        self._finish = redis.register_script(_FINISH)

    async def create(self, record: JobRecord) -> None:
        key = keys.job(record.id)
        async with self.redis.pipeline(transaction=True) as p:
            p.hset(key, mapping=record.to_hash())
            p.expire(key, self.ttl_s)
            await p.execute()

    async def get(self, job_id: str) -> JobRecord | None:
        h = await self.redis.hgetall(keys.job(job_id))
        return JobRecord.from_hash(h) if h else None

    async def claim(self, job_id: str, worker_id: str) -> JobStatus | None:
        """queued -> running for ``worker_id``. Returns the status the job had (None: no such job)."""
        st = await self._claim(keys=[keys.job(job_id)], args=[_Q(worker_id), str(time.time())])
        return JobStatus(json.loads(st)) if st else None

    async def request_cancel(self, job_id: str) -> JobStatus | None:
        """Cancel: a queued job ends now; a running one is flagged (its worker aborts it)."""
        done = DoneEvent(seq=1, status=JobStatus.cancelled, finish_reason="cancelled")
        st = await self._cancel(
            keys=[keys.job(job_id), keys.job_log(job_id), keys.job_channel(job_id)],
            args=[str(time.time()), done.model_dump_json(), self.ttl_s],
        )
        return JobStatus(json.loads(st)) if st else None

    async def update(self, job_id: str, **fields: object) -> None:
        await self.redis.hset(keys.job(job_id), mapping=hash_fields(**fields))

    async def finish(self, job_id: str, **fields: object) -> bool:
        """Write terminal fields, only while the job is still running. True if written."""
        flat: list[str] = [x for kv in hash_fields(**fields).items() for x in kv]
        return bool(await self._finish(keys=[keys.job(job_id)], args=flat))

    async def append(self, items: Sequence[tuple[str, Event]]) -> list[Exception | None]:
        """Log and publish many jobs' events in one round trip. Returns a per-item error or None."""
        counts: list[int] = []
        async with self.redis.pipeline(transaction=False) as p:
            for job_id, ev in items:
                data = ev.model_dump_json(exclude_none=True)
                p.xadd(keys.job_log(job_id), {"e": data}, id=f"{ev.seq}-0")
                p.publish(keys.job_channel(job_id), data)
                counts.append(2)
                if ev.seq == 1 or ev.type != "token":
                    p.expire(keys.job_log(job_id), self.ttl_s)
                    counts[-1] += 1
            res = await p.execute(raise_on_error=False)
        out: list[Exception | None] = []
        i = 0
        for n in counts:
            out.append(next((r for r in res[i : i + n] if isinstance(r, Exception)), None))
            i += n
        return out

    async def read_log(self, job_id: str, after: int = 0) -> list[Event]:
        """Every logged event with ``seq > after``, in order."""
        rows = await self.redis.xrange(keys.job_log(job_id), min=f"{after + 1}-0", max="+")
        return [parse_event(fields["e"]) for _, fields in rows]

    async def last_seq(self, job_id: str) -> int:
        rows = await self.redis.xrevrange(keys.job_log(job_id), count=1)
        return int(rows[0][0].split("-")[0]) if rows else 0


def is_duplicate_id(err: Exception | None) -> bool:
    """True for Redis' refusal of an event whose seq was already logged."""
    return isinstance(err, ResponseError) and "equal or smaller" in str(err)
