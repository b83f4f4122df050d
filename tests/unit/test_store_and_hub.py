"""Job state transitions and lossless event delivery, against a real redis-server."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest

from inferq.api.streams import StreamHub
from inferq.shared import keys
from inferq.shared.errors import NotFound
from inferq.shared.redis import make_redis
from inferq.shared.schemas import DoneEvent, JobRecord, JobRequest, JobStatus, TokenEvent
from inferq.shared.store import JobStore, is_duplicate_id
from tests.wait import eventually_async


@pytest.fixture
async def store(unit_redis):
    r = make_redis(unit_redis.url)
    yield JobStore(r, ttl_s=120)
    await r.aclose()


async def new_job(store: JobStore) -> str:
    rec = JobRecord(id=f"job-{uuid.uuid4().hex}", model="m", request=JobRequest(prompt="p"))
    await store.create(rec)
    return rec.id


async def test_claim_then_cancel_flags_the_running_job(store) -> None:
    job = await new_job(store)
    claim = await store.claim(job, "w1")
    assert (claim.previous, claim.attempt, claim.last_seq) == (JobStatus.queued, 1, 0)
    assert (await store.claim(job, "w2")).previous is JobStatus.running  # a second claim does not take it
    assert await store.request_cancel(job) is JobStatus.running
    rec = await store.get(job)
    assert rec.status is JobStatus.running and rec.cancel_requested and rec.worker == "w1"


async def test_a_claim_retried_with_its_token_is_still_won(store) -> None:
    """A claim whose answer was lost (a Redis timeout) and is sent again with the same token gets
    the job it took; another token, or none, does not."""
    job = await new_job(store)
    first = await store.claim(job, "w1", "t1")
    again = await store.claim(job, "w1", "t1")
    assert (again.previous, again.attempt) == (first.previous, first.attempt) == (JobStatus.queued, 1)
    assert (await store.claim(job, "w1", "t2")).previous is JobStatus.running
    assert (await store.claim(job, "w1")).previous is JobStatus.running
    rec = await store.get(job)
    assert rec.status is JobStatus.running and rec.attempt == 1 and rec.worker == "w1"


async def test_cancel_before_claim_wins_and_logs_one_event(store) -> None:
    job = await new_job(store)
    assert await store.request_cancel(job) is JobStatus.queued
    assert (await store.claim(job, "w1")).previous is JobStatus.cancelled
    log = await store.read_log(job)
    assert len(log) == 1 and log[0].type == "done" and log[0].status is JobStatus.cancelled
    assert 0 < await store.redis.ttl(keys.job_log(job)) <= 120


async def test_finish_only_writes_a_running_job_of_its_attempt(store) -> None:
    job = await new_job(store)
    done = DoneEvent(seq=1, finish_reason="stop")
    assert not await store.finish(job, "w", 1, done, status=JobStatus.succeeded)
    await store.claim(job, "w")
    assert not await store.finish(job, "w", 2, done, status=JobStatus.succeeded)  # not its attempt
    assert await store.finish(job, "w", 1, done, status=JobStatus.succeeded)
    assert not await store.finish(job, "w", 1, done, status=JobStatus.failed)
    assert (await store.get(job)).status is JobStatus.succeeded
    assert [e.type for e in await store.read_log(job)] == ["done"]
    assert not await store.redis.sismember(keys.worker_jobs("w"), job)


async def test_log_refuses_a_seq_it_already_has_and_a_stale_attempt(store) -> None:
    job = await new_job(store)
    await store.claim(job, "w")
    res = await store.append([(job, 1, TokenEvent(seq=1, text="a")), (job, 1, TokenEvent(seq=2, text="b")),
                              (job, 1, TokenEvent(seq=2, text="dup")), (job, 1, TokenEvent(seq=1, text="old")),
                              (job, 7, TokenEvent(seq=3, text="stale"))])
    assert res[:2] == [True, True] and all(is_duplicate_id(e) for e in res[2:4]) and res[4] is False
    assert [e.text for e in await store.read_log(job)] == ["a", "b"]
    assert [e.seq for e in await store.read_log(job, after=1)] == [2]


async def test_append_spans_chunks_in_order_and_survives_a_flushed_script_cache(store, monkeypatch) -> None:
    """Events of one job across several script calls land in order, in one round trip; a Redis
    that lost its scripts (restarted, SCRIPT FLUSH) has the script loaded again and the batch sent."""
    import inferq.shared.store as store_mod

    monkeypatch.setattr(store_mod, "APPEND_CHUNK", 2)
    job = await new_job(store)
    await store.claim(job, "w")
    await store.redis.script_flush()
    calls: list[object] = []
    execute = type(store.redis.pipeline()).execute

    async def counted(self, *a, **kw):
        calls.append(list(self.command_stack))
        return await execute(self, *a, **kw)

    monkeypatch.setattr(type(store.redis.pipeline()), "execute", counted)
    res = await store.append([(job, 1, TokenEvent(seq=i, text=str(i))) for i in range(1, 6)])
    assert res == [True] * 5
    assert [e.text for e in await store.read_log(job)] == ["1", "2", "3", "4", "5"]
    assert len(calls) == 2 and len(calls[0]) == 3  # NOSCRIPT, then the same 3 calls again; no SCRIPT EXISTS
    calls.clear()
    exists = lambda stats: stats.get("cmdstat_script|exists", {}).get("calls", 0)  # noqa: E731
    before = exists(await store.redis.info("commandstats"))
    assert await store.append([(job, 1, TokenEvent(seq=6, text="6"))]) == [True]
    assert len(calls) == 1 and exists(await store.redis.info("commandstats")) == before


async def test_requeue_restarts_then_gives_up(store) -> None:
    job = await new_job(store)
    for attempt in (1, 2):
        claim = await store.claim(job, "w")
        assert claim.attempt == attempt
        await store.append([(job, attempt, TokenEvent(seq=claim.last_seq + 1, text="x"))])
        assert await store.requeue(job, "w", None, "worker_lost", max_attempts=3) == "requeued"
        assert (await store.get(job)).status is JobStatus.queued
        # the lost attempt is fenced out
        assert await store.append([(job, attempt, TokenEvent(seq=99, text="late"))]) == [False]
    await store.claim(job, "w")
    assert await store.requeue(job, "other-worker", None, "worker_lost", max_attempts=3) == "skip"
    assert await store.requeue(job, "w", None, "worker_lost", max_attempts=3) == "failed"
    log = await store.read_log(job)
    assert [e.type for e in log] == ["token", "restart", "token", "restart", "error"]
    assert [e.seq for e in log] == [1, 2, 3, 4, 5]
    assert (log[-1].error.type, log[-1].error.code) == ("service_unavailable", "worker_lost")
    rec = await store.get(job)
    assert rec.status is JobStatus.failed and rec.error == log[-1].error


async def test_requeue_of_a_cancel_requested_job_cancels_it(store) -> None:
    job = await new_job(store)
    await store.claim(job, "w")
    await store.request_cancel(job)
    assert await store.requeue(job, "w", 1, "worker_shutdown", max_attempts=3) == "cancelled"
    assert (await store.read_log(job))[-1].status is JobStatus.cancelled


async def collect(hub: StreamHub, job: str, after: int = 0) -> list:
    return [e async for e in hub.events(job, after)]


async def rest(events: AsyncIterator) -> list:
    return [e async for e in events]


async def subscribers(store: JobStore, job: str) -> int:
    """How many connections Redis has subscribed to the job's channel."""
    return dict(await store.redis.pubsub_numsub(keys.job_channel(job)))[keys.job_channel(job)]


