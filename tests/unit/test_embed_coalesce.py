"""The gateway's shared embedding jobs (api/embed_coalesce.py), with a stand-in admission and a stand-in
job: which requests share a job and when it goes, what each request gets back of it, and what happens
when the shared job fails or is refused."""

from __future__ import annotations

import asyncio

import pytest
from prometheus_client import REGISTRY

from inferq.api.auth import Principal
from inferq.api.embed_coalesce import EmbedCoalescer
from inferq.api.openai.embeddings import Vectors
from inferq.shared.errors import InvalidRequest, RateLimited
from inferq.shared.pooling import EmbedInputs
from inferq.shared.schemas import JobRecord, JobRequest

ALICE = Principal(key_id="k-alice", name="alice", ip="10.0.0.1")
BOB = Principal(key_id="k-bob", name="bob", ip="10.0.0.2")


def job(*texts: str, dimensions: int | None = None) -> JobRequest:
    return JobRequest(embed=EmbedInputs(texts=list(texts), dimensions=dimensions), model="emb")


class Admitted:
    def __init__(self, rec: JobRecord) -> None:
        self.records = [rec]


class StandIn:
    """Admission and the worker: each job's inputs are recorded; a job's answer waits until released.
    An input's vector is its text; its tokens, its length. ``"bad"`` fails the job it is in."""

    def __init__(self, refuse: Exception | None = None) -> None:
        self.jobs: dict[str, list[str]] = {}
        self.owners: dict[str, Principal] = {}
        self.gates: dict[str, asyncio.Event] = {}
        self.refuse = refuse
        self.rated: list[bool] = []
        self.tokens_per_input = True

    async def submit(self, caller: Principal, reqs: list[JobRequest], *, count_rate: bool = True) -> Admitted:
        self.rated.append(count_rate)
        if self.refuse is not None:
            raise self.refuse
        job_id = f"job-{len(self.jobs)}"
        assert reqs[0].embed is not None
        self.jobs[job_id] = list(reqs[0].embed.texts or ())
        self.owners[job_id] = caller
        self.gates[job_id] = asyncio.Event()
        return Admitted(JobRecord(id=job_id, model="emb", request=reqs[0]))

    async def collect(self, job_id: str) -> Vectors:
        await self.gates[job_id].wait()
        texts = self.jobs[job_id]
        if "bad" in texts:
            raise InvalidRequest(f"input {texts.index('bad')} has too many tokens", param="input")
        tokens = [len(t) for t in texts]
        return Vectors(packed=texts, prompt_tokens=sum(tokens), tokens=tokens if self.tokens_per_input else None)

    def release(self, job_id: str | None = None) -> None:
        for k, gate in self.gates.items():
            if job_id is None or k == job_id:
                gate.set()


def coalescer(stand: StandIn, inflight: int = 1, max_inputs: int = 64) -> EmbedCoalescer:
    return EmbedCoalescer(stand, stand.collect, inflight, max_inputs)  # type: ignore[arg-type]


def shared(kind: str) -> float:
    return REGISTRY.get_sample_value("inferq_embed_shared_total", {"kind": kind}) or 0.0


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def test_an_idle_key_sends_at_once_and_requests_behind_a_busy_one_share_the_next_job() -> None:
    s = StandIn()
    c = coalescer(s, inflight=1)
    before = {k: shared(k) for k in ("jobs", "requests")}
    first = asyncio.create_task(c.embed(ALICE, job("a")))
    await settle()
    assert s.jobs == {"job-0": ["a"]}  # nothing in flight: no wait
    rest = [asyncio.create_task(c.embed(ALICE, job(t))) for t in ("bb", "ccc")]
    rest.append(asyncio.create_task(c.embed(ALICE, job("dddd", "e"))))
    await settle()
    assert list(s.jobs) == ["job-0"]  # they wait for the one in flight
    s.release("job-0")
    got = await first
    assert (got.record.id, got.packed, got.prompt_tokens) == ("job-0", ["a"], 1)
    await settle()
    assert s.jobs["job-1"] == ["bb", "ccc", "dddd", "e"]  # one job, in order of arrival
    s.release()
    answers = [await t for t in rest]
    assert [a.packed for a in answers] == [["bb"], ["ccc"], ["dddd", "e"]]  # each its own vectors
    assert [a.prompt_tokens for a in answers] == [2, 3, 5]  # and its own tokens
    assert {a.record.id for a in answers} == {"job-1"}
    assert s.rated == [False, False]  # counted per request by the route, not per job
    assert (c.jobs, c.requests) == (2, 4)
    assert {k: shared(k) - before[k] for k in before} == {"jobs": 2, "requests": 4}  # what /metrics says


