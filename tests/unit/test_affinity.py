"""Cache-affine pull's promises on a real Redis, without an engine: the prefix index as the engine's
KV-cache events feed it, a worker's choice between running a job and passing it on (one read of the
fleet, then the pure rule of test_placement.py), adapter homes, and a lane handed back to the queue."""

from __future__ import annotations

import base64
import json
import threading
import time
from collections import Counter

import pytest
import redis

from inferq.shared import keys
from inferq.shared.celery_app import make_celery
from inferq.shared.schemas import AdapterHomes, AdapterRef, EngineStats, JobMessage, JobRequest, WorkerInfo
from inferq.shared.settings import Settings
from inferq.worker.jobs import prefix_index
from inferq.worker.jobs.affinity import Affinity
from inferq.worker.jobs.kv_feed import KVEventFeed
from inferq.worker.jobs.prefix_index import ChainTracker, PrefixIndex, block_hashes
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


def stored(parent, hashes, tokens, block_size=4, lora=None, medium="GPU") -> dict:
    """A BlockStored event as vLLM publishes it (msgpack, read back as a map)."""
    return {"type": "BlockStored", "block_hashes": hashes, "parent_block_hash": parent, "token_ids": tokens,
            "block_size": block_size, "lora_id": None, "medium": medium, "lora_name": lora}


def test_the_engines_blocks_become_the_index_hashes_a_prompt_has() -> None:
    """Engine blocks of 4 tokens, index blocks of 8: every second engine block ends an index block,
    with the hash the taker computes from the prompt; an eviction drops exactly the blocks it ends."""
    prompt = list(range(100, 124))  # 6 engine blocks, 3 index blocks
    t = ChainTracker(BLOCK)
    got = t.stored(None, [b"e1", b"e2", b"e3"], prompt[:12], 4, None)
    got += t.stored(b"e3", [b"e4", b"e5", b"e6"], prompt[12:], 4, None)
    assert got == block_hashes(prompt, None, BLOCK)
    assert t.stored(None, [b"l1", b"l2"], prompt[:8], 4, "lora-a") == block_hashes(prompt[:8], "lora-a", BLOCK)
    assert t.stored(b"unknown", [b"x"], prompt[:4], 4, None) == []  # its parent came before we listened
    assert t.stored(None, [b"e1", b"e2"], prompt[:8], 4, None) == block_hashes(prompt[:8], None, BLOCK)  # reused
    assert t.removed([b"e6"]) == [block_hashes(prompt, None, BLOCK)[2]]
    assert t.removed([b"e5", b"e3"]) == []  # they end no index block
    assert sorted(t.cleared()) == sorted(block_hashes(prompt[:16], None, BLOCK) + block_hashes(prompt[:8], "lora-a",
                                                                                               BLOCK))


@pytest.fixture
def sync_r(own_redis: str) -> redis.Redis:
    r = redis.Redis.from_url(own_redis, decode_responses=True)
    r.flushdb()
    return r


def test_the_index_holds_what_the_engine_holds(own_redis, sync_r) -> None:
    """The feed's batches (stored, evicted, all cleared, a batch lost) reach Redis as the engine's
    cache changes: what readers see is what the engine holds."""
    index = PrefixIndex(sync_r, MODEL, ttl_s=600)
    feed = KVEventFeed("ipc:///tmp/inferq-test-unused", index, "eng-1", BLOCK)
    prompt = list(range(16))
    hashes = block_hashes(prompt, None, BLOCK)

    def holders() -> list[list[str]]:
        with sync_r.pipeline() as p:
            index.read(p, hashes, time.time())
            return p.execute()

    def batch(seq: int, *events: dict) -> list[bytes]:
        import msgspec

        return [b"", seq.to_bytes(8, "big"), msgspec.msgpack.encode([time.time(), list(events), None])]

    try:
        feed.apply(batch(0, stored(None, [1, 2, 3, 4], prompt)))
        assert holders() == [["eng-1"], ["eng-1"]]
        feed.apply(batch(1, {"type": "BlockRemoved", "block_hashes": [4], "medium": "GPU"}))
        assert holders() == [["eng-1"], []]
        feed.apply(batch(2, stored(2, [3, 4], prompt[8:], medium="CPU")))  # an offload tier: not held
        assert holders() == [["eng-1"], []]
        feed.apply(batch(3, {"type": "AllBlocksCleared"}))
        assert holders() == [[], []]
        feed.apply(batch(4, stored(None, [1, 2, 3, 4], prompt)))
        feed.apply(batch(9, stored(None, [7], [0, 0, 0, 0])))  # batches 5-8 lost: forget everything
        assert holders() == [[], []]
    finally:
        feed.stop()


