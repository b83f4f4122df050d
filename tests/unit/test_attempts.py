"""Ownership by (job, attempt), against a real Redis and a scripted engine: a fenced attempt never
disturbs a later one, one worker never runs two attempts of a job at once, a job is never left
`running` with nobody running it, and a log never has a hole."""

from __future__ import annotations

import asyncio
import os
import signal
import uuid
from contextlib import aclosing
from dataclasses import dataclass, field

import pytest
from redis.exceptions import ConnectionError

from bench.stack import Proc, free_port
from inferq.shared import keys
from inferq.shared.redis import make_redis
from inferq.shared.schemas import (
    DoneEvent,
    ErrorEvent,
    ErrorInfo,
    JobMessage,
    JobRecord,
    JobRequest,
    JobStatus,
    TokenEvent,
)
from inferq.shared.store import JobStore
from inferq.worker.jobs.runner import JobRunner
from inferq.worker.jobs.writer import EventWriter
from tests.unit.test_runner import ScriptedEngine, ScriptedHost, script
from tests.wait import eventually_async


@dataclass
class TrackingEngine(ScriptedEngine):
    """Records which generations run at the same time. An abort takes ``abort_s`` (vLLM's abort
    awaits the engine core)."""

    abort_s: float = 0.0
    live: dict[str, int] = field(default_factory=dict)  # request id -> generations running with it
    started: list[str] = field(default_factory=list)
    overlaps: list[str] = field(default_factory=list)  # job ids with two generations at once

    async def generate(self, prompt, params, request_id: str):
        job = request_id.split("#")[0]
        if any(rid.split("#")[0] == job and n for rid, n in self.live.items()):
            self.overlaps.append(job)
        self.started.append(request_id)
        self.live[request_id] = self.live.get(request_id, 0) + 1
        try:
            async with aclosing(super().generate(prompt, params, request_id)) as steps:
                async for step in steps:
                    yield step
        finally:
            if request_id in self.aborted:
                await asyncio.sleep(self.abort_s)
            self.live[request_id] -= 1


@pytest.fixture
async def store(unit_redis):
    r = make_redis(unit_redis.url)
    yield JobStore(r, ttl_s=60)
    await r.aclose()


@pytest.fixture
async def writers():
    started: list[EventWriter] = []

    def make(store: JobStore, **kw) -> EventWriter:
        w = EventWriter(store, **kw)
        w.start()
        started.append(w)
        return w

    yield make
    for w in started:
        await w.stop()


@pytest.fixture
async def spawn():
    """Start a task that the test ends for sure, however it fails."""
    tasks: list[asyncio.Task] = []

    def start(coro) -> asyncio.Task:
        tasks.append(asyncio.create_task(coro))
        return tasks[-1]

    yield start
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


async def queued(store: JobStore, **req) -> JobMessage:
    request = JobRequest(**req)
    rec = JobRecord(id=f"job-{uuid.uuid4().hex}", model="m", request=request)
    await store.create(rec)
    return JobMessage(id=rec.id, model="m", request=request, created_at=rec.created_at)


async def logged(store: JobStore, job_id: str, n: int) -> None:
    """Until the job's log holds ``n`` events or more (its attempt is generating)."""
    await eventually_async(lambda: _logged(store, job_id, n), 60, f"{n} events in the log of {job_id}", interval=0.005)


def replay(log) -> dict[int, str]:
    """What a client reading the log from the start ends up with (a restart discards the text)."""
    texts: dict[int, str] = {}
    for ev in log:
        if ev.type == "token":
            texts[ev.index] = texts.get(ev.index, "") + ev.text
        elif ev.type == "restart":
            texts = {}
    return texts


