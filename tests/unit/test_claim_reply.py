"""A claim whose answer is lost, or never comes, still runs the job (real Redis, scripted engine).

The claim script runs in Redis (queued -> running, attempt N) whatever becomes of its reply. The
runner sends a random token with it and repeats the claim with the same token until Redis answers
(each try bounded by the writer's budget): the script gives a repeat of a claim that already took
the job the first call's answer, so the job runs here instead of staying ``running`` with nobody
on it."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from redis.asyncio import Redis
from redis.exceptions import ConnectionError

from inferq.shared.redis import make_redis
from inferq.shared.schemas import JobStatus
from inferq.shared.store import JobStore
from inferq.worker.jobs.runner import JobRunner
from inferq.worker.jobs.writer import EventWriter
from tests.unit.test_runner import ScriptedEngine, ScriptedHost, queued, script

BUDGET_S = 0.5  # the writer's budget: how long one try of the claim may wait for its answer


def lose_replies(client: Redis, sha: str, lost: int, hang: bool = False) -> list[Any]:
    """Make ``client`` run the script ``sha`` in Redis and then lose the answer of its first ``lost``
    calls: raise ConnectionError (a dropped connection) or, with ``hang``, never answer (a peer gone
    silent). Returns the answers Redis gave, as they come."""
    real: Callable[..., Awaitable[Any]] = client.evalsha
    answers: list[Any] = []

    async def evalsha(script_sha: str, numkeys: int, *args: Any) -> Any:
        res = await real(script_sha, numkeys, *args)
        if script_sha != sha:
            return res
        answers.append(res)
        if len(answers) <= lost:
            if hang:
                await asyncio.Event().wait()
            raise ConnectionError("connection lost before the reply")
        return res

    client.evalsha = evalsha  # type: ignore[method-assign]
    return answers


@pytest.fixture
async def rig(unit_redis):
    r = make_redis(unit_redis.url)
    store = JobStore(r, ttl_s=60)
    writer = EventWriter(store, budget_s=BUDGET_S)
    writer.start()
    yield store, writer
    await writer.stop()
    await r.aclose()


async def run_to_end(store: JobStore, writer: EventWriter) -> tuple[JobStatus | None, str]:
    runner = JobRunner(ScriptedHost(ScriptedEngine(script(3))), store, writer, "w", default_max_tokens=8)
    msg = await queued(store, prompt="one two", max_tokens=3)
    task = asyncio.create_task(runner.run(msg))
    try:
        await asyncio.wait_for(asyncio.shield(task), 30)
    finally:
        task.cancel()
    return task.result(), msg.id


@pytest.mark.parametrize("hang", [False, True], ids=["reply-lost", "reply-never-comes"])
async def test_a_claim_whose_reply_is_lost_still_runs_the_job(rig, hang: bool) -> None:
    store, writer = rig
    answers = lose_replies(store.redis, store._claim.sha, lost=2 if not hang else 1, hang=hang)
    status, job_id = await run_to_end(store, writer)
    assert status is JobStatus.succeeded
    rec = await store.get(job_id)
    assert rec.status is JobStatus.succeeded and rec.attempt == 1 and rec.choices[0].text == "t0 t1 t2 "
    # the first call took the job; each repeat, with the same token, was given the first call's answer
    assert len(answers) >= 2 and all(a == answers[0] for a in answers)
    assert [e.type for e in await store.read_log(job_id)][-1] == "done"


async def test_a_claim_with_another_token_is_still_refused(rig) -> None:
    """The token makes only the repeat of the same claim succeed: any other claim of a running
    job (a redelivered message, another worker) is skipped as before."""
    store, _ = rig
    msg = await queued(store, prompt="p")
    first = await store.claim(msg.id, "w", "t1")
    assert first.previous is JobStatus.queued and first.attempt == 1
    again = await store.claim(msg.id, "w", "t1")
    assert (again.previous, again.attempt) == (JobStatus.queued, 1)
    assert (await store.claim(msg.id, "w", "t2")).previous is JobStatus.running
    assert (await store.claim(msg.id, "other", "")).previous is JobStatus.running
