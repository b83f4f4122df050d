"""The batch runner: every gateway runs one; it turns batches' lines into ordinary jobs.

Each poll, a runner takes the lease of every active batch it can (``keys.batch_part(id, "lease")``,
renewed while it works, ``batch_lease_s`` long): one gateway advances a batch at a time, and when
that gateway goes away another takes over where Redis says the batch is. A step of a batch:

1. ``validating``: read the input file, check its format (``lines.check_file``); errors fail the
   batch before any job is queued; otherwise the lines are stored and the batch is ``in_progress``.
2. A cancel asked for, or the completion window passed: the batch's unfinished jobs are cancelled
   (queued ones never run, running ones are aborted) and no more lines are queued.
3. Lines whose jobs all ended are answered: the output or error line is stored and counted in one
   transaction, and the line leaves the running set.
4. More lines are queued, each as its endpoint would queue it (one job per prompt) at
   ``batch_priority``, until ``batch_window`` lines are unfinished. A full queue or the key's
   concurrency limit just waits for the next poll; a line its endpoint would refuse is answered
   with that error at once.
5. No line left to run: the output and error files are written and the batch ends ``completed``
   (or ``cancelled``, ``expired``: lines that never ran get a ``batch_cancelled``/``batch_expired``
   error line).

Everything a step needs is in Redis, so a gateway restart loses nothing. A gateway that dies right
after queueing a line's jobs but before recording them leaves those jobs to run unrecorded; the
line is queued again by the next runner (its result is written once).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import secrets
import socket
import time

from redis.asyncio import Redis
from starlette.concurrency import run_in_threadpool

from inferq.api.admission import Admission
from inferq.api.batches import lines
from inferq.api.batches.files import FileStore
from inferq.api.batches.schemas import ENDED, BatchError, BatchErrors, BatchRecord, OutputLine
from inferq.api.service import new_job_id
from inferq.shared import keys
from inferq.shared.errors import InferqError, NotFound, RateLimited, Unavailable
from inferq.shared.schemas import TERMINAL_STATUSES
from inferq.shared.settings import Settings

log = logging.getLogger(__name__)

# KEYS[1]=lease. ARGV[1]=holder, ARGV[2]=ms. 1: held by ARGV[1] (taken or renewed), 0: someone else's.
_LEASE = """
local v = redis.call('GET', KEYS[1])
if not v then redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2]) return 1 end
if v == ARGV[1] then redis.call('PEXPIRE', KEYS[1], ARGV[2]) return 1 end
return 0
"""
_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""
_MESSAGES = {"cancelled": "the batch was cancelled before this request finished",
             "expired": "the batch's completion window ended before this request finished"}


class LeaseLost(Exception):
    """Another gateway holds the batch now: stop advancing it."""


class BatchRunner:
    def __init__(self, settings: Settings, redis: Redis, admission: Admission, files: FileStore) -> None:
        self.settings = settings
        self.redis = redis
        self.admission = admission
        self.store = admission.service.store
        self.files = files
        self.me = f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"  # the lease's holder
        self._lease = redis.register_script(_LEASE)
        self._release = redis.register_script(_RELEASE)
        self._task: asyncio.Task[None] | None = None
        self._held: set[str] = set()

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._loop())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        for batch_id in self._held:  # let another gateway take over now rather than after the lease
            with contextlib.suppress(Exception):
                await self._release(keys=[keys.batch_part(batch_id, "lease")], args=[self.me])

    async def _loop(self) -> None:
        while True:
            try:
                active = await self.redis.smembers(keys.BATCHES_ACTIVE)
            except Exception:  # Redis away: try again next poll
                log.warning("batch runner: cannot read the active batches", exc_info=True)
                active = set()
            for batch_id in active:
                try:
                    if await self._hold(batch_id):
                        await self.advance(batch_id)
                except LeaseLost:
                    continue
                except Exception:  # Redis away, or a bug: log it, and try again next poll
                    log.warning("batch %s: a step failed", batch_id, exc_info=True)
            await asyncio.sleep(self.settings.batch_poll_s)

    async def _hold(self, batch_id: str) -> bool:
        ms = int(self.settings.batch_lease_s * 1000)
        held = bool(await self._lease(keys=[keys.batch_part(batch_id, "lease")], args=[self.me, ms]))
        (self._held.add if held else self._held.discard)(batch_id)
        return held

    async def _renew(self, batch_id: str) -> None:
        if not await self._hold(batch_id):
            raise LeaseLost(batch_id)

    async def _save(self, rec: BatchRecord, **fields: object) -> None:
        await self.redis.hset(keys.batch(rec.batch.id), mapping={"record": rec.model_dump_json(), **fields})

    async def advance(self, batch_id: str) -> None:
        """One step of the batch (the module's docstring)."""
        fields = await self.redis.hgetall(keys.batch(batch_id))
        if not fields or BatchRecord.model_validate_json(fields["record"]).batch.status in ENDED:
            await self.redis.srem(keys.BATCHES_ACTIVE, batch_id)
            return
        rec = BatchRecord.model_validate_json(fields["record"])
        b, asked = rec.batch, fields.get("cancel")
        if b.status == "validating":
            if asked:
                b.status, b.cancelling_at, b.cancelled_at = "cancelled", int(float(asked)), int(time.time())
                return await self._end(rec)
            if not await self._validate(rec):
                return
        if rec.ending is None and (asked or time.time() >= b.expires_at):
            rec.ending = "cancelled" if asked else "expired"
            if asked:
                b.status, b.cancelling_at = "cancelling", int(float(asked))
            await self._save(rec)
        if rec.ending is not None and not rec.aborted:
            await self._abort(rec)
        await self._collect(rec)
        if rec.ending is None:
            await self._top_up(rec)
        nxt = int(await self.redis.hget(keys.batch(batch_id), "next") or 0)
        if await self.redis.hlen(keys.batch_part(batch_id, "running")) == 0 and (
                rec.ending is not None or nxt >= b.request_counts.total):
            await self._finish(rec, nxt)

    async def _validate(self, rec: BatchRecord) -> bool:
        b = rec.batch
        try:
            text = await self.files.read(b.input_file_id)
            good, errors = await run_in_threadpool(lines.check_file, text, b.endpoint, self.settings.max_batch_lines)
        except NotFound:
            good, errors = [], [BatchError(code="file_not_found", param="input_file_id",
                                           message=f"the input file {b.input_file_id} was deleted")]
        now = int(time.time())
        if errors:
            b.status, b.failed_at, b.errors = "failed", now, BatchErrors(data=errors)
            await self._end(rec)
            return False
        b.status, b.in_progress_at, b.request_counts.total = "in_progress", now, len(good)
        key = keys.batch_part(b.id, "lines")
        async with self.redis.pipeline(transaction=True) as p:
            p.delete(key)
            for i in range(0, len(good), 1000):
                p.rpush(key, *good[i:i + 1000])
            p.hset(keys.batch(b.id), mapping={"record": rec.model_dump_json(), "next": 0})
            await p.execute()
        log.info("batch %s: %d requests, in progress", b.id, len(good))
        return True

    async def _abort(self, rec: BatchRecord) -> None:
        for raw in (await self.redis.hgetall(keys.batch_part(rec.batch.id, "running"))).values():
            for job_id in json.loads(raw)["jobs"]:
                with contextlib.suppress(InferqError):
                    await self.admission.service.cancel(job_id)
        rec.aborted = True
        await self._save(rec)

    async def _answer(self, batch_id: str, index: int, out: OutputLine, running: bool) -> None:
        ok = out.response is not None and out.response.status_code == 200
        async with self.redis.pipeline(transaction=True) as p:
            p.hset(keys.batch_part(batch_id, "results"), str(index), out.model_dump_json())
            if running:
                p.hdel(keys.batch_part(batch_id, "running"), str(index))
            else:
                p.hset(keys.batch(batch_id), "next", index + 1)
            p.hincrby(keys.batch(batch_id), "ok" if ok else "err", 1)
            p.hincrby(keys.STATS, keys.stat("batch_line", "ok" if ok else "error"), 1)
            await p.execute()

    async def _collect(self, rec: BatchRecord) -> None:
        """Answer the lines whose jobs have all ended."""
        bid = rec.batch.id
        running = {int(i): json.loads(v) for i, v in (await self.redis.hgetall(keys.batch_part(bid, "running"))).items()}
        ids = [j for entry in running.values() for j in entry["jobs"]]
        async with self.redis.pipeline(transaction=False) as p:
            for j in ids:
                p.hget(keys.job(j), "status")
            status = {j: json.loads(s) if s else None for j, s in zip(ids, await p.execute())}
        for n, (index, entry) in enumerate(sorted(running.items())):
            states = [status[j] for j in entry["jobs"]]
            if any(s is not None and s not in TERMINAL_STATUSES for s in states):
                continue
            if n % 32 == 31:
                await self._renew(bid)
            raw = await self.redis.lindex(keys.batch_part(bid, "lines"), index)
            await self._answer(bid, index, await self._result(rec, raw, entry, states), running=True)

    async def _result(self, rec: BatchRecord, raw: str, entry: dict, states: list[str | None]) -> OutputLine:
        custom_id = lines.custom_id_of(raw)
        if None in states:  # a job record expired (the batch outlived the job TTL) or was never written
            return lines.unanswered(custom_id, "job_lost", "the request's job record is gone")
        if "cancelled" in states:
            code = f"batch_{rec.ending}" if rec.ending else "cancelled"
            return lines.unanswered(custom_id, code, _MESSAGES.get(rec.ending or "", "the request's job "
                                                                   "was cancelled"))
        logs = [await self.store.read_log(j) for j in entry["jobs"]]
        try:
            prep = lines.prepare(raw, self.settings)
        except Exception as e:  # the gateway's limits changed since the line was queued
            return lines.refused(custom_id, e)
        return lines.answered(prep, entry["jobs"], entry["model"], logs)

    async def _top_up(self, rec: BatchRecord) -> None:
        """Queue lines until ``batch_window`` are unfinished (or the queue, or the key, is full)."""
        bid, total = rec.batch.id, rec.batch.request_counts.total
        nxt = int(await self.redis.hget(keys.batch(bid), "next") or 0)
        room = self.settings.batch_window - await self.redis.hlen(keys.batch_part(bid, "running"))
        if room <= 0 or nxt >= total:
            return
        for n, raw in enumerate(await self.redis.lrange(keys.batch_part(bid, "lines"), nxt, nxt + room - 1)):
            if n % 32 == 31:
                await self._renew(bid)
            index = nxt + n
            try:
                prep = lines.prepare(raw, self.settings)
                ids = [new_job_id() for _ in prep.jobs]
                self._check_fits(ids)
            except Exception as e:  # what the endpoint would answer instead of running the request
                await self._answer(bid, index, lines.refused(lines.custom_id_of(raw), e), running=False)
                continue
            try:
                records = await self.admission.queue(rec.subject, rec.owner, prep.jobs, ids)
            except (RateLimited, Unavailable):  # the queue or the key's job slots are full: next poll
                return
            except Exception as e:  # refused at submission (an unknown model, a prompt over the context)
                await self._answer(bid, index, lines.refused(lines.custom_id_of(raw), e), running=False)
                continue
            entry = json.dumps({"jobs": ids, "model": records[0].model})
            async with self.redis.pipeline(transaction=True) as p:
                p.hset(keys.batch_part(bid, "running"), str(index), entry)
                p.hset(keys.batch(bid), "next", index + 1)
                await p.execute()

    def _check_fits(self, ids: list[str]) -> None:
        """A line with more prompts than its key may have unfinished jobs would wait forever."""
        limit = self.settings.max_concurrent_jobs_per_key
        if limit and len(ids) > limit:
            raise RateLimited(f"this request needs {len(ids)} jobs and its key may have at most {limit} "
                              "unfinished (INFERQ_MAX_CONCURRENT_JOBS_PER_KEY)", code="too_many_jobs")

    async def _finish(self, rec: BatchRecord, nxt: int) -> None:
        """Write the output and error files and end the batch."""
        b, bid = rec.batch, rec.batch.id
        b.finalizing_at = int(time.time())
        if rec.ending is not None:  # the lines never queued
            for n, raw in enumerate(await self.redis.lrange(keys.batch_part(bid, "lines"), nxt, -1)):
                out = lines.unanswered(lines.custom_id_of(raw), f"batch_{rec.ending}", _MESSAGES[rec.ending])
                await self._answer(bid, nxt + n, out, running=False)
        else:
            b.status = "finalizing"
            await self._save(rec)
        results = await self.redis.hgetall(keys.batch_part(bid, "results"))
        output: list[str] = []
        errors: list[str] = []
        for _, raw in sorted((int(i), r) for i, r in results.items()):
            out = OutputLine.model_validate_json(raw)
            (output if out.response is not None and out.response.status_code == 200 else errors).append(raw)
        for part, name, attr in ((output, "output", "output_file_id"), (errors, "error", "error_file_id")):
            if part:
                f = await self.files.create(rec.owner, "batch_output", f"{bid}_{name}.jsonl",
                                            ("\n".join(part) + "\n").encode())
                setattr(b, attr, f.id)
        now = int(time.time())
        if rec.ending == "cancelled":
            b.status, b.cancelled_at = "cancelled", now
        elif rec.ending == "expired":
            b.status, b.expired_at = "expired", now
        else:
            b.status, b.completed_at = "completed", now
        await self._end(rec)

    async def _end(self, rec: BatchRecord) -> None:
        bid = rec.batch.id
        async with self.redis.pipeline(transaction=True) as p:
            p.hset(keys.batch(bid), "record", rec.model_dump_json())
            p.delete(*(keys.batch_part(bid, part) for part in ("lines", "running", "results")))
            p.srem(keys.BATCHES_ACTIVE, bid)
            await p.execute()
        log.info("batch %s: %s", bid, rec.batch.status)