async def assert_whole(store: JobStore, job_id: str, n: int) -> None:
    """The job succeeded, its log has no hole and replays to exactly the record's text."""
    rec, log = await store.get(job_id), await store.read_log(job_id)
    assert rec.status is JobStatus.succeeded, (rec.status, rec.error)
    assert [e.seq for e in log] == list(range(1, len(log) + 1))
    assert log[-1].type == "done"
    expected = "".join(f"t{i} " for i in range(n))
    assert rec.choices[0].text == expected and replay(log) == {0: expected}


def slow_results(store: JobStore, seconds: float) -> None:
    """Each pipeline is executed at once but its answer comes back ``seconds`` later."""
    real = store.append

    async def append(items):
        res = await real(items)
        await asyncio.sleep(seconds)
        return res

    store.append = append  # type: ignore[method-assign]


async def test_a_fenced_attempts_late_results_do_not_stop_the_next_attempt(store, writers, spawn) -> None:
    writer = writers(store)
    slow_results(store, 0.05)  # a batch of attempt 1 is still in flight when attempt 2 starts
    engine = TrackingEngine(script(200), delay=0.005)
    runner = JobRunner(ScriptedHost(engine, max_model_len=4096), store, writer, "w", default_max_tokens=8)
    msg = await queued(store, prompt="x", max_tokens=200)
    first = spawn(runner.run(msg))
    await logged(store, msg.id, 2)
    # the job is taken from attempt 1 behind the runner's back (a reaper's mistake) ...
    assert await store.requeue(msg.id, "w", 1, "worker_lost", max_attempts=3) == "requeued"
    assert await first is None  # ... which learns it from its next batch and stops, writing no end
    # the new message of the job comes back to the same worker: attempt 2 must run to its end
    assert await runner.run(msg) is JobStatus.succeeded
    await assert_whole(store, msg.id, 200)
    rec = await store.get(msg.id)
    assert rec.attempt == 2 and not runner.active and not writer.failed
    assert not await store.redis.sismember(keys.worker_jobs("w"), msg.id)


async def test_a_second_message_of_a_running_job_never_runs_beside_it(store, writers, caplog, spawn) -> None:
    writer = writers(store)
    slow_results(store, 0.2)  # attempt 1 cannot learn from its writes that it lost the job: it is stopped
    engine = TrackingEngine(script(200), delay=0.005, abort_s=0.1)
    runner = JobRunner(ScriptedHost(engine, max_model_len=4096), store, writer, "w", default_max_tokens=8)
    msg = await queued(store, prompt="x", max_tokens=200)
    first = spawn(runner.run(msg))
    await logged(store, msg.id, 2)
    # the job is requeued by mistake and its new message reaches this worker while it still runs it
    assert await store.requeue(msg.id, "w", 1, "worker_lost", max_attempts=3) == "requeued"
    second = spawn(runner.run(msg))
    assert await second is JobStatus.succeeded
    assert await first is None
    assert "attempt 2 replaces attempt 1" in caplog.text
    assert engine.overlaps == [] and len(engine.started) == 2
    assert all(n == 0 for n in engine.live.values())
    assert engine.aborted == [engine.started[0]]  # attempt 1's engine request was aborted
    await assert_whole(store, msg.id, 200)
    assert not runner.active


async def test_duplicate_delivery_of_a_running_job_is_skipped(store, writers, spawn) -> None:
    writer = writers(store)
    engine = TrackingEngine(script(50), delay=0.005)
    runner = JobRunner(ScriptedHost(engine, max_model_len=4096), store, writer, "w", default_max_tokens=8)
    msg = await queued(store, prompt="x", max_tokens=50)
    first = spawn(runner.run(msg))
    await logged(store, msg.id, 1)
    assert await runner.run(msg) is None  # the claim refuses it: attempt 1 goes on undisturbed
    assert await first is JobStatus.succeeded
    assert engine.overlaps == [] and len(engine.started) == 1
    await assert_whole(store, msg.id, 50)


