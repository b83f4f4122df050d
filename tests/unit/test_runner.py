"""JobRunner with a scripted engine (real Redis): event sequencing, usage, failure and cancel."""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass, field
from types import SimpleNamespace

import pytest

from bench.standin import Out, ScriptedTokenizer, Step
from inferq.shared.redis import make_redis
from inferq.shared.schemas import EngineStats, JobMessage, JobRecord, JobRequest, JobStatus
from inferq.shared.store import JobStore
from inferq.worker.jobs.runner import JobRunner
from inferq.worker.jobs.writer import EventWriter
from tests.wait import eventually_async


@dataclass
class ScriptedEngine:
    steps: list[Step]
    delay: float = 0.0  # per step: the engine's pace
    aborted: list[str] = field(default_factory=list)
    produced: int = 0  # steps handed out so far

    async def generate(self, prompt, params, request_id: str):
        try:
            for s in self.steps:
                await asyncio.sleep(self.delay)
                self.produced += 1
                yield s
        except (asyncio.CancelledError, GeneratorExit):
            self.aborted.append(request_id)
            raise


@dataclass
class ScriptedHost:
    engine: ScriptedEngine
    tokenizer: ScriptedTokenizer = field(default_factory=ScriptedTokenizer)
    max_model_len: int = 64
    stats: EngineStats = field(default_factory=EngineStats)
    vocab_size: int = 0
    tasks: list[str] = field(default_factory=lambda: ["generate"])


@pytest.fixture
async def rig(unit_redis):
    r = make_redis(unit_redis.url)
    store = JobStore(r, ttl_s=60)
    writer = EventWriter(store)
    writer.start()
    yield store, writer
    await writer.stop()
    await r.aclose()


async def queued(store: JobStore, **req) -> JobMessage:
    request = JobRequest(**req)
    rec = JobRecord(id=f"job-{uuid.uuid4().hex}", model="m", request=request)
    await store.create(rec)
    return JobMessage(id=rec.id, model="m", request=request, created_at=rec.created_at)


def script(n: int) -> list[Step]:
    steps = [Step([Out(0, f"t{i} ", [i])]) for i in range(n)]
    steps[-1].outputs[0].finish_reason = "length"
    steps[-1].finished = True
    return steps


async def test_events_are_numbered_and_the_end_is_recorded(rig) -> None:
    store, writer = rig
    engine = ScriptedEngine(script(5))
    runner = JobRunner(ScriptedHost(engine), store, writer, "w", default_max_tokens=8)
    msg = await queued(store, prompt="one two three", max_tokens=5)
    assert await runner.run(msg) is JobStatus.succeeded
    log = await store.read_log(msg.id)
    # while the writer is busy, deltas of one job share an event: fewer events, no gap in seq
    assert [e.seq for e in log] == list(range(1, len(log) + 1)) and len(log) <= 6
    assert "".join(e.text for e in log[:-1]) == "t0 t1 t2 t3 t4 "
    assert sum(e.n_tokens for e in log[:-1]) == 5
    assert log[-1].type == "done" and log[-1].usage.prompt_tokens == 3 and log[-1].usage.completion_tokens == 5
    rec = await store.get(msg.id)
    assert rec.status is JobStatus.succeeded and rec.choices[0].text == "t0 t1 t2 t3 t4 "
    assert rec.finish_reason == "length" and rec.first_token_at is not None and not runner.active


async def test_the_prompts_logprobs_come_once_in_an_event_of_their_own_then_the_echoed_text(rig) -> None:
    store, writer = rig
    lp = SimpleNamespace(logprob=-0.5, rank=1, decoded_token="b")
    steps = script(2)
    steps[0].prompt_logprobs = [None, {2: lp}]  # the engine's first output, at the end of prefill
    steps[1].prompt_logprobs = []  # DELTA outputs have them once
    runner = JobRunner(ScriptedHost(ScriptedEngine(steps), vocab_size=10), store, writer, "w", default_max_tokens=8)
    msg = await queued(store, prompt_token_ids=[1, 2], echo=True, prompt_logprobs=0, max_tokens=2)
    assert await runner.run(msg) is JobStatus.succeeded
    log = await store.read_log(msg.id)
    assert log[0].text == "" and log[0].prompt_logprobs[1]["2"].logprob == -0.5 and log[0].n_tokens == 0
    assert all(e.prompt_logprobs is None for e in log[1:-1])
    assert "".join(e.text for e in log[1:-1]) == "?t0 t1 "  # the ids decoded ("?"), then the output
    assert log[-1].usage.prompt_tokens == 2 and log[-1].usage.completion_tokens == 2