@asynccontextmanager
async def running_hub(url: str, store: JobStore, idle_check_s: float = 2.0) -> AsyncIterator[StreamHub]:
    hub = StreamHub(url, store, idle_check_s=idle_check_s)
    await hub.start()
    try:
        yield hub
    finally:
        await hub.stop()


async def claimed_job(store: JobStore) -> str:
    job = await new_job(store)
    await store.claim(job, "w")
    return job


async def test_hub_replays_then_follows_live_exactly_once(store, unit_redis) -> None:
    async with running_hub(unit_redis.url, store, 0.3) as hub:
        job = await claimed_job(store)
        await store.append([(job, 1, TokenEvent(seq=i, text=str(i))) for i in (1, 2, 3)])
        events = hub.events(job, after=1)
        # the first event comes once the subscription is confirmed and the log replayed
        first = await asyncio.wait_for(anext(events), 5)
        assert await subscribers(store, job) == 1
        # live: a duplicate of a logged event, then one that is only published (so it can come
        # from nowhere but the channel), then the end
        channel = keys.job_channel(job)
        await store.redis.publish(channel, TokenEvent(seq=3, text="dup").model_dump_json())
        await store.redis.publish(channel, TokenEvent(seq=4, text="4").model_dump_json())
        # the end, logged behind the store's back (it refuses to log past a hole) and published
        done = DoneEvent(seq=5, finish_reason="stop").model_dump_json()
        await store.redis.xadd(keys.job_log(job), {"e": done}, id="5-0")
        await store.redis.publish(channel, done)
        got = [first, *await asyncio.wait_for(rest(events), 5)]
        assert [(e.seq, getattr(e, "text", None)) for e in got] == [(2, "2"), (3, "3"), (4, "4"), (5, None)]
        assert hub.gaps == 0
        assert hub.channels == 0  # unsubscribed once the last listener left