async def test_a_cancel_reaches_the_attempt_this_worker_runs(store, writers, spawn) -> None:
    writer = writers(store)
    engine = TrackingEngine(script(1000), delay=0.005)
    runner = JobRunner(ScriptedHost(engine, max_model_len=4096), store, writer, "w", default_max_tokens=8)
    msg = await queued(store, prompt="x", max_tokens=1000)
    first = spawn(runner.run(msg))
    await logged(store, msg.id, 2)
    await store.requeue(msg.id, "w", 1, "worker_lost", max_attempts=3)
    second = spawn(runner.run(msg))
    await eventually_async(lambda: _attempt_logged(store, msg.id, 2), 60, "a token of attempt 2 logged", interval=0.005)
    assert runner.cancel(msg.id)
    assert await second is JobStatus.cancelled and await first is None
    rec = await store.get(msg.id)
    assert rec.status is JobStatus.cancelled and rec.attempt == 2
    assert engine.overlaps == [] and all(n == 0 for n in engine.live.values())


async def test_a_cancel_while_the_claim_is_on_its_way_ends_the_job_cancelled(store, writers, spawn) -> None:
    """The claim has taken the job in Redis but its answer has not come back: a cancel then must
    not leave the job running with nobody running it."""
    writer = writers(store)
    real = store.claim

    async def claim(job_id, worker_id, token="", queue_list=None, room=None):
        res = await real(job_id, worker_id, token, queue_list, room)
        await asyncio.sleep(0.2)
        return res

    store.claim = claim  # type: ignore[method-assign]
    engine = TrackingEngine(script(100), delay=0.005)
    runner = JobRunner(ScriptedHost(engine, max_model_len=4096), store, writer, "w", default_max_tokens=8)
    msg = await queued(store, prompt="x", max_tokens=100)
    task = spawn(runner.run(msg))
    await eventually_async(lambda: _status(store, msg.id, JobStatus.running), 60, "the claim taken in Redis",
                           interval=0.005)
    await store.request_cancel(msg.id)
    assert runner.cancel(msg.id)
    assert await task is JobStatus.cancelled
    rec = await store.get(msg.id)
    assert rec.status is JobStatus.cancelled and engine.started == []
    assert (await store.read_log(msg.id))[-1].type == "done"


async def test_an_attempt_told_it_lost_the_job_that_still_owns_it_ends_it(store, writers) -> None:
    """A write wrongly answered 'fenced': the record still says running under this worker and
    attempt, and nobody else will ever end it. The runner must end it, not leave it running."""
    writer = writers(store)
    real, lied = store.append, []

    async def append(items):
        if not lied:
            lied.append(items)
            return [False] * len(items)
        return await real(items)

    store.append = append  # type: ignore[method-assign]
    engine = TrackingEngine(script(100), delay=0.005)
    runner = JobRunner(ScriptedHost(engine, max_model_len=4096), store, writer, "w", default_max_tokens=8)
    msg = await queued(store, prompt="x", max_tokens=100)
    await runner.run(msg)
    rec = await store.get(msg.id)
    assert rec.status is JobStatus.failed and rec.error is not None and rec.attempt == 1
    log = await store.read_log(msg.id)
    assert log[-1].type == "error" and [e.seq for e in log] == list(range(1, len(log) + 1))
    assert not await store.redis.sismember(keys.worker_jobs("w"), msg.id)
    assert not runner.active and engine.aborted  # its engine request was stopped


async def test_an_event_lost_on_the_way_can_never_end_the_job_succeeded(store, writers) -> None:
    """The end check: a token event reported written that is not in the log (one token, one
    event, dropped) makes the end refuse `succeeded`."""
    writer = writers(store)
    real = store.append

    async def append(items):
        kept = [it for it in items if not (it[2].type == "token" and it[2].seq == 1)]
        res = iter(await real(kept) if kept else [])
        return [True if it not in kept else next(res) for it in items]

    store.append = append  # type: ignore[method-assign]
    runner = JobRunner(ScriptedHost(TrackingEngine(script(1))), store, writer, "w", default_max_tokens=8)
    msg = await queued(store, prompt="x", max_tokens=1)
    assert await runner.run(msg) is not JobStatus.succeeded
    rec, log = await store.get(msg.id), await store.read_log(msg.id)
    assert rec.status is JobStatus.failed and rec.error.code == "log_incomplete"
    assert [(e.seq, e.type) for e in log] == [(1, "error")]


