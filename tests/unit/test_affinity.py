"""Cache-affine pull's parts on a real Redis, without an engine: prefix block hashes, a worker's
choice between running a job and passing it to the worker that holds its prefix or adapter, and a
lane handed back to the queue."""

from __future__ import annotations

import json
import threading
import time

import pytest
import redis

from inferq.shared import keys
from inferq.shared.celery_app import make_celery
from inferq.shared.schemas import AdapterRef, EngineStats, JobMessage, JobRequest, WorkerInfo
from inferq.shared.settings import Settings
from inferq.worker.jobs.affinity import Affinity, block_hashes
from inferq.worker.liveness.lanes import return_lane
from tests.unit.workerkit import GatedEngine, queued_job, start_runtime
from tests.wait import eventually

BLOCK = 8
MODEL = "m-aff"


def test_a_prompt_shares_the_hashes_of_every_whole_block_it_shares() -> None:
    base = list(range(40))
    longer = base + [7] * 20
    other = base[:10] + [999] + base[11:]
    assert len(block_hashes(base, None, BLOCK)) == 5 and len(block_hashes(base[:7], None, BLOCK)) == 0
    assert block_hashes(longer, None, BLOCK)[:5] == block_hashes(base, None, BLOCK)
    assert block_hashes(other, None, BLOCK)[:1] == block_hashes(base, None, BLOCK)[:1]
    assert not set(block_hashes(other, None, BLOCK)[1:]) & set(block_hashes(base, None, BLOCK))
    assert not set(block_hashes(base, "lora-a", BLOCK)) & set(block_hashes(base, None, BLOCK))
    assert len(block_hashes(list(range(1000)), None, BLOCK, limit=3)) == 3


@pytest.fixture
def sync_r(own_redis: str) -> redis.Redis:
    r = redis.Redis.from_url(own_redis, decode_responses=True)
    r.flushdb()
    return r


def worker(own_redis: str, wid: str) -> Affinity:
    s = Settings(redis_url=own_redis, served_model_name=MODEL, affinity_block_tokens=BLOCK)
    return Affinity(s, make_celery(s), wid, slots=4)


def beat(r: redis.Redis, wid: str, running: int = 0, draining: bool = False, age: float = 0.0,
         lane: bool = True) -> None:
    """The worker's heartbeat, and the load it publishes as it takes jobs on and ends them."""
    r.hset(keys.worker_loads(MODEL), wid, running)
    now = time.time()
    info = WorkerInfo(id=wid, model=MODEL, host="h", pid=1, max_model_len=4096, max_num_seqs=4, started_at=now,
                      last_seen=now - age, draining=draining, stats=EngineStats(running=running), lane=lane)
    r.set(keys.worker(wid), info.model_dump_json())


def job(ids: list[int], adapter: str | None = None, passed_by: str | None = None) -> JobMessage:
    return JobMessage(id="job-" + "a" * 32, model=MODEL, request=JobRequest(prompt_token_ids=ids), created_at=1.0,
                      adapter=AdapterRef(name=adapter, path="/a") if adapter else None, passed_by=passed_by)


def lane_messages(r: redis.Redis, wid: str) -> list[dict]:
    out = []
    for name in keys.priority_lists(keys.lane(MODEL, wid)):
        out += [json.loads(m) for m in r.lrange(name, 0, -1)]
    return out