async def test_keys_and_options_do_not_share_a_job() -> None:
    s = StandIn()
    c = coalescer(s, inflight=1)
    busy = [asyncio.create_task(c.embed(who, job(t, dimensions=d))) for who, t, d in
            ((ALICE, "a", None), (BOB, "b", None), (ALICE, "c", 64))]
    await settle()
    assert len(s.jobs) == 3  # three groups, each idle: each at once
    waiting = [asyncio.create_task(c.embed(who, job(t, dimensions=d))) for who, t, d in
               ((ALICE, "a2", None), (BOB, "b2", None), (ALICE, "c2", 64), (BOB, "b3", None))]
    s.release()
    await asyncio.gather(*busy)
    await settle()
    s.release()
    got = await asyncio.gather(*waiting)
    assert sorted(v for k, v in s.jobs.items() if int(k[4:]) >= 3) == [["a2"], ["b2", "b3"], ["c2"]]
    for jid, texts in s.jobs.items():  # a job holds one caller's inputs only
        assert all(s.owners[jid] == (BOB if t.startswith("b") else ALICE) for t in texts), jid
    assert [a.packed for a in got] == [["a2"], ["b2"], ["c2"], ["b3"]]


async def test_a_full_group_goes_without_waiting() -> None:
    s = StandIn()
    c = coalescer(s, inflight=1, max_inputs=4)
    first = asyncio.create_task(c.embed(ALICE, job("a")))
    await settle()
    more = [asyncio.create_task(c.embed(ALICE, job(t, t))) for t in ("b", "c", "d")]
    await settle()
    # b+c fill a group of 4: it goes although job-0 is in flight; d opens the next
    assert s.jobs == {"job-0": ["a"], "job-1": ["b", "b", "c", "c"]}
    assert not c.takes(job("1", "2", "3"))  # more than half a group: a job of its own
    s.release()
    await first
    await settle()
    s.release()
    got = await asyncio.gather(*more)
    assert [a.packed for a in got] == [["b", "b"], ["c", "c"], ["d", "d"]]


async def test_a_failed_shared_job_runs_each_request_on_its_own() -> None:
    s = StandIn()
    c = coalescer(s, inflight=1)
    first = asyncio.create_task(c.embed(ALICE, job("a")))
    await settle()
    tasks = [asyncio.create_task(c.embed(ALICE, job(t))) for t in ("x", "bad", "yy")]
    s.release("job-0")
    await first
    for _ in range(3):
        await settle()
        s.release()
    got = await asyncio.gather(*tasks, return_exceptions=True)
    assert [g.packed if not isinstance(g, BaseException) else type(g) for g in got] == \
        [["x"], InvalidRequest, ["yy"]]
    assert isinstance(got[1], InvalidRequest) and "input 0" in str(got[1])  # its own input's index
    assert s.jobs["job-1"] == ["x", "bad", "yy"]  # the shared job, then one job each
    assert sorted(v for k, v in s.jobs.items() if int(k[4:]) >= 2) == [["bad"], ["x"], ["yy"]]


async def test_a_worker_without_tokens_per_input_gets_each_request_as_its_own_job() -> None:
    s = StandIn()
    s.tokens_per_input = False
    c = coalescer(s, inflight=1)
    first = asyncio.create_task(c.embed(ALICE, job("a")))
    await settle()
    tasks = [asyncio.create_task(c.embed(ALICE, job(t))) for t in ("bb", "ccc")]
    s.release("job-0")
    assert (await first).prompt_tokens == 1
    for _ in range(3):
        await settle()
        s.release()
    got = await asyncio.gather(*tasks)
    assert [(a.packed, a.prompt_tokens) for a in got] == [(["bb"], 2), (["ccc"], 3)]


async def test_a_refusal_is_every_members_and_a_client_that_leaves_takes_no_one_with_it() -> None:
    s = StandIn(refuse=RateLimited("too many unfinished jobs", code="too_many_jobs"))
    c = coalescer(s, inflight=1)
    with pytest.raises(RateLimited):
        await c.embed(ALICE, job("a"))
    s.refuse = None
    first = asyncio.create_task(c.embed(ALICE, job("a")))
    await settle()
    leaving = asyncio.create_task(c.embed(ALICE, job("gone")))
    staying = asyncio.create_task(c.embed(ALICE, job("stay")))
    await settle()
    leaving.cancel()
    s.release("job-0")
    await first
    await settle()
    s.release()
    assert (await staying).packed == ["stay"]
    assert s.jobs["job-1"] == ["gone", "stay"]  # the shared job went on for the one still waiting


async def test_off_takes_nothing() -> None:
    c = coalescer(StandIn(), inflight=0)
    assert not c.takes(job("a"))