async def test_a_hole_in_the_middle_stops_the_attempt_and_hands_the_job_back(store, writers) -> None:
    writer = writers(store)
    real, calls = store.append, []

    async def append(items):  # the second batch's first event never reaches the log
        calls.append(items)
        if len(calls) == 2:
            res = await real(items[1:])
            return [True, *res]
        return await real(items)

    store.append = append  # type: ignore[method-assign]
    engine = TrackingEngine(script(100), delay=0.005)
    runner = JobRunner(ScriptedHost(engine, max_model_len=4096), store, writer, "w", default_max_tokens=8)
    msg = await queued(store, prompt="x", max_tokens=100)
    assert await runner.run(msg) is None
    rec, log = await store.get(msg.id), await store.read_log(msg.id)
    assert rec.status is JobStatus.queued and engine.aborted
    assert [e.seq for e in log] == list(range(1, len(log) + 1))
    assert log[-1].type == "restart" and log[-1].reason == "event_write_failed"


async def test_events_that_cannot_be_written_in_time_hand_the_job_back(store, writers, spawn) -> None:
    writer = writers(store, budget_s=0.2)
    real, down = store.append, [False]

    async def append(items):
        if down[0]:
            raise ConnectionError("Redis is away")
        return await real(items)

    store.append = append  # type: ignore[method-assign]
    engine = TrackingEngine(script(200), delay=0.005)
    handed: list[tuple[str, int, str]] = []

    async def hand_back(job_id: str, attempt: int, reason: str, resume=None) -> str:
        handed.append((job_id, attempt, reason))
        return await store.requeue(job_id, "w", attempt, reason, max_attempts=3)

    runner = JobRunner(ScriptedHost(engine, max_model_len=4096), store, writer, "w", default_max_tokens=8,
                       hand_back=hand_back)
    msg = await queued(store, prompt="x", max_tokens=200)
    first = spawn(runner.run(msg))
    await logged(store, msg.id, 2)
    down[0] = True
    assert await first is None
    down[0] = False
    assert handed == [(msg.id, 1, "event_write_failed")] and engine.aborted == [engine.started[0]]
    rec, log = await store.get(msg.id), await store.read_log(msg.id)
    assert rec.status is JobStatus.queued
    assert [e.seq for e in log] == list(range(1, len(log) + 1)) and log[-1].type == "restart"
    # the next attempt starts over after the restart event and replays whole
    assert await runner.run(msg) is JobStatus.succeeded
    await assert_whole(store, msg.id, 200)