async def test_hub_fills_a_gap_from_the_log(store, unit_redis) -> None:
    """A reader following live gets an event whose seq skips one (logged, its publish missed):
    it goes back to the log for the missing one."""
    async with running_hub(unit_redis.url, store, 600.0) as hub:  # no idle check: only the gap reads the log
        job = await claimed_job(store)
        events = hub.events(job)
        first = asyncio.ensure_future(anext(events))
        await eventually_async(lambda: subscribers(store, job), 10, "the hub's subscription", interval=0.01)
        # seq 1 reaches the channel before the log: the reader can only have it live, so it is
        # past its replay and following the channel when the next events come
        one = TokenEvent(seq=1, text="a").model_dump_json()
        await store.redis.publish(keys.job_channel(job), one)
        assert (await asyncio.wait_for(first, 5)).seq == 1
        await store.redis.xadd(keys.job_log(job), {"e": one}, id="1-0")
        await store.redis.xadd(keys.job_log(job), {"e": TokenEvent(seq=2, text="silent").model_dump_json()},
                               id="2-0")  # logged, never published
        await store.append([(job, 1, TokenEvent(seq=3, text="c")), (job, 1, DoneEvent(seq=4, finish_reason="stop"))])
        got = await asyncio.wait_for(rest(events), 5)
        assert [(e.seq, getattr(e, "text", None)) for e in got] == [(2, "silent"), (3, "c"), (4, None)]
        assert hub.gaps == 1  # seq 3 showed the gap


async def test_hub_unknown_job_raises_not_found(store, unit_redis) -> None:
    async with running_hub(unit_redis.url, store) as hub:
        with pytest.raises(NotFound):
            await collect(hub, "job-missing")


async def test_hub_after_the_last_event_of_a_finished_job_ends_at_once(store, unit_redis) -> None:
    async with running_hub(unit_redis.url, store, 5.0) as hub:
        job = await claimed_job(store)
        await store.append([(job, 1, TokenEvent(seq=1, text="a"))])
        await store.finish(job, "w", 1, DoneEvent(seq=2, finish_reason="stop"), status=JobStatus.succeeded)
        for after in (2, 9):
            assert await asyncio.wait_for(collect(hub, job, after=after), 2) == []


