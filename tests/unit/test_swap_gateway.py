"""What the gateway does for models held asleep by multi-model workers (api/standby.py): it queues
for them (no 404), with their description as of their last wake, and gives their jobs a first
``loading`` event with the expected wait; OpenAI streams leave that event out; ``/v1/models`` lists
them with their state; ``/metrics`` counts asleep workers and swaps."""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest

from inferq.api.frames import frame
from inferq.api.openai.answers import Collector
from inferq.api.openai.chunks import chat_chunks
from inferq.api.openai.params import ChatCompletionRequest
from inferq.api.service import JobService
from inferq.api.swap_metrics import swap_families
from inferq.shared import keys
from inferq.shared.celery_app import make_celery
from inferq.shared.errors import NotFound
from inferq.shared.schemas import (
    DoneEvent,
    JobRequest,
    LoadingEvent,
    ModelSlot,
    SwapperInfo,
    TokenEvent,
    WorkerInfo,
)
from inferq.shared.settings import Settings
from inferq.shared.store import JobStore


def worker_info(model: str, max_model_len: int = 96) -> WorkerInfo:
    now = time.time()
    return WorkerInfo(id=f"w-{model}", model=model, host="h", pid=1, max_model_len=max_model_len, max_num_seqs=4,
                      started_at=now, last_seen=now)


async def hold_asleep(r: Any, model: str, *, info: WorkerInfo | None, wake_s: float | None, eta_s: float | None,
                      sid: str = "sw1", max_wait_s: float = 30.0) -> None:
    """A multi-model worker that holds ``model`` asleep, as its heartbeat writes it."""
    now = time.time()
    sw = SwapperInfo(id=sid, host="h", pid=1, sleep_mode=True, max_wait_s=max_wait_s, started_at=now, last_seen=now,
                     awake="other", models=[ModelSlot(name="other", state="awake", eta_s=0.0),
                                            ModelSlot(name=model, state="asleep", info=info, wake_s=wake_s,
                                                      eta_s=eta_s)])
    await r.set(keys.swapper(sid), sw.model_dump_json())
    await r.zadd(keys.standby(model), {sid: now})
    await r.zadd(keys.MODELS, {model: now})


def service(r: Any, own_redis: str, **settings: Any) -> JobService:
    s = Settings(redis_url=own_redis, **settings)
    return JobService(s, r, JobStore(r, 120), make_celery(s))


async def test_a_model_held_asleep_is_queued_for_with_a_loading_event_first(r, own_redis) -> None:
    model = f"sleepy-{uuid.uuid4().hex[:6]}"
    svc = service(r, own_redis)
    with pytest.raises(NotFound):  # nobody serves it, awake or asleep
        await svc.submit(JobRequest(model=model, prompt="hi", max_tokens=4))
    await hold_asleep(r, model, info=worker_info(model), wake_s=0.8, eta_s=0.8)
    svc.standby._seen.clear()
    _, info = await svc.resolve_model(model)
    assert info is not None and info.max_model_len == 96  # checked as its workers last saw it
    rec = await svc.submit(JobRequest(model=model, prompt="hi", max_tokens=4))
    [first] = await svc.store.read_log(rec.id)
    assert isinstance(first, LoadingEvent) and first.seq == 1
    assert (first.model, first.expected_s, first.bound_s) == (model, 0.8, 30.8)
    assert (await svc.store.get(rec.id)).status.value == "queued"


async def test_a_model_awake_somewhere_gets_no_loading_event(r, own_redis) -> None:
    model = f"awake-{uuid.uuid4().hex[:6]}"
    svc = service(r, own_redis)
    await hold_asleep(r, model, info=None, wake_s=None, eta_s=None)
    w = worker_info(model)
    await r.set(keys.worker(w.id), w.model_dump_json())
    await r.zadd(keys.workers(model), {w.id: time.time()})
    rec = await svc.submit(JobRequest(model=model, prompt="hi", max_tokens=4))
    assert await svc.store.read_log(rec.id) == []


