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

Everything a step needs is in Redis, so a gateway restart loses nothing. Every write that changes
a batch is a script that first checks the lease is still the runner's, so a runner that stalled
past its lease cannot touch the batch another gateway now advances; a line's answer is stored
once (``HSETNX``) and counted with it. A line's jobs run ``timeout`` = what is left of the
completion window, not the interactive default. A batch leaves a quarter of its key's job slots
and of its model's queue depth to interactive requests. A gateway that stops lets its step
finish and gives its leases up. A line's job ids follow from the batch's secret and the line's
index (:func:`line_job_ids`), and a job id is queued once (``JobStore.submit``): a runner that
dies after queueing a line's jobs but before recording them leaves jobs that the next runner
finds by their ids and records, not a line queued twice; two runners that queue the same line
at once (one stalled past its lease) queue its jobs once between them.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import os
import secrets
import socket
import time

from redis.asyncio import Redis
from redis.exceptions import RedisError
from redis.typing import EncodableT
from starlette.concurrency import run_in_threadpool

from inferq.api.admission import Admission
from inferq.api.batches import lines
from inferq.api.batches.files import FileStore
from inferq.api.batches.schemas import ENDED, BatchError, BatchErrors, BatchRecord, OutputLine
from inferq.shared import keys, lua
from inferq.shared.errors import InferqError, NotFound, RateLimited, Unavailable
from inferq.shared.redis import text_map, text_or_none, text_set, texts
from inferq.shared.schemas import TERMINAL_STATUSES, JobRequest
from inferq.shared.settings import Settings

log = logging.getLogger(__name__)

_MESSAGES = {"cancelled": "the batch was cancelled before this request finished",
             "expired": "the batch's completion window ended before this request finished"}