async def test_hub_resubscribes_after_its_connection_is_killed(store, unit_redis) -> None:
    """Redis drops the hub's pub/sub connection mid-stream: the stream still ends complete."""
    async with running_hub(unit_redis.url, store, 600.0) as hub:
        job = await claimed_job(store)
        events = hub.events(job)
        first = asyncio.ensure_future(anext(events))
        await eventually_async(lambda: subscribers(store, job), 10, "the hub's subscription", interval=0.01)
        await store.append([(job, 1, TokenEvent(seq=1, text="a"))])
        assert (await asyncio.wait_for(first, 5)).seq == 1
        await store.redis.client_kill_filter(_type="pubsub")
        await eventually_async(lambda: subscribers(store, job), 10, "the killed subscription to go",
                               until=lambda n: n == 0, interval=0.01)
        await store.append([(job, 1, TokenEvent(seq=2, text="b"))])  # published while it is down
        await eventually_async(lambda: subscribers(store, job), 10, "the hub to reconnect and subscribe again",
                               interval=0.01)
        await store.append([(job, 1, TokenEvent(seq=3, text="c")), (job, 1, DoneEvent(seq=4, finish_reason="stop"))])
        got = await asyncio.wait_for(rest(events), 10)  # the gap (seq 2) is filled from the log, not the idle check
        assert [e.seq for e in got] == [2, 3, 4]


def test_frame_reads_type_and_seq_of_every_event_form() -> None:
    from inferq.api.frames import frame

    tok = TokenEvent(seq=12, text='a,"b"').model_dump_json(exclude_none=True)
    assert frame(tok)[:2] == ("token", 12)
    assert frame('{"finish_reason":"cancelled","type":"done","status":"cancelled","seq":7}')[:2] == ("done", 7)
    assert frame(DoneEvent(seq=3, finish_reason="stop").model_dump_json()).terminal


async def test_hub_forgets_a_listener_that_leaves_while_subscribing(store, unit_redis) -> None:
    async with running_hub(unit_redis.url, store) as hub:
        job = await claimed_job(store)
        reader = asyncio.create_task(collect(hub, job))
        # registered (its subscribe is under way), seen at the reader's first pause
        await eventually_async(lambda: hub.channels == 1, 10, "the listener", interval=0)
        assert not hub._confirmed[keys.job_channel(job)].is_set()  # no confirmation yet: still subscribing
        reader.cancel()
        with pytest.raises(asyncio.CancelledError):
            await reader
        assert hub.channels == 0 and keys.job_channel(job) not in hub._sub.channels


async def test_subscriber_error_replies_force_a_reconnect_with_backoff(tmp_path) -> None:
    """A Redis that answers with errors (here NOAUTH: no password given) is not taken for a
    working connection; with the password it is."""
    from bench.stack import Proc, free_port
    from inferq.api.pubsub import Subscriber

    port = free_port()
    server = Proc("redis-auth", ["redis-server", "--port", str(port), "--save", "", "--requirepass", "sekrit"],
                  {}, tmp_path / "redis.log")
    try:
        await eventually_async(lambda: _pings(f"redis://:sekrit@127.0.0.1:{port}/0"), 10, "redis-server",
                               interval=0.01)
        sub = Subscriber(f"redis://127.0.0.1:{port}/0", lambda c, d: None, lambda c: None)
        await sub.start()
        try:  # three refused connections in a row: growing waits, not a tight reconnect loop
            await eventually_async(lambda: sub._backoff >= 0.4 or sub.connected.is_set(), 10, "the backoff to grow",
                                   interval=0.01)
            assert not sub.connected.is_set() and sub._backoff >= 0.4
        finally:
            await sub.stop()
        ok = Subscriber(f"redis://:sekrit@127.0.0.1:{port}/0", lambda c, d: None, lambda c: None)
        await ok.start()
        try:
            await asyncio.wait_for(ok.connected.wait(), 3)
        finally:
            await ok.stop()
    finally:
        server.stop()