async def test_a_model_that_has_just_gone_to_sleep_is_seen_asleep_by_its_next_job(r, own_redis) -> None:
    """The gateway remembers a model's awake workers; once that memory is a second old, the next job
    reads it again, so a model whose worker has just put it to sleep gets its loading event (and its
    sleepers hear of the job) from that job on."""
    model = f"napping-{uuid.uuid4().hex[:6]}"
    svc = service(r, own_redis)
    await hold_asleep(r, model, info=worker_info(model), wake_s=0.8, eta_s=0.8)
    w = worker_info(model)
    await r.set(keys.worker(w.id), w.model_dump_json())
    await r.zadd(keys.workers(model), {w.id: time.time()})
    awake = await svc.submit(JobRequest(model=model, prompt="hi", max_tokens=4))
    assert await svc.store.read_log(awake.id) == []
    await r.zrem(keys.workers(model), w.id)  # its model's process leaves the live set as it sleeps
    at, info = svc._served[model]
    svc._served[model] = (at - 2.0, info)  # what the gateway remembers is two seconds old
    rec = await svc.submit(JobRequest(model=model, prompt="hi", max_tokens=4))
    [first] = await svc.store.read_log(rec.id)
    assert isinstance(first, LoadingEvent)


async def test_a_model_of_INFERQ_MODELS_is_queued_for_with_no_worker_at_all(r, own_redis) -> None:
    model = f"zero-{uuid.uuid4().hex[:6]}"
    svc = service(r, own_redis, models=[{"name": model}])
    rec = await svc.submit(JobRequest(model=model, prompt="hi", max_tokens=4))  # scaled to zero: it waits
    assert rec.model == model and await svc.store.read_log(rec.id) == []  # no sleeper: nothing to say


async def test_a_never_woken_model_has_no_estimate(r, own_redis) -> None:
    model = f"cold-{uuid.uuid4().hex[:6]}"
    svc = service(r, own_redis)
    await hold_asleep(r, model, info=None, wake_s=None, eta_s=None)
    _, info = await svc.resolve_model(model)
    assert info is None  # the worker checks the request itself
    rec = await svc.submit(JobRequest(model=model, prompt="hi", max_tokens=4))
    [first] = await svc.store.read_log(rec.id)
    assert isinstance(first, LoadingEvent) and first.expected_s is None and first.bound_s is None


async def test_the_loading_event_is_written_only_while_the_job_is_queued_with_an_empty_log(store) -> None:
    from tests.unit.workerkit import queued_job

    msg = await queued_job(store, "m")
    ev = LoadingEvent(seq=0, model="m", expected_s=1.0)
    assert await store.loading(msg.id, ev)
    assert not await store.loading(msg.id, ev)  # its log holds an event already
    assert [e.seq for e in await store.read_log(msg.id)] == [1]
    claimed = await store.claim(msg.id, "w1")
    assert claimed is not None
    other = await queued_job(store, "m")
    await store.claim(other.id, "w1")
    assert not await store.loading(other.id, ev)  # running: too late to say it waits


class FakeHub:
    def __init__(self, events: list[Any]) -> None:
        self.frames = [frame(e.model_dump_json(exclude_none=True)) for e in events]

    async def batches(self, job_id: str, after: int = 0, kind: str | None = None) -> AsyncIterator[list[Any]]:
        yield self.frames


async def test_openai_streams_and_answers_leave_the_loading_event_out() -> None:
    events = [LoadingEvent(seq=1, model="m", expected_s=2.0), TokenEvent(seq=2, text="hel", n_tokens=1),
              TokenEvent(seq=3, text="lo", n_tokens=1), DoneEvent(seq=4, finish_reason="length")]
    req = ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "x"}], stream=True)
    payloads = [p async for p in chat_chunks(FakeHub(events), "job-x", "m", req)]  # type: ignore[arg-type]
    texts = [p.data for p in payloads]
    assert texts[-1] == "[DONE]" and not any("error" in t for t in texts)
    assert any('"content":"hello"' in t for t in texts), texts
    c = Collector(1)
    for ev in events:
        c.feed(ev)
    assert c.out.choices[0].text == "hello"


