"""A job paused to make room (worker/jobs/resume.py), against a real Redis and a scripted engine
that continues a prompt where its kept tokens end: its stream goes on with no restart and no token
twice, its next attempt's prompt is the first's plus the kept tokens and its budget shrinks by
them; a job a continuation would change is not paused; a requeue that starts over drops the kept
progress; a client's cancel beats a pause."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import pytest

from inferq.shared import keys
from inferq.shared.schemas import JobMessage, JobRequest, JobStatus, Resume, TokenEvent
from inferq.worker.jobs.resume import resumable
from inferq.worker.jobs.runner import JobRunner
from tests.unit.test_attempts import assert_whole, logged, queued, replay, spawn, store, writers  # noqa: F401
from tests.unit.test_runner import ScriptedEngine, ScriptedHost, script

N = 60


@dataclass
class ContinuingEngine(ScriptedEngine):
    """Step ``i`` yields token ``i``; a prompt longer than the first call's by k tokens starts at step k
    (a continuation). ``calls``: each generation's prompt ids and max_tokens."""

    calls: list[tuple[list[int], int]] = field(default_factory=list)

    async def generate(self, prompt, params, request_id: str, **_):
        ids = list(prompt["prompt_token_ids"])
        self.calls.append((ids, params.max_tokens))
        offset = len(ids) - len(self.calls[0][0])
        try:
            for s in self.steps[offset:]:
                await asyncio.sleep(self.delay)
                yield s
        except (asyncio.CancelledError, GeneratorExit):
            self.aborted.append(request_id)
            raise


@dataclass
class Rig:
    engine: ContinuingEngine
    runner: JobRunner
    msg: JobMessage
    first: asyncio.Task | None = None  # the first attempt's run


@pytest.fixture
def rig(store, writers, spawn):  # noqa: F811
    """Make a job of N tokens on a continuing engine; with ``events``, its first attempt runs until
    its log holds that many events."""

    async def make(events: int = 0, **req) -> Rig:
        engine = ContinuingEngine(script(N), delay=0.005)
        runner = JobRunner(ScriptedHost(engine, max_model_len=4096), store, writers(store), "w",
                           default_max_tokens=8)
        msg = await queued(store, **{"prompt": "x", "max_tokens": N, **req})
        r = Rig(engine, runner, msg)
        if events:
            r.first = spawn(runner.run(msg))
            await logged(store, msg.id, events)
        return r

    return make


async def paused(r: Rig) -> None:
    """Pause the first attempt; return once its run has handed the job back."""
    assert r.runner.attempts.pause(r.msg.id, 1) is not None
    assert r.first is not None and await r.first is None


async def test_a_paused_job_continues_where_it_stopped_with_no_restart(store, rig) -> None:  # noqa: F811
    r = await rig(5, prompt="x y z")
    engine, runner, msg = r.engine, r.runner, r.msg
    await paused(r)
    rec = await store.get(msg.id)
    raw = await store.redis.hget(keys.job(msg.id), "resume")
    kept = Resume.model_validate_json(raw)
    log = await store.read_log(msg.id)
    assert rec.status is JobStatus.queued and not [e for e in log if e.type == "restart"]
    k = len(kept.ids)
    assert k >= 5 and kept.ids == list(range(k)), "the kept tokens are those the stream carried"
    assert kept.text == replay(log)[0] == "".join(f"t{i} " for i in range(k))
    first_token_at = rec.first_token_at

    assert await runner.run(msg) is JobStatus.succeeded
    (prompt, budget), (again, left) = engine.calls
    assert again == [*prompt, *range(k)] and (budget, left) == (N, N - k)
    await assert_whole(store, msg.id, N)  # no hole, no restart, each token once: the whole text
    rec, log = await store.get(msg.id), await store.read_log(msg.id)
    assert log[-1].usage.completion_tokens == N and log[-1].usage.prompt_tokens == len(prompt)
    assert rec.first_token_at == first_token_at, "the first token is the first attempt's"
    assert rec.attempt == 2 and await store.redis.hget(keys.job(msg.id), "preemptions") == "1"