async def _pings(url: str) -> bool:
    import redis.asyncio as aioredis

    r = aioredis.Redis.from_url(url, socket_connect_timeout=1)
    try:
        return bool(await r.ping())
    except (OSError, aioredis.RedisError):
        return False
    finally:
        await r.aclose()


def test_merged_joins_consecutive_plain_deltas_of_one_completion() -> None:
    from inferq.api.frames import frame, merged
    from inferq.shared.schemas import TokenLogprob

    lp = [TokenLogprob(token="b", logprob=-1.0)]
    evs = [TokenEvent(seq=1, text="a", n_tokens=1), TokenEvent(seq=2, text="b", n_tokens=2),
           TokenEvent(seq=3, index=1, text="x", n_tokens=1), TokenEvent(seq=4, index=1, text="y", logprobs=lp),
           TokenEvent(seq=5, index=1, text="z", n_tokens=1), TokenEvent(seq=6, index=1, text="w", n_tokens=1),
           DoneEvent(seq=7, finish_reason="stop")]
    got = merged([frame(e.model_dump_json(exclude_none=True)) for e in evs])
    assert [(e.seq, getattr(e, "text", None)) for e in got] == [(2, "ab"), (3, "x"), (4, "y"), (6, "zw"), (7, None)]
    assert got[0].event() == TokenEvent(seq=2, text="ab", n_tokens=3) and got[2].logprobs == lp


async def test_hub_batches_what_waited_and_merges_on_request(store, unit_redis) -> None:
    async with running_hub(unit_redis.url, store, 5.0) as hub:
        job = await claimed_job(store)
        await store.append([(job, 1, TokenEvent(seq=i, text=str(i), n_tokens=1)) for i in range(1, 5)])
        it = hub.batches(job)
        assert [f.seq for f in await anext(it)] == [1, 2, 3, 4]  # the log, in one piece
        await store.append([(job, 1, TokenEvent(seq=5, text="5", n_tokens=1)),
                            (job, 1, DoneEvent(seq=6, finish_reason="stop"))])
        rest = [f.seq async for batch in it for f in batch]
        assert rest == [5, 6]
        merged = [e async for e in hub.events(job, merge=True)]
        assert [(e.seq, getattr(e, "text", None)) for e in merged] == [(5, "12345"), (6, None)]


def test_frame_event_equals_the_validated_parse() -> None:
    from inferq.api.frames import frame
    from inferq.shared.schemas import TokenLogprob, parse_event

    for ev in (TokenEvent(seq=3, index=1, text='say "logprobs"', n_tokens=2),
               TokenEvent(seq=4, text="x", logprobs=[TokenLogprob(token="x", logprob=-0.5)]),
               DoneEvent(seq=5, finish_reason="stop")):
        raw = ev.model_dump_json(exclude_none=True)
        assert frame(raw).event() == parse_event(raw) == ev


async def test_update_never_brings_back_a_record_that_is_gone(store) -> None:
    gone = f"job-{uuid.uuid4().hex}"
    assert await store.update(gone, first_token_at=1.0) is False
    assert not await store.redis.exists(keys.job(gone))
    rec = JobRecord(id=f"job-{uuid.uuid4().hex}", model="m", request=JobRequest(prompt="p"))
    await store.create(rec)
    assert await store.update(rec.id, first_token_at=2.5) is True
    assert (await store.get(rec.id)).first_token_at == 2.5


async def test_an_event_carries_the_first_token_time_to_the_record_while_its_attempt_owns_the_job(store) -> None:
    job = await claimed_job(store)
    assert await store.append([(job, 1, TokenEvent(seq=1, text="a"), 12.5), (job, 1, TokenEvent(seq=2, text="b"))]) \
        == [True, True]
    assert (await store.get(job)).first_token_at == 12.5
    assert await store.append([(job, 2, TokenEvent(seq=3, text="c"), 99.0)]) == [False]  # not its attempt
    assert (await store.get(job)).first_token_at == 12.5