def test_a_follow_up_goes_to_the_worker_that_ran_its_prefix_while_it_has_room(own_redis, sync_r) -> None:
    w1, w2 = worker(own_redis, "w1"), worker(own_redis, "w2")
    first = list(range(24))
    assert w2.place(job(first), first) is None  # nobody held it: w2 runs it, and now holds its blocks
    follow_up = first + list(range(100, 120))
    beat(sync_r, "w2")
    assert w1.place(job(follow_up), follow_up) == "w2"
    w1.pass_to(job(follow_up), "w2")
    [msg] = lane_messages(sync_r, "w2")
    payload = JobMessage.model_validate_json(json.loads(__import__("base64").b64decode(msg["body"]))[0][0])
    assert payload.passed_by == "w1" and payload.id == job(follow_up).id
    assert msg["properties"]["delivery_info"]["routing_key"] == keys.lane(MODEL, "w2")
    # the lane's worker runs what was passed to it, and holds the longer prefix from then on
    assert w2.place(payload, follow_up) is None
    assert sync_r.get(keys.prefix_owner(MODEL, block_hashes(follow_up, None, BLOCK)[-1])) == "w2"


@pytest.mark.parametrize("state", ["full", "lane full", "draining", "dead", "gone", "no lane"])
def test_a_job_runs_where_it_was_taken_when_its_holder_has_no_room(own_redis, sync_r, state: str) -> None:
    w1, w2 = worker(own_redis, "w1"), worker(own_redis, "w2")
    ids = list(range(16))
    w2.place(job(ids), ids)
    if state != "gone":
        beat(sync_r, "w2", running=4 if state == "full" else 1, draining=state == "draining",
             age=60 if state == "dead" else 0, lane=state != "no lane")
    if state == "lane full":
        for _ in range(3):
            w1.pass_to(job(ids), "w2")
    assert w1.place(job(ids), ids) is None
    assert sync_r.get(keys.prefix_owner(MODEL, block_hashes(ids, None, BLOCK)[0])) == "w1"  # it runs on w1


def test_a_holder_much_busier_than_the_taker_leaves_it_the_job(own_redis, sync_r) -> None:
    """INFERQ_AFFINITY_SLACK (1/4 of 4 sequences: 1): a holder with 3 sequences does not get the job
    from a taker that holds none; from a taker that holds 3 jobs, it does."""
    w1, w2 = worker(own_redis, "w1"), worker(own_redis, "w2")
    ids = list(range(16))
    w2.place(job(ids), ids)
    beat(sync_r, "w2", running=3)
    assert w1.place(job(ids), ids) is None
    w2.place(job(ids), ids)  # w2 holds it again
    w1.own_load = lambda: 3
    assert w1.place(job(ids), ids) == "w2"


def test_an_adapter_draws_its_jobs_when_no_prefix_does(own_redis, sync_r) -> None:
    w1, w2 = worker(own_redis, "w1"), worker(own_redis, "w2")
    w1.own_load = lambda: 1  # this job, taken
    w2.place(job([1, 2], adapter="lora-x"), [1, 2])  # a prompt shorter than a block: the adapter alone
    beat(sync_r, "w2")
    assert w1.place(job([5, 6, 7], adapter="lora-x"), [5, 6, 7]) == "w2"
    w2.place(job([1, 2], adapter="lora-x"), [1, 2])
    beat(sync_r, "w2", running=1)  # the adapter's worker as busy as this one: the job would tip it
    assert w1.place(job([5, 6, 7], adapter="lora-x"), [5, 6, 7]) is None
    beat(sync_r, "w2")
    w1.own_adapters = lambda: ["lora-x"]  # loaded here too: nothing to gain by passing it
    assert w1.place(job([5, 6, 7], adapter="lora-x"), [5, 6, 7]) is None
    w1.own_adapters = lambda: []
    w2.place(job([1, 2], adapter="lora-x"), [1, 2])
    assert w1.place(job([5, 6, 7]), [5, 6, 7]) is None  # no adapter, no whole block: nothing to match
    assert w1.place(job(list(range(16)), adapter="lora-x", passed_by="w3"), list(range(16))) is None