async def test_context_overflow_fails_the_job_without_touching_the_engine(rig) -> None:
    store, writer = rig
    engine = ScriptedEngine(script(3))
    runner = JobRunner(ScriptedHost(engine), store, writer, "w", default_max_tokens=8)
    msg = await queued(store, prompt="w " * 60, max_tokens=10)
    assert await runner.run(msg) is JobStatus.failed
    rec = await store.get(msg.id)
    assert (rec.error.type, rec.error.code, rec.error.param) == (
        "invalid_request_error", "context_length_exceeded", "max_tokens")
    assert "64" in rec.error.message
    assert (await store.read_log(msg.id))[-1].type == "error"


async def test_engine_error_ends_the_job_failed(rig) -> None:
    store, writer = rig

    class Broken(ScriptedEngine):
        async def generate(self, prompt, params, request_id):
            yield Step([Out(0, "a", [1])])
            raise RuntimeError("device lost")

    runner = JobRunner(ScriptedHost(Broken([])), store, writer, "w", default_max_tokens=8)
    msg = await queued(store, prompt="x", max_tokens=4)
    assert await runner.run(msg) is JobStatus.failed
    log = await store.read_log(msg.id)
    assert [e.type for e in log] == ["token", "error"] and "device lost" in log[-1].error.message
    assert (log[-1].error.type, log[-1].error.code) == ("server_error", "engine_error")


async def test_cancel_aborts_the_engine_request(rig) -> None:
    store, writer = rig
    engine = ScriptedEngine(script(1000), delay=0.01)
    runner = JobRunner(ScriptedHost(engine, max_model_len=4096), store, writer, "w", default_max_tokens=8)
    msg = await queued(store, prompt="x", max_tokens=1000)
    task = asyncio.create_task(runner.run(msg))

    async def generating() -> bool:  # tokens out, and the first one noted on the record
        return engine.produced >= 3 and bool((await store.get(msg.id)).first_token_at)

    await eventually_async(generating, 10, "the job to start generating", interval=0.01)
    assert runner.cancel(msg.id)
    assert await task is JobStatus.cancelled
    assert engine.aborted == [msg.id]
    rec = await store.get(msg.id)
    assert rec.status is JobStatus.cancelled and 0 < rec.usage.completion_tokens < 1000
    done = (await store.read_log(msg.id))[-1]
    assert done.type == "done" and done.status is JobStatus.cancelled


async def test_a_job_cancelled_while_queued_is_skipped(rig) -> None:
    store, writer = rig
    engine = ScriptedEngine(script(3))
    runner = JobRunner(ScriptedHost(engine), store, writer, "w", default_max_tokens=8)
    msg = await queued(store, prompt="x")
    await store.request_cancel(msg.id)
    assert await runner.run(msg) is None
    assert (await store.get(msg.id)).started_at is None and engine.aborted == []


async def test_a_job_past_its_deadline_fails_as_a_timeout(rig) -> None:
    store, writer = rig
    engine = ScriptedEngine(script(3))
    runner = JobRunner(ScriptedHost(engine), store, writer, "w", default_max_tokens=8)
    msg = await queued(store, prompt="x")
    msg.deadline = msg.created_at - 1
    assert await runner.run(msg) is JobStatus.failed
    error = (await store.get(msg.id)).error
    assert (error.type, error.code) == ("timeout_error", "deadline_exceeded") and "never started" in error.message
    assert (await store.read_log(msg.id))[-1].error == error