async def test_redis_stopped_past_the_budget_never_ends_a_job_with_a_hole(tmp_path, writers, spawn) -> None:
    port = free_port()
    server = Proc("redis-budget", ["redis-server", "--port", str(port), "--save", "", "--appendonly", "no"],
                  {}, tmp_path / "redis.log")
    r = make_redis(f"redis://127.0.0.1:{port}/0")
    try:
        await eventually_async(lambda: _pings(r), 60, "redis-server", interval=0.005)
        store = JobStore(r, ttl_s=60)
        writer = writers(store, budget_s=0.3)
        engine = TrackingEngine(script(300), delay=0.005)
        runner = JobRunner(ScriptedHost(engine, max_model_len=4096), store, writer, "w", default_max_tokens=8)
        msg = await queued(store, prompt="x", max_tokens=300)
        tries: list[bool] = []  # each try to hand the job back: had the attempt's run ended by then?
        real_requeue = store.requeue

        async def requeue(*args, **kwargs):
            tries.append(first.done())
            return await real_requeue(*args, **kwargs)

        store.requeue = requeue  # type: ignore[method-assign]
        first = spawn(runner.run(msg))
        await logged(store, msg.id, 2)
        os.kill(server.proc.pid, signal.SIGSTOP)
        try:
            await eventually_async(lambda: engine.aborted, 60, "the attempt to stop: its writes ran out of time",
                                   interval=0.005)
            # Not stranded: the run does not end on a Redis that does not answer, it keeps trying
            # to hand the job back. A second try can only come once the first has gone unanswered
            # for the writer's budget, so Redis was away all along: the run was still going at
            # both tries, and is now (an observed event, not a window of time in which to see it end).
            await eventually_async(lambda: len(tries) >= 2, 60, "a second try to hand the job back", interval=0.005)
            assert tries[:2] == [False, False] and not first.done()
        finally:
            os.kill(server.proc.pid, signal.SIGCONT)
        assert await asyncio.wait_for(first, 10) is None
        rec, log = await store.get(msg.id), await store.read_log(msg.id)
        assert rec.status is JobStatus.queued
        assert [e.seq for e in log] == list(range(1, len(log) + 1))
        assert log[-1].type == "restart" and log[-1].reason == "event_write_failed"
        assert await runner.run(msg) is JobStatus.succeeded
        await assert_whole(store, msg.id, 300)
    finally:
        await r.aclose()
        server.stop()


async def test_the_end_must_follow_the_last_logged_event(store) -> None:
    job = (await queued(store, prompt="x")).id
    await store.claim(job, "w")
    res = await store.append([(job, 1, TokenEvent(seq=1, text="a")), (job, 1, TokenEvent(seq=3, text="c"))])
    assert res[0] is True and isinstance(res[1], Exception)
    assert [e.seq for e in await store.read_log(job)] == [1]  # an event after a hole is refused
    done = DoneEvent(seq=3, finish_reason="stop")  # the attempt believes it wrote 2 events
    assert await store.finish(job, "w", 1, done, status=JobStatus.succeeded) is JobStatus.failed
    rec, log = await store.get(job), await store.read_log(job)
    assert rec.status is JobStatus.failed and rec.error.code == "log_incomplete"
    assert [(e.seq, e.type) for e in log] == [(1, "token"), (2, "error")]
    assert not await store.redis.sismember(keys.worker_jobs("w"), job)
    # a complete log ends as asked
    job = (await queued(store, prompt="x")).id
    await store.claim(job, "w")
    await store.append([(job, 1, TokenEvent(seq=1, text="a"))])
    done = DoneEvent(seq=2)
    assert await store.finish(job, "w", 1, done, status=JobStatus.succeeded) is JobStatus.succeeded
    # a failure's end goes right after whatever the log holds
    job = (await queued(store, prompt="x")).id
    await store.claim(job, "w")
    await store.append([(job, 1, TokenEvent(seq=1, text="a"))])
    err = ErrorEvent(seq=7, error=ErrorInfo(type="engine_error", message='boom "seq":4'))
    assert await store.finish(job, "w", 1, err, check_log=False, status=JobStatus.failed,
                              error=err.error) is JobStatus.failed
    log = await store.read_log(job)
    assert [(e.seq, e.type) for e in log] == [(1, "token"), (2, "error")]
    assert log[-1].error == err.error and (await store.get(job)).error == err.error


async def _logged(store: JobStore, job_id: str, n: int) -> bool:
    log = await store.read_log(job_id)
    return bool(log) and log[-1].seq >= n


async def _attempt_logged(store: JobStore, job_id: str, attempt: int) -> bool:
    rec = await store.get(job_id)
    log = await store.read_log(job_id)
    return rec.attempt == attempt and bool(log) and log[-1].type == "token"


async def _status(store: JobStore, job_id: str, status: JobStatus) -> bool:
    rec = await store.get(job_id)
    return rec is not None and rec.status is status


async def _pings(r) -> bool:
    try:
        return bool(await r.ping())
    except Exception:
        return False