def worker(own_redis: str, wid: str, load: int = 0, **settings) -> Affinity:
    s = Settings(redis_url=own_redis, served_model_name=MODEL, affinity_block_tokens=BLOCK, max_num_seqs=4,
                 affinity_slack=0.25, **settings)
    aff = Affinity(s, make_celery(s), wid, slots=4, own_load=lambda: load, engine=f"{wid}-engine",
                   max_loras=settings.get("max_loras", 4))
    return aff


def beat(r: redis.Redis, wid: str, running: int = 0, draining: bool = False, age: float = 0.0,
         lane: bool = True, max_loras: int = 4, model: str = MODEL) -> None:
    """The worker's heartbeat, and the load it publishes as it takes jobs on and ends them."""
    r.hset(keys.worker_loads(model), wid, running)
    now = time.time()
    info = WorkerInfo(id=wid, model=model, host="h", pid=1, max_model_len=4096, max_num_seqs=4, started_at=now,
                      last_seen=now - age, draining=draining, stats=EngineStats(running=running), lane=lane,
                      engine=f"{wid}-engine", max_loras=max_loras)
    r.set(keys.worker(wid), info.model_dump_json())
    r.zadd(keys.workers(model), {wid: now - age})


def job(ids: list[int], adapter: str | None = None, passed_by: str | None = None) -> JobMessage:
    return JobMessage(id="job-" + "a" * 32, model=MODEL, request=JobRequest(prompt_token_ids=ids), created_at=1.0,
                      adapter=AdapterRef(name=adapter, path="/a") if adapter else None, passed_by=passed_by)


def where(aff: Affinity, msg: JobMessage, ids: list[int]):
    """Where ``aff`` would place the job (a decision not carried out: a pass is taken back)."""
    d = aff.decide(msg, ids)
    if d.to is not None:
        aff._pushed(d.to, ok=False)
    return d


def lane_messages(r: redis.Redis, wid: str) -> list[dict]:
    out = []
    for name in keys.priority_lists(keys.lane(MODEL, wid)):
        out += [json.loads(m) for m in r.lrange(name, 0, -1)]
    return out


def test_a_follow_up_goes_to_the_engine_that_holds_its_prefix_and_runs_there(own_redis, sync_r) -> None:
    w1, w2 = worker(own_redis, "w1", load=1), worker(own_redis, "w2", affinity_index="writes")
    first = list(range(24))
    w2.ran_here(job(first), first)  # (with events off, the claim writes the prefix)
    beat(sync_r, "w2")
    follow_up = first + list(range(100, 120))
    assert w1.route(job(follow_up), follow_up, passed=lambda: None)
    [msg] = lane_messages(sync_r, "w2")
    payload = JobMessage.model_validate_json(json.loads(base64.b64decode(msg["body"]))[0][0])
    assert payload.passed_by == "w1" and payload.id == job(follow_up).id
    assert msg["properties"]["delivery_info"]["routing_key"] == keys.lane(MODEL, "w2")
    assert w2.decide(payload, follow_up).why == "passed"  # the lane's worker runs it, never passes it again


