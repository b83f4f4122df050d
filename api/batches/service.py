"""Batches as clients see them: create, retrieve, list, cancel. The runner (runner.py) moves them.

A batch is the hash ``keys.batch(id)``: ``record`` (:class:`BatchRecord`, written at creation and
then only by the gateway holding the batch's lease), ``next`` (lines queued so far), ``ok`` and
``err`` (lines answered, counted in the same transaction that stores their output line) and
``cancel`` (when a cancel was asked: the request writes only that field, so it never races the
runner). What a client sees is the record with those fields folded in.
"""

from __future__ import annotations

import json
import re
import secrets
import time

from redis.asyncio import Redis

from inferq.api.auth import Principal
from inferq.api.batches.files import FileStore
from inferq.api.batches.schemas import ENDED, Batch, BatchCreate, BatchList, BatchRecord
from inferq.shared import keys
from inferq.shared.errors import InvalidRequest, NotFound
from inferq.shared.redis import text_map, texts

COMPLETION_WINDOW_S = 24 * 3600
_BATCH_ID = re.compile(keys.BATCH_ID_PATTERN)


def new_batch_id() -> str:
    return "batch_" + secrets.token_hex(12)


def batch_not_found(batch_id: str) -> NotFound:
    return NotFound(f"no batch {batch_id[:80]!r}", param="batch_id", code="batch_not_found")


def view(fields: dict[str, str]) -> tuple[BatchRecord, Batch]:
    """The stored record, and the batch as a client sees it (its counts; ``cancelling`` once asked)."""
    rec = BatchRecord.model_validate_json(fields["record"])
    b = rec.batch.model_copy(deep=True)
    b.request_counts.completed = int(fields.get("ok") or 0)
    b.request_counts.failed = int(fields.get("err") or 0)
    if (asked := fields.get("cancel")) and b.status in ("validating", "in_progress", "finalizing"):
        b.status, b.cancelling_at = "cancelling", int(float(asked))
    return rec, b


class BatchService:
    def __init__(self, redis: Redis, files: FileStore, holder: str, lease_s: float) -> None:
        self.redis = redis
        self.files = files
        self.holder = holder  # this gateway's batch runner: it advances the batches created here
        self.lease_ms = int(lease_s * 1000)

    async def create(self, req: BatchCreate, caller: Principal) -> Batch:
        meta = await self.files.get(req.input_file_id, caller, "input_file_id")
        if meta.purpose != "batch":
            raise InvalidRequest(f"file {meta.id} has purpose {meta.purpose!r}; a batch's input file is "
                                 "uploaded with purpose 'batch'", param="input_file_id")
        now = int(time.time())
        b = Batch(id=new_batch_id(), endpoint=req.endpoint, input_file_id=meta.id, created_at=now,
                  expires_at=now + COMPLETION_WINDOW_S, metadata=req.metadata)
        ttl = req.output_expires_after.seconds if req.output_expires_after is not None else None
        rec = BatchRecord(batch=b, owner=caller.key_id, subject=caller.subject, secret=secrets.token_hex(16),
                          output_ttl_s=ttl)
        async with self.redis.pipeline(transaction=True) as p:
            p.hset(keys.batch(b.id), mapping={"record": rec.model_dump_json(), "next": 0, "ok": 0, "err": 0})
            p.zadd(keys.batches(caller.key_id), {b.id: time.time()})
            p.sadd(keys.BATCHES_ACTIVE, b.id)
            p.set(keys.batch_part(b.id, "lease"), self.holder, px=self.lease_ms)
            await p.execute()
        return b

    async def _fields(self, batch_id: str, caller: Principal) -> dict[str, str]:
        fields = text_map(await self.redis.hgetall(keys.batch(batch_id))) if _BATCH_ID.fullmatch(batch_id) else {}
        if not fields or not caller.may_see(json.loads(fields["record"]).get("owner")):
            raise batch_not_found(batch_id)
        return fields

    async def get(self, batch_id: str, caller: Principal) -> Batch:
        return view(await self._fields(batch_id, caller))[1]

    async def cancel(self, batch_id: str, caller: Principal) -> Batch:
        """Ask for the batch to stop: queued lines are not run, running ones are aborted, and what
        was answered is written out; the batch ends ``cancelled``. An ended batch stays as it is."""
        _, b = view(await self._fields(batch_id, caller))
        if b.status in ENDED:
            raise InvalidRequest(f"batch {batch_id} has ended ({b.status}); it cannot be cancelled",
                                 param="batch_id", code="batch_not_cancellable")
        await self.redis.hsetnx(keys.batch(batch_id), "cancel", time.time())
        return await self.get(batch_id, caller)

    async def list(self, caller: Principal, limit: int, after: str | None) -> BatchList:
        """The caller's batches, newest first; ``after``: continue after that batch id."""
        start = 0
        if after is not None:
            # redis-py types ZREVRANK for WITHSCORE too (a list); without it the reply is the rank or nil
            rank: int | None = await self.redis.zrevrank(keys.batches(caller.key_id), after)  # type: ignore[assignment]
            start = rank + 1 if rank is not None else 0
        ids = texts(await self.redis.zrevrange(keys.batches(caller.key_id), start, start + limit))
        async with self.redis.pipeline(transaction=False) as p:
            for i in ids[:limit]:
                p.hgetall(keys.batch(i))
            found = [view(f)[1] for f in await p.execute() if f]
        return BatchList(data=found, has_more=len(ids) > limit,
                         first_id=found[0].id if found else None, last_id=found[-1].id if found else None)