def line_job_ids(rec: BatchRecord, index: int, n: int) -> list[str]:
    """The ids of line ``index``'s ``n`` jobs: the same for every runner, unguessable without the
    batch's secret."""
    seed = rec.secret or rec.batch.id
    return [f"job-{hashlib.sha256(f'{seed}:{index}:{k}'.encode()).hexdigest()[:32]}" for k in range(n)]


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
        self._lease = lua.register(redis, "batch_lease")
        self._scripts = {name: lua.register(redis, f"batch_{name}")  # each checks the lease is still ours
                         for name in ("release", "save", "validated", "run", "answer", "end")}
        self._task: asyncio.Task[None] | None = None
        self._stopping = False
        self._held: set[str] = set()

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._loop())

    async def stop(self, grace_s: float = 10.0) -> None:
        """Let the step in progress end (at most ``grace_s``), then give the leases up so that
        another gateway takes these batches over at once."""
        self._stopping = True
        if self._task is not None:
            with contextlib.suppress(asyncio.TimeoutError, asyncio.CancelledError):
                await asyncio.wait_for(self._task, grace_s)
        for batch_id in self._held:
            with contextlib.suppress(Exception):
                await self._fenced("release", batch_id)

    async def _loop(self) -> None:
        while not self._stopping:
            try:
                await self.files.sweep()
            except Exception:  # Redis away: next poll
                log.warning("batch runner: cannot delete the expired files", exc_info=True)
            try:
                active = text_set(await self.redis.smembers(keys.BATCHES_ACTIVE))
            except Exception:  # Redis away: try again next poll
                log.warning("batch runner: cannot read the active batches", exc_info=True)
                active = set()
            for batch_id in active:
                if self._stopping:
                    return
                try:
                    if await self._hold(batch_id):
                        await self._step(batch_id)
                except LeaseLost:
                    self._held.discard(batch_id)
                except Exception:  # Redis away, or a bug: log it, and try again next poll
                    log.warning("batch %s: a step failed", batch_id, exc_info=True)
            await asyncio.sleep(self.settings.batch_poll_s)

    async def _hold(self, batch_id: str) -> bool:
        ms = int(self.settings.batch_lease_s * 1000)
        held = bool(await self._lease(keys=[keys.batch_part(batch_id, "lease")], args=[self.me, ms]))
        (self._held.add if held else self._held.discard)(batch_id)
        return held

    async def _step(self, batch_id: str) -> None:
        """One step, with the lease renewed while it runs (a long step keeps its batch)."""

        async def keep() -> None:
            while True:
                await asyncio.sleep(self.settings.batch_lease_s / 3)
                with contextlib.suppress(Exception):
                    if not await self._hold(batch_id):
                        return  # lost: the step's writes are refused from now on

        keeper = asyncio.get_running_loop().create_task(keep())
        try:
            await self.advance(batch_id)
        finally:
            keeper.cancel()

    async def _fenced(self, name: str, batch_id: str, *keys_: str, args: tuple[EncodableT, ...] = ()) -> int:
        """Run a write script; LeaseLost when the batch is no longer this runner's."""
        got = int(await self._scripts[name](keys=[keys.batch_part(batch_id, "lease"), *keys_], args=[self.me, *args]))
        if got < 0:
            raise LeaseLost(batch_id)
        return got

    async def _save(self, rec: BatchRecord) -> None:
        await self._fenced("save", rec.batch.id, keys.batch(rec.batch.id), args=(rec.model_dump_json(),))

    async def advance(self, batch_id: str) -> None:
        """One step of the batch (the module's docstring); the caller holds its lease."""
        fields = await self.redis.hgetall(keys.batch(batch_id))
        rec = BatchRecord.model_validate_json(fields["record"]) if fields else None
        if rec is None or rec.batch.status in ENDED:
            await self.redis.srem(keys.BATCHES_ACTIVE, batch_id)
            return
        b, asked, now = rec.batch, fields.get("cancel"), time.time()
        if b.status == "validating":
            if asked or now >= b.expires_at:
                if asked:
                    b.status, b.cancelling_at, b.cancelled_at = "cancelled", int(float(asked)), int(now)
                else:
                    b.status, b.expired_at = "expired", int(now)
                return await self._end(rec)
            if not await self._validate(rec):
                return
        if rec.ending is None and (asked or now >= b.expires_at):
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
        except RedisError:
            raise
        except Exception as e:  # never retried forever: a file that cannot be read fails its batch
            log.exception("batch %s: validation failed", b.id)
            good, errors = [], [BatchError(code="invalid_file", message=f"the file could not be read: {e}"[:300])]
        now = int(time.time())
        if errors:
            b.status, b.failed_at, b.errors = "failed", now, BatchErrors(data=errors)
            await self._end(rec)
            return False
        b.status, b.in_progress_at, b.request_counts.total = "in_progress", now, len(good)
        staged = keys.batch_part(b.id, f"staged:{self.me}")
        async with self.redis.pipeline(transaction=False) as p:
            p.delete(staged)
            for i in range(0, len(good), 1000):
                p.rpush(staged, *good[i:i + 1000])
            p.expire(staged, 3600)
            await p.execute()
        await self._fenced("validated", b.id, keys.batch(b.id), keys.batch_part(b.id, "lines"), staged,
                           args=(rec.model_dump_json(),))
        log.info("batch %s: %d requests, in progress", b.id, len(good))
        return True

    async def _abort(self, rec: BatchRecord) -> None:
        """Cancel the unfinished lines' jobs, and those of the next line, which a runner that died
        may have queued without recording them."""
        bid = rec.batch.id
        ids = [j for raw in text_map(await self.redis.hgetall(keys.batch_part(bid, "running"))).values()
               for j in json.loads(raw)["jobs"]]
        nxt = int(await self.redis.hget(keys.batch(bid), "next") or 0)
        if (raw := text_or_none(await self.redis.lindex(keys.batch_part(bid, "lines"), nxt))) is not None:
            with contextlib.suppress(Exception):  # a line its endpoint refuses never had jobs
                ids += line_job_ids(rec, nxt, len(lines.prepare(raw, self.settings).jobs))
        for job_id in ids:
            with contextlib.suppress(InferqError):
                await self.admission.service.cancel(job_id)
        rec.aborted = True
        await self._save(rec)

    def _answer_args(self, bid: str, index: int, out: OutputLine) -> tuple[list[str], list[EncodableT]]:
        ok = out.response is not None and out.response.status_code == 200
        return ([keys.batch_part(bid, "lease"), keys.batch_part(bid, "results"), keys.batch_part(bid, "running"),
                 keys.batch(bid), keys.STATS],
                [self.me, index, out.model_dump_json(), "ok" if ok else "err",
                 keys.stat("batch_line", "ok" if ok else "error")])

    async def _answer(self, bid: str, index: int, out: OutputLine) -> None:
        k, a = self._answer_args(bid, index, out)
        if int(await self._scripts["answer"](keys=k, args=a)) < 0:
            raise LeaseLost(bid)

    async def _collect(self, rec: BatchRecord) -> None:
        """Answer the lines whose jobs have all ended."""
        bid = rec.batch.id
        entries = text_map(await self.redis.hgetall(keys.batch_part(bid, "running")))
        running = {int(i): json.loads(v) for i, v in entries.items()}
        ids = [j for entry in running.values() for j in entry["jobs"]]
        async with self.redis.pipeline(transaction=False) as p:
            for j in ids:
                p.hget(keys.job(j), "status")
            status = {j: json.loads(s) if s else None for j, s in zip(ids, await p.execute(), strict=True)}
        for index, entry in sorted(running.items()):
            states = [status[j] for j in entry["jobs"]]
            if any(s is not None and s not in TERMINAL_STATUSES for s in states):
                continue
            raw = text_or_none(await self.redis.lindex(keys.batch_part(bid, "lines"), index))
            if raw is None:
                raise LookupError(f"batch {bid}: line {index} is not stored")
            await self._answer(bid, index, await self._result(rec, raw, entry, states))

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

    def _limits(self) -> tuple[int, int]:
        """The key's job slots and the model's queue depth a batch may fill: a quarter of each is
        kept for interactive requests (all of a key's slots when it has fewer than 4)."""
        per_key = self.settings.max_concurrent_jobs_per_key
        depth = self.settings.max_queue_depth
        return per_key - per_key // 4, max(1, depth - depth // 4)

    async def _top_up(self, rec: BatchRecord) -> None:
        """Queue lines until ``batch_window`` are unfinished (or the queue, or the key, is full)."""
        bid, total = rec.batch.id, rec.batch.request_counts.total
        nxt = int(await self.redis.hget(keys.batch(bid), "next") or 0)
        room = self.settings.batch_window - await self.redis.hlen(keys.batch_part(bid, "running"))
        if room <= 0 or nxt >= total:
            return
        key_slots, max_depth = self._limits()
        timeout = max(1.0, rec.batch.expires_at - time.time())  # a line may wait as long as its batch
        for n, raw in enumerate(texts(await self.redis.lrange(keys.batch_part(bid, "lines"), nxt, nxt + room - 1))):
            if self._stopping:
                return
            index = nxt + n
            try:
                prep = lines.prepare(raw, self.settings)
                jobs = [j.model_copy(update={"timeout": timeout}) for j in prep.jobs]
                ids = line_job_ids(rec, index, len(jobs))
                self._check_fits(ids)
            except Exception as e:  # what the endpoint would answer instead of running the request
                await self._answer(bid, index, lines.refused(lines.custom_id_of(raw), e))
                continue
            try:  # the rest of the key's slots and of the queue are left to interactive requests
                model = await self._queue(rec, jobs, ids, key_slots, max_depth)
            except (RateLimited, Unavailable, RedisError):  # the queue or the key is full, or Redis
                return                                       # away: try again next poll
            except Exception as e:  # refused at submission (an unknown model, a prompt over the context)
                for job_id in ids:  # the line's jobs queued before the refusal do not run for nothing
                    with contextlib.suppress(InferqError):
                        await self.admission.service.cancel(job_id)
                await self._answer(bid, index, lines.refused(lines.custom_id_of(raw), e))
                continue
            # LeaseLost here: another gateway has the batch, and finds these jobs by their ids
            await self._fenced("run", bid, keys.batch_part(bid, "running"), keys.batch(bid),
                               args=(index, json.dumps({"jobs": ids, "model": model})))

    async def _queue(self, rec: BatchRecord, jobs: list[JobRequest], ids: list[str], key_slots: int,
                     max_depth: int) -> str:
        """Queue the line's jobs that are not queued yet (a runner before this one may have queued
        some or all, and died before recording them); the model they run on, as their answers name it
        (a LoRA adapter's name for its jobs)."""
        async with self.redis.pipeline(transaction=False) as p:
            for job_id in ids:
                p.hmget(keys.job(job_id), ["model", "adapter"])
            models = await p.execute()
        todo = [k for k, m in enumerate(models) if m[0] is None]
        if todo:
            records = await self.admission.queue(rec.subject, rec.owner, [jobs[k] for k in todo],
                                                 [ids[k] for k in todo], limit=key_slots, max_depth=max_depth,
                                                 all_or_none=False)
            return records[0].served_name
        log.info("batch %s: adopting the jobs %s, queued by a runner before", rec.batch.id, ids)
        model, adapter = models[0]
        return str(json.loads(adapter)["name"] if adapter else json.loads(model))  # the name answers carry

    def _check_fits(self, ids: list[str]) -> None:
        """A line with more prompts than its key may have unfinished jobs would wait forever."""
        limit = self.settings.max_concurrent_jobs_per_key
        if limit and len(ids) > limit:
            raise RateLimited(f"this request needs {len(ids)} jobs and its key may have at most {limit} "
                              "unfinished (INFERQ_MAX_CONCURRENT_JOBS_PER_KEY)", code="too_many_jobs")

    async def _finish(self, rec: BatchRecord, nxt: int) -> None:
        """Write the output and error files and end the batch. Written files are recorded on the
        batch, so a step that is interrupted and run again does not write them twice."""
        b, bid = rec.batch, rec.batch.id
        b.finalizing_at = b.finalizing_at or int(time.time())
        if rec.ending is not None:  # the lines never queued, in chunks of one pipeline each
            rest = texts(await self.redis.lrange(keys.batch_part(bid, "lines"), nxt, -1))
            for start in range(0, len(rest), 500):
                async with self.redis.pipeline(transaction=False) as p:
                    for n, raw in enumerate(rest[start:start + 500]):
                        out = lines.unanswered(lines.custom_id_of(raw), f"batch_{rec.ending}", _MESSAGES[rec.ending])
                        k, a = self._answer_args(bid, nxt + start + n, out)
                        await self._scripts["answer"](keys=k, args=a, client=p)
                    if any(int(x) < 0 for x in await p.execute()):
                        raise LeaseLost(bid)
        elif b.status != "finalizing":
            b.status = "finalizing"
            await self._save(rec)
        results = text_map(await self.redis.hgetall(keys.batch_part(bid, "results")))
        output: list[str] = []
        errors: list[str] = []
        for _, raw in sorted((int(i), r) for i, r in results.items()):
            out = OutputLine.model_validate_json(raw)
            (output if out.response is not None and out.response.status_code == 200 else errors).append(raw)
        for part, name, attr in ((output, "output", "output_file_id"), (errors, "error", "error_file_id")):
            if part and getattr(b, attr) is None:
                f = await self.files.create(rec.owner, "batch_output", f"{bid}_{name}.jsonl",
                                            lines.jsonl(part), limited=False, ttl_s=rec.output_ttl_s)
                setattr(b, attr, f.id)
                await self._save(rec)
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
        parts = (keys.batch_part(bid, p) for p in ("lines", "running", "results"))
        await self._fenced("end", bid, keys.batch(bid), *parts, keys.BATCHES_ACTIVE, args=(rec.model_dump_json(), bid))
        self._held.discard(bid)
        log.info("batch %s: %s", bid, rec.batch.status)