@pytest.mark.parametrize("state", ["full", "lane full", "draining", "dead", "gone", "no lane", "engine restarted"])
def test_a_job_runs_where_it_was_taken_when_its_holder_cannot_take_it(own_redis, sync_r, state: str) -> None:
    w1, w2 = worker(own_redis, "w1", load=1), worker(own_redis, "w2", affinity_index="writes")
    ids = list(range(16))
    w2.ran_here(job(ids), ids)
    if state != "gone":
        beat(sync_r, "w2", running=4 if state == "full" else 1, draining=state == "draining",
             age=60 if state == "dead" else 0, lane=state != "no lane")
    if state == "lane full":
        for _ in range(3):
            w1.pass_to(job(ids), "w2")
    if state == "engine restarted":  # its new engine holds nothing: the entries name the old one
        info = WorkerInfo.model_validate_json(sync_r.get(keys.worker("w2")))
        sync_r.set(keys.worker("w2"), info.model_copy(update={"engine": "w2-engine~new"}).model_dump_json())
    assert where(w1, job(ids), ids).here


def test_an_adapter_goes_to_its_home_and_homes_split_the_adapters(own_redis, sync_r) -> None:
    """Four workers of four slots and sixteen adapters in demand: each adapter has one home, each
    worker is home to four, and a worker that takes a job of an adapter that is not its own passes
    it home (while the home has room and is not much busier)."""
    names = [f"w{i}" for i in range(4)]
    for w in names:
        beat(sync_r, w)
    window = int(time.time() // keys.ADAPTER_DEMAND_WINDOW_S)
    sync_r.hset(keys.adapter_demand(MODEL, window), mapping={f"a{i}": 10 for i in range(16)})
    takers = {w: worker(own_redis, w, load=1) for w in names}
    homes: dict[str, str] = {}
    for i in range(16):
        taker = takers["w0"]
        d = where(taker, job([1, 2, 3], adapter=f"a{i}"), [1, 2, 3])
        homes[f"a{i}"] = d.to or "w0"
        assert d.why == "adapter"
    assert Counter(homes.values()) == dict.fromkeys(names, 4)
    for adapter, home in homes.items():  # every worker agrees, and a home keeps its own adapter's jobs
        assert where(takers[home], job([1], adapter=adapter), [1]).here
    beat(sync_r, "w1", running=4)  # a home with no free slot
    mine = next(a for a, h in homes.items() if h == "w1")
    for t in takers.values():
        t.view.invalidate()
    assert where(takers["w0"], job([1], adapter=mine), [1]).to != "w1"


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


def test_new_prefixes_start_on_the_least_loaded_worker_and_each_decision_sees_the_last(own_redis, sync_r) -> None:
    """A job no engine holds a block of goes where the loads (the jobs each runs, live, and lanes)
    are lowest, when that evens them out: a wave of new sessions taken by one worker spreads out,
    each decision counting the passes before it (their pushes done or not)."""
    for w in ("w1", "w2", "w3"):
        beat(sync_r, w)
    sync_r.hset(keys.worker_loads(MODEL), "w2", 1)  # w2 has taken one job on since its last beat
    held = [4]
    w1 = worker(own_redis, "w1")  # (slack 1 of 4 sequences: spread when busier by more than one)
    w1.own_load = lambda: held[0]  # w1 took four new sessions' first turns at once
    for i in range(4):
        ids = [1000 * i + k for k in range(16)]
        w1.route(job(ids), ids, passed=lambda: held.__setitem__(0, held[0] - 1))
    assert (held[0], len(lane_messages(sync_r, "w2")), len(lane_messages(sync_r, "w3"))) == (2, 1, 1)
    # a pass decided but not yet pushed counts too: the next decision sees it (w3 would get both)
    held[0] = 5
    assert [w1.decide(job([k] * 16), [k] * 16).to for k in (5, 6)] == ["w3", "w2"]


def test_the_fleet_works_to_one_stored_plan_of_homes_until_its_engines_change(own_redis, sync_r) -> None:
    """The first worker to plan stores its homes; another uses the stored plan while it serves the
    demand it reads (even one it would not have made itself), and makes and stores a new one when a
    worker joins."""
    names = [f"w{i}" for i in range(4)]
    for w in names:
        beat(sync_r, w)
    window = int(time.time() // keys.ADAPTER_DEMAND_WINDOW_S)
    sync_r.hset(keys.adapter_demand(MODEL, window), mapping={f"a{i}": 50 for i in range(16)})
    w0, w1 = worker(own_redis, "w0", load=1), worker(own_redis, "w1", load=1)
    where(w0, job([1], adapter="a0"), [1])
    stored = AdapterHomes.model_validate_json(sync_r.get(keys.adapter_homes(MODEL)))
    assert sorted(stored.engines) == [f"{w}-engine" for w in names] and len(stored.homes) == 16
    # the stored plan turned round by one engine: as good a plan, not the one w1 would make
    turn = {f"{w}-engine": f"{names[(i + 1) % 4]}-engine" for i, w in enumerate(names)}
    turned = {a: [turn[e] for e in h] for a, h in stored.homes.items()}
    sync_r.set(keys.adapter_homes(MODEL), stored.model_copy(update={"homes": turned}).model_dump_json())
    sync_r.hincrby(keys.adapter_demand(MODEL, window), "a3", 4)  # counts that move within their noise
    (home,) = turned["a5"]
    taker = next(w for w in (w0, w1) if f"{w.worker_id}-engine" != home)
    taker.view.invalidate()
    assert where(taker, job([1], adapter="a5"), [1]).to == home.removesuffix("-engine")
    sync_r.expire(keys.adapter_homes(MODEL), 5)  # a plan in use lives on: each read renews it
    taker.view.invalidate()
    where(taker, job([1], adapter="a5"), [1])
    assert sync_r.ttl(keys.adapter_homes(MODEL)) > 60
    beat(sync_r, "w4")  # a worker joins: a new plan, for five engines, stored for the others
    taker.view.invalidate()
    where(taker, job([1], adapter="a5"), [1])
    again = AdapterHomes.model_validate_json(sync_r.get(keys.adapter_homes(MODEL)))
    assert "w4-engine" in again.engines and again.homes != turned


def test_placing_a_job_is_one_round_trip(own_redis, sync_r) -> None:
    """Whatever the fleet's size, a job's placement reads Redis once (the live workers' view, at
    most once a second, apart)."""
    for w in ("w1", "w2", "w3", "w4"):
        beat(sync_r, w)
    w1 = worker(own_redis, "w1", load=1)
    ids = list(range(64))
    w1.decide(job(ids, adapter="a"), ids)  # reads the view
    before = sync_r.info("stats")["total_commands_processed"]
    calls = []
    real = w1.redis.pipeline

    def counted(*a, **k):
        calls.append(1)
        return real(*a, **k)

    w1.redis.pipeline = counted
    w1.decide(job(ids, adapter="a"), ids)
    assert len(calls) == 1 and sync_r.info("stats")["total_commands_processed"] > before


async def test_a_worker_counts_a_burst_it_takes_before_placing_it(store, own_redis) -> None:
    """Jobs a worker has taken but not yet placed already count in the load it publishes: other
    workers placing new prefixes meanwhile see the whole burst, not only what was placed so far. A
    job passed on stops counting."""
    rig = start_runtime(own_redis, GatedEngine(), affinity="prefix")
    rt, gate = rig.runtime, threading.Event()
    placed: list[str] = []

    def slow_decide(msg, ids):
        gate.wait(30)
        placed.append(msg.id)
        from inferq.worker.jobs.placement import Decision

        if len(placed) == 1:  # the first goes to another worker
            rt.affinity._transit += 1
            rt.affinity._passes.append(("elsewhere", None))
            return Decision("elsewhere", "spread")
        return Decision(None, "here")

    rt.affinity.decide, rt.affinity.pass_to = slow_decide, lambda msg, to: None
    loads = redis.Redis.from_url(own_redis, decode_responses=True)
    beat(loads, "w-other", model="scripted")  # another worker reads the load (an only worker writes none)
    rt.affinity.view.invalidate()

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
        assert published() == 2 and rt.intake.load() == 2
    finally:
        gate.set()
        rig.stop()


def test_an_operator_switches_affinity_off_and_on_at_run_time(own_redis, sync_r) -> None:
    """``SET inferq:affinity:{model} off``: every worker of the model runs what it takes (plain pull)
    within a second; deleting the key (or 'prefix') brings cache-affine pull back."""
    w1 = worker(own_redis, "w1", load=3)
    assert w1.on()
    sync_r.set(keys.affinity_mode(MODEL), "off")
    w1._mode = (0.0, True)  # (the switch is read at most once a second)
    assert not w1.on()
    sync_r.delete(keys.affinity_mode(MODEL))
    w1._mode = (0.0, False)
    assert w1.on()


def test_an_engines_event_socket_is_its_own_and_a_dead_ones_is_swept(tmp_path, monkeypatch) -> None:
    """Each worker's engine publishes its KV events on an ipc socket named after the worker's
    process; sockets of processes that died without removing theirs are removed at the next start."""
    import os

    from inferq.worker.engine.args import kv_events_endpoint

    monkeypatch.setattr("tempfile.gettempdir", lambda: str(tmp_path))
    dead = tmp_path / "inferq-kv-999999999-abcd"
    alive = tmp_path / f"inferq-kv-{os.getpid()}-beef"
    dead.touch()
    alive.touch()
    endpoint = kv_events_endpoint(Settings())
    assert endpoint is not None and endpoint.startswith(f"ipc://{tmp_path}/inferq-kv-{os.getpid()}-")
    assert not dead.exists() and alive.exists()
    assert kv_events_endpoint(Settings(affinity="off")) is None
    assert kv_events_endpoint(Settings(affinity_index="writes")) is None


def test_the_only_worker_of_a_model_places_without_reading_the_fleet(own_redis, sync_r) -> None:
    w1 = worker(own_redis, "w1", load=1)
    ids = list(range(16))
    assert where(w1, job(ids), ids).why == "alone"
    assert where(w1, job(ids, adapter="a1"), ids).why != "alone"  # an adapter's demand is still counted
    beat(sync_r, "w2")
    w1.view.invalidate()
    assert where(w1, job(ids), ids).why != "alone"


def test_the_published_load_ends_at_the_count_when_many_threads_take_and_end_jobs(own_redis, sync_r) -> None:
    """Jobs taken and ended on many threads at once: writes that meet are merged, and the last one
    written is the count as it is."""
    from inferq.worker.jobs.intake import Intake

    beat(sync_r, "w2")  # another live worker: the load is read, so it is written
    intake = Intake(host=None)  # type: ignore[arg-type]  # only the count is used here
    intake.affinity = worker(own_redis, "w1")
    barrier = threading.Barrier(16)

    def take(n: int) -> None:
        barrier.wait()
        for _ in range(20):
            intake._hold(1)
        for _ in range(20 - n):
            intake._hold(-1)

    threads = [threading.Thread(target=take, args=(i % 3,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    kept = sum(i % 3 for i in range(16))
    assert intake.load() == kept
    assert int(sync_r.hget(keys.worker_loads(MODEL), "w1")) == kept


def test_a_claim_refreshes_only_the_prefixes_its_engine_was_seen_holding(own_redis, sync_r) -> None:
    """With the engine's events feeding the index, a job run here refreshes the entries its reading
    found for this engine, and writes nothing for the blocks nobody holds."""
    w1 = worker(own_redis, "w1", load=0)
    beat(sync_r, "w2", running=3)  # another live worker, busier: the job is read for and stays here
    ids = list(range(4 * BLOCK))
    hashes = block_hashes(ids, None, BLOCK)
    w1.index.hold("w1-engine", hashes[:2])  # what the engine's events said it holds

    def zadds() -> int:
        return int(sync_r.info("commandstats").get("cmdstat_zadd", {}).get("calls", 0))

    assert where(w1, job(ids), ids).here
    assert w1.wants_claim(job(ids), ids)  # its claim has entries to refresh
    before = zadds()
    w1.index.clock = lambda: time.monotonic() + 600  # written long enough ago to be refreshed
    w1.ran_here(job(ids), ids)
    assert zadds() - before == 2
    fresh = list(range(1000, 1000 + 4 * BLOCK))  # nobody holds any of it: no write at all
    assert where(w1, job(fresh), fresh).here
    before = zadds()
    w1.ran_here(job(fresh), fresh)
    assert zadds() == before
    assert where(w1, job(fresh), fresh).here  # so the taker need not hear of its claim at all
    assert not w1.wants_claim(job(fresh), fresh)
    assert not w1._seen_here  # (and nothing is kept for it)
    assert not w1.wants_claim(job(ids[:BLOCK - 1]), ids[:BLOCK - 1])  # no whole block: nothing to record


def test_an_only_worker_fed_by_events_refreshes_a_held_prefix_once_a_quarter_ttl_and_nothing_else(
        own_redis, sync_r) -> None:
    """A model's only worker places with no read: at the claim it refreshes only the blocks its
    engine's events wrote, and none of them again within a quarter of the TTL; a new prompt's
    blocks (not computed yet) cost no command, and an evicted block is not refreshed."""
    w1 = worker(own_redis, "w1")
    feed = KVEventFeed("ipc:///tmp/inferq-test-unused-2", w1.index, "w1-engine", BLOCK)
    later = [0.0]
    w1.index.clock = lambda: time.monotonic() + later[0]
    ids = list(range(2 * BLOCK))
    held = block_hashes(ids, None, BLOCK)

    def zadds() -> int:
        return int(sync_r.info("commandstats").get("cmdstat_zadd", {}).get("calls", 0))

    def claimed(prompt: list[int]) -> int:
        """The index writes one claim of ``prompt`` sends."""
        before = zadds()
        assert where(w1, job(prompt), prompt).why == "alone"
        w1.ran_here(job(prompt), prompt)
        return zadds() - before

    import msgspec

    try:
        feed.apply([b"", (0).to_bytes(8, "big"), msgspec.msgpack.encode(
            [time.time(), [stored(None, [1, 2, 3, 4], ids)], None])])
        assert sync_r.zscore(w1.index.key(held[1]), "w1-engine") is not None
        assert claimed(ids) == 0  # written by the events just now
        assert claimed(list(range(500, 500 + 4 * BLOCK))) == 0  # nobody holds it: nothing to refresh
        later[0] = 600 * 0.25
        assert claimed(ids) == 2
        assert claimed(ids) == 0
        feed.apply([b"", (1).to_bytes(8, "big"), msgspec.msgpack.encode(
            [time.time(), [{"type": "BlockRemoved", "block_hashes": [4], "medium": "GPU"}], None])])
        later[0] = 600 * 0.6
        assert claimed(ids) == 1
        assert sync_r.zscore(w1.index.key(held[1]), "w1-engine") is None
    finally:
        feed.stop()


def test_an_index_without_events_forgets_writes_old_enough_to_refresh(own_redis, sync_r, monkeypatch) -> None:
    """Writes mode remembers when it wrote each entry (to skip a refresh within a quarter of the TTL),
    bounded: past the bound it forgets the entries a refresh would write anyway."""
    monkeypatch.setattr(prefix_index, "WRITTEN_MAX", 10)
    index = PrefixIndex(sync_r, MODEL, ttl_s=600)
    later = [0.0]
    index.clock = lambda: later[0]
    index.hold("e", [f"h{i}" for i in range(8)])
    index.hold("e", [f"h{i}" for i in range(8)])  # just written: not sent again
    assert len(index._written) == 8
    later[0] = 200.0
    index.hold("e", [f"g{i}" for i in range(8)])
    assert sorted(h for _, h in index._written) == sorted(f"g{i}" for i in range(8))


def test_an_only_worker_takes_its_load_out_and_writes_it_again_when_another_joins(own_redis, sync_r) -> None:
    """Nobody reads the load of a model's only worker: it takes its entry out (a joiner reads its
    heartbeat instead) and writes it again once its view sees another worker."""
    w1 = worker(own_redis, "w1")
    sync_r.hset(keys.worker_loads(MODEL), "w1", 7)  # from before it was alone
    w1.publish_load(3)
    assert sync_r.hget(keys.worker_loads(MODEL), "w1") is None
    beat(sync_r, "w2")
    w1.view.invalidate()
    w1.publish_load(5)
    assert sync_r.hget(keys.worker_loads(MODEL), "w1") == "5"