async def test_a_job_paused_on_its_last_token_ends_with_its_length(store, rig) -> None:  # noqa: F811
    r = await rig()
    engine, runner, msg = r.engine, r.runner, r.msg
    await store.claim(msg.id, "w")  # as if attempt 1 had run every token and was paused before its end
    kept = Resume(ids=list(range(N)), text="".join(f"t{i} " for i in range(N)))
    for i in range(N):
        await store.append([(msg.id, 1, TokenEvent(seq=i + 1, text=f"t{i} ", n_tokens=1), None)])
    assert await store.requeue(msg.id, "w", 1, "preempted", 3, resume=kept) == "requeued"
    assert await runner.run(msg) is JobStatus.succeeded and len(engine.calls) == 0
    await assert_whole(store, msg.id, N)
    assert (await store.get(msg.id)).finish_reason == "length"


@pytest.mark.parametrize("extra", [{"seed": 1}, {"stop": ["t9"]}, {"n": 2}, {"frequency_penalty": 0.5},
                                   {"regex": "t.*"}, {"echo": True}])
async def test_a_job_a_continuation_would_change_is_not_paused(rig, extra) -> None:
    r = await rig(3, **extra)
    assert r.runner.attempts.pause(r.msg.id, 1) is None  # the caller hands it back to start over instead
    r.runner.cancel(r.msg.id)
    assert await r.first is JobStatus.cancelled


def test_what_may_be_paused() -> None:
    plain = JobRequest(prompt="x", max_tokens=4)
    assert resumable(plain, parses_tools=False) and not resumable(plain, parses_tools=True)
    assert resumable(JobRequest(prompt="x", logprobs=2, temperature=0.7, logit_bias={3: 1.0}), False)
    assert resumable(JobRequest(prompt="x", repetition_penalty=1.2), False), "it counts the prompt too"
    assert not resumable(JobRequest(prompt="x", presence_penalty=0.1), False)
    assert not resumable(JobRequest(prompt="x", prompt_logprobs=1), False)
    assert not resumable(JobRequest(prompt="x", json_object=True), False)


async def test_a_requeue_that_starts_over_drops_the_kept_progress(store, rig) -> None:  # noqa: F811
    r = await rig(5)
    engine, runner, msg = r.engine, r.runner, r.msg
    await paused(r)
    assert await store.redis.hexists(keys.job(msg.id), "resume")
    claim = await store.claim(msg.id, "w2")  # attempt 2 continues it: its claim carries the progress
    assert claim is not None and claim.resume is not None and claim.attempt == 2
    # ... and its worker dies: the reaper's requeue starts the job over
    assert await store.requeue(msg.id, "w2", 2, "worker_lost", 3) == "requeued"
    assert not await store.redis.hexists(keys.job(msg.id), "resume")
    assert [e.type for e in await store.read_log(msg.id)][-1] == "restart"
    assert await runner.run(msg) is JobStatus.succeeded
    assert engine.calls[-1] == (engine.calls[0][0], N), "attempt 3 starts over"
    await assert_whole(store, msg.id, N)


async def test_a_cancel_beats_a_pause(store, rig) -> None:  # noqa: F811
    r = await rig(3)
    r.runner.attempts.pause(r.msg.id, 1)
    r.runner.cancel(r.msg.id)
    assert await r.first is JobStatus.cancelled
    assert (await store.get(r.msg.id)).status is JobStatus.cancelled


async def test_a_paused_job_cancelled_while_queued_keeps_the_text_its_stream_carried(store, rig) -> None:  # noqa: F811
    r = await rig(5)
    await paused(r)
    assert await store.request_cancel(r.msg.id) is JobStatus.queued
    rec, log = await store.get(r.msg.id), await store.read_log(r.msg.id)
    assert rec.status is JobStatus.cancelled and log[-1].type == "done"
    assert rec.choices is not None and rec.choices[0].text == replay(log)[0] != ""