async def test_a_lane_goes_back_to_the_queue_in_order_and_by_priority(own_redis, r) -> None:
    lane = keys.priority_lists(keys.lane(MODEL, "w9"))
    for i in range(3):
        await r.lpush(lane[5], f"p5-{i}")  # kombu pushes left, pops right: p5-0 is the oldest
    await r.lpush(lane[0], "p0-0")
    await r.lpush(keys.queue_lists(MODEL)[5], "queued-before")
    assert await return_lane(r, MODEL, "w9", "test") == 4
    assert [await r.llen(name) for name in lane] == [0] * 10
    assert await r.lrange(keys.queue_lists(MODEL)[0], 0, -1) == ["p0-0"]
    popped = [await r.rpop(keys.queue_lists(MODEL)[5]) for _ in range(4)]
    assert popped == ["p5-0", "p5-1", "p5-2", "queued-before"]  # the lane's waited longest


def test_new_prefixes_start_on_the_least_loaded_worker(own_redis, sync_r) -> None:
    """A job no worker holds a block of goes where the loads (the jobs each runs, live, and lanes) are
    lowest, when that evens them out: a wave of new sessions taken by one worker spreads out."""
    w1, w2, w3 = (worker(own_redis, w) for w in ("w1", "w2", "w3"))
    for w in ("w1", "w2", "w3"):
        beat(sync_r, w)
        sync_r.zadd(keys.workers(MODEL), {w: time.time()})
    sync_r.hset(keys.worker_loads(MODEL), "w2", 1)  # w2 has taken one job on since its last beat
    held = [0]
    w1.own_load = lambda: held[0] + 1  # what w1 holds, this job included
    placed = []
    for i in range(4):  # w1 took four new sessions' first turns
        ids = [1000 * i + k for k in range(16)]
        to = w1.place(job(ids), ids)
        placed.append(to)
        if to is None:
            held[0] += 1
        else:
            w1.pass_to(job(ids), to)
    assert placed.count(None) == 2 and placed.count("w3") == 1 and placed.count("w2") == 1, placed
    ids = list(range(5000, 5016))
    assert w2.place(job(ids), ids) is None  # w2, no busier than the others by more than one: it keeps it
    beat(sync_r, "w3", running=4)  # full: never sent one
    w1.own_load = lambda: 4
    assert w1.place(job(list(range(6000, 6016))), list(range(6000, 6016))) == "w2"


async def test_a_worker_counts_a_burst_it_takes_before_placing_it(store, own_redis) -> None:
    """Jobs a worker has taken but not yet placed (placing is one at a time) already count in the
    load it publishes: other workers placing new prefixes meanwhile see the whole burst, not only
    what was placed so far (with four workers taking a wave at once, they did not, and the wave
    stayed split 6 to 11 sessions a worker). A job passed on stops counting."""
    rig = start_runtime(own_redis, GatedEngine(), affinity="prefix")
    rt, gate = rig.runtime, threading.Event()
    placed: list[str] = []

    def slow_place(msg: JobMessage, ids: list[int]) -> str | None:
        gate.wait(30)
        placed.append(msg.id)
        return "elsewhere" if len(placed) == 1 else None  # the first goes to another worker

    rt.affinity.place, rt.affinity.pass_to = slow_place, lambda msg, to: None
    loads = redis.Redis.from_url(own_redis, decode_responses=True)

    def published() -> int:
        return int(loads.hget(keys.worker_loads("scripted"), rt.id) or 0)

    try:
        jobs = [await queued_job(store, "scripted", prompt=None, prompt_token_ids=list(range(40)))
                for _ in range(3)]
        runs = [rig.run_job(m) for m in jobs]
        eventually(lambda: published() == 3, 30, "the three jobs taken count before any is placed")
        assert placed == []
        gate.set()
        eventually(lambda: len(rig.engine.started) == 2, 30, "the two jobs kept run here")
        eventually(lambda: any(f.done() for f in runs), 30, "the job passed on leaves this worker")
        assert [f.result() for f in runs if f.done()] == [None] and len(placed) == 3
        assert published() == 2 and rt._load() == 2
    finally:
        gate.set()
        rig.stop()