def test_swap_metrics_are_a_histogram_per_model_and_first_starts_apart() -> None:
    stats = {"n|a": 3, "nms|a": 2400, "le|a|0.5": 1, "le|a|1": 2, "le|a|2.5": 3, "cold|b": 1, "coldms|b": 20000}
    fams = {f.name: f for f in swap_families(stats)}
    swaps = {(s.name, s.labels.get("le")): s.value for s in fams["inferq_model_swap_seconds"].samples}
    assert swaps[("inferq_model_swap_seconds_bucket", "0.25")] == 0
    assert swaps[("inferq_model_swap_seconds_bucket", "1")] == 2
    assert swaps[("inferq_model_swap_seconds_bucket", "+Inf")] == 3
    assert swaps[("inferq_model_swap_seconds_count", None)] == 3
    assert swaps[("inferq_model_swap_seconds_sum", None)] == 2.4
    starts = {s.name: s.value for s in fams["inferq_model_starts"].samples}
    assert starts == {"inferq_model_starts_total": 1}
    assert [s.value for s in fams["inferq_model_start_seconds"].samples] == [20.0]


def test_models_lists_every_model_with_its_state(own_redis: str) -> None:
    """/v1/models: awake (a live worker), asleep (a multi-model worker holds it), offline (one of
    INFERQ_MODELS, nothing running), each with its awake and asleep workers."""
    import asyncio

    import redis.asyncio as aredis
    from fastapi.testclient import TestClient

    from inferq.api.app import create_app

    tag = uuid.uuid4().hex[:6]
    awake, asleep, offline = f"up-{tag}", f"nap-{tag}", f"off-{tag}"

    async def setup() -> None:
        r = aredis.Redis.from_url(own_redis, decode_responses=True)
        w = worker_info(awake, 64)
        await r.set(keys.worker(w.id), w.model_dump_json())
        await r.zadd(keys.workers(awake), {w.id: time.time()})
        await r.zadd(keys.MODELS, {awake: time.time()})
        await hold_asleep(r, asleep, info=worker_info(asleep, 128), wake_s=1.0, eta_s=1.0)
        await r.aclose()
    asyncio.run(setup())
    settings = Settings(redis_url=own_redis, models=[{"name": offline}])  # type: ignore[list-item]
    with TestClient(create_app(settings)) as c:
        cards = {m["id"]: m for m in c.get("/v1/models").json()["data"]}
        one = c.get(f"/v1/models/{asleep}").json()
        metrics = c.get("/metrics").text
    assert (cards[awake]["state"], cards[awake]["awake_workers"], cards[awake]["max_model_len"]) == ("awake", 1, 64)
    assert (cards[asleep]["state"], cards[asleep]["asleep_workers"], cards[asleep]["max_model_len"]) == \
        ("asleep", 1, 128)
    assert (cards[offline]["state"], cards[offline]["awake_workers"], cards[offline]["asleep_workers"]) == \
        ("offline", 0, 0)
    assert one["state"] == "asleep"
    assert f'inferq_workers{{model="{asleep}",state="asleep"}} 1.0' in metrics


async def test_a_loading_event_tells_the_sleeping_models_workers_at_once(store) -> None:
    """With the job's ``loading`` event the model's name goes out on the wanted channel, where the
    multi-model workers that hold it asleep listen (worker/multi/wanted.py) and read their demand at
    once; a job that is no longer waiting says nothing."""
    import asyncio

    from inferq.worker.multi.wanted import listen
    from tests.unit.workerkit import queued_job

    kicked = {name: asyncio.Event() for name in ("m", "other")}
    listeners = [asyncio.create_task(listen(store.redis, [name], ev)) for name, ev in kicked.items()]
    try:
        for _ in range(600):  # until both listeners are subscribed
            if (await store.redis.pubsub_numsub(keys.WANTED_CHANNEL))[0][1] >= 2:
                break
            await asyncio.sleep(0.05)
        msg = await queued_job(store, "m")
        assert await store.loading(msg.id, LoadingEvent(seq=0, model="m", expected_s=1.0))
        await asyncio.wait_for(kicked["m"].wait(), 30)
        assert not kicked["other"].is_set()
    finally:
        for task in listeners:
            task.cancel()
