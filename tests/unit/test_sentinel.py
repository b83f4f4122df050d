"""Redis Sentinel: the clients inferq makes (asyncio and threads, Lua scripts, the gateway's pub/sub
reader, Celery's broker) find the master through the Sentinels and ride through a failover: a real
master, its replica and a Sentinel, the master SIGKILLed, the replica promoted.

The Sentinels' list starts with one that does not answer, as a Sentinel that is down would: every
client must go on to the next."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis

from inferq.api.pubsub import Subscriber
from inferq.cli import launcher
from inferq.cli.procs import RedisProc, redis_pings, start_redis
from inferq.shared import keys
from inferq.shared.celery_app import broker, make_celery
from inferq.shared.redis import TRANSIENT, listen, make_redis, make_sync_redis, master_address, retried
from inferq.shared.schemas import JobRecord, JobRequest
from inferq.shared.settings import Settings
from inferq.shared.store import JobStore
from tests.procs import free_port, start_sentinel
from tests.wait import eventually, eventually_async

MASTER = "inferq"


@dataclass
class Topology:
    master: RedisProc
    replica: RedisProc
    sentinel: RedisProc
    settings: Settings

    def promoted(self) -> bool:
        """The Sentinel names the replica as the master, the failover over (SENTINEL MASTERS, which
        clients read: it names the old master until the failover ends, GET-MASTER-ADDR-BY-NAME the
        promoted replica from the moment it is chosen)."""
        with redis.Redis(port=self.sentinel.port, decode_responses=True) as s:
            m = s.sentinel_master(MASTER)
        return (m["ip"], m["port"], m["flags"]) == ("127.0.0.1", self.replica.port, "master")

    def fail_over(self) -> None:
        """SIGKILL the master and wait until the Sentinel has promoted the replica."""
        self.master.stop(signal.SIGKILL)
        eventually(self.promoted, 30, "the Sentinel to promote the replica", interval=0.1)


@pytest.fixture
def topology(tmp_path: Path) -> Iterator[Topology]:
    master = start_redis(free_port(), tmp_path, name="master")
    started = [master]
    try:
        replica = start_redis(free_port(), tmp_path, name="replica", replica_of=master.port)
        started.append(replica)
        eventually(lambda: redis.Redis(port=replica.port).info("replication").get("master_link_status"), 10,
                   "the replica in sync", until=lambda s: s == "up")
        sentinel = start_sentinel(free_port(), tmp_path, master.port, master=MASTER, quorum=1, down_after_ms=1000)
        started.append(sentinel)
        with redis.Redis(port=sentinel.port, decode_responses=True) as s:
            # a Sentinel whose timer fell 2 s behind (a busy machine) does nothing for its "TILT"
            # period: 1 s here, not 30 (a failover test on a loaded machine waited it out and failed)
            s.execute_command("SENTINEL", "DEBUG", "tilt-period", 1000)
            eventually(lambda: s.sentinel_master(MASTER), 10, "the Sentinel to see the replica",
                       until=lambda m: m["num-slaves"] >= 1)
        down = free_port()  # nothing listens there: a Sentinel that is down, first in the list
        settings = Settings(redis_url="redis://ignored.invalid:1/3", redis_sentinel_master=MASTER,
                            redis_sentinels=f"127.0.0.1:{down},127.0.0.1:{sentinel.port}")
        yield Topology(master, replica, sentinel, settings)
    finally:
        for p in started:
            p.stop(signal.SIGKILL)


class Celery:
    """Celery's app as the gateway and the workers build it from the settings, on a queue of its own."""

    def __init__(self, settings: Settings) -> None:
        self.app, self.queue = make_celery(settings), keys.queue("sentinel-m")

    def send(self, payload: str) -> None:
        self.app.send_task(keys.TASK_NAME, args=[payload], task_id=payload, queue=self.queue, priority=5)

    def receive(self) -> str:
        with self.app.connection_for_read() as conn:
            msg = eventually(lambda: conn.default_channel.basic_get(self.queue, no_ack=True), 10, "a task")
        return str(msg.decode()[0][0])


async def test_every_client_rides_through_a_failover(topology: Topology) -> None:
    s = topology.settings
    assert redis_pings(s) and await master_address(s) == ("127.0.0.1", topology.master.port)
    r, sync = make_redis(s), make_sync_redis(s, decode_responses=True)
    store = JobStore(r, 600)
    celery = Celery(s.model_copy(update={"served_model_name": "sentinel-m"}))
    got: list[str] = []
    seen: list[str] = []

    async def handle(data: str) -> None:
        seen.append(data)

    sub = Subscriber(s, lambda _channel, data: got.append(data), lambda _channel: None)
    listener = asyncio.create_task(listen(r, "sentinel-test", handle, retry_s=0.05))
    new = redis.Redis(port=topology.replica.port, db=3, decode_responses=True)  # the URL's database
    try:
        await sub.start()
        await sub.subscribe("sentinel-test")
        await eventually_async(lambda: r.pubsub_numsub("sentinel-test"), 10, "both readers subscribed",
                               until=lambda n: n[0][1] == 2)
        first = JobRecord(id="job-before", model="m", request=JobRequest(prompt="p"))
        await store.create(first)  # a Lua script, loaded on the master
        sync.set("sync", "before")
        await asyncio.to_thread(celery.send, "before")
        assert await asyncio.to_thread(celery.receive) == "before"
        await asyncio.to_thread(celery.send, "waits")
        assert await r.llen(keys.priority_lists(celery.queue)[5]) == 1
        assert await r.execute_command("WAIT", 1, 5000) == 1  # on the replica before the master dies

        writes = 0

        async def keep_writing() -> None:
            nonlocal writes
            while not topology.promoted():
                await retried(lambda: r.incr("writes"), seconds=30)  # no error may escape the budget
                writes += 1
                await asyncio.sleep(0.02)

        writer = asyncio.create_task(keep_writing())
        await asyncio.to_thread(topology.fail_over)
        await writer

        # the same clients, now on the new master
        assert new.execute_command("ROLE")[0] == "master"
        assert writes and await retried(lambda: r.incr("writes")) == int(new.get("writes"))
        assert not new.script_exists(store._claim.sha)[0], \
            "the new master starts without the scripts: the next call must load them (NOSCRIPT)"
        claim = await retried(lambda: store.claim(first.id, "w1"))
        assert claim is not None and claim.attempt == 1 and (await store.get(first.id)).worker == "w1"
        assert eventually(lambda: sync.set("sync", "after"), 10, "the thread's client on the new master",
                          ignore=TRANSIENT)
        assert new.get("sync") == "after"
        await asyncio.to_thread(celery.send, "after")  # kombu asks the Sentinels again
        assert [await asyncio.to_thread(celery.receive) for _ in range(2)] == ["waits", "after"]

        # the pub/sub readers subscribed again, on the new master
        await eventually_async(lambda: r.pubsub_numsub("sentinel-test"), 30, "both readers subscribed again",
                               until=lambda n: n[0][1] == 2, ignore=TRANSIENT)
        await r.publish("sentinel-test", "after the failover")
        await eventually_async(lambda: got and seen, 10, "the message through both readers")
        assert got == seen == ["after the failover"]
    finally:
        listener.cancel()
        await sub.stop()
        sync.close()
        new.close()
        await r.aclose()


def test_settings_name_the_sentinels_for_every_client() -> None:
    """INFERQ_REDIS_SENTINELS and its family: parsed, required together, and turned into kombu's
    Sentinel transport with the URL's database and password in each Sentinel's URL."""
    s = Settings(redis_url="redis://:p%40ss@ignored:1/2", redis_sentinels=" s1:26380, [::1] ,s3",
                 redis_sentinel_master="mm", redis_sentinel_password="sp")
    assert s.sentinel_addresses == [("s1", 26380), ("::1", 26379), ("s3", 26379)]
    url, options, use_ssl = broker(s)
    assert url == "sentinel://:p%40ss@s1:26380/2;sentinel://:p%40ss@[::1]:26379/2;sentinel://:p%40ss@s3:26379/2"
    assert options["master_name"] == "mm" and options["sentinel_kwargs"]["password"] == "sp" and use_ssl is None
    conn = make_celery(s).connection_for_write()
    assert (conn.transport_cls, conn.virtual_host, conn.password) == ("sentinel", "2", "p@ss")
    tls = s.model_copy(update={"redis_url": "rediss://ignored:1/0?ssl_cert_reqs=none"})
    _, options, use_ssl = broker(tls)
    assert use_ssl == {"ssl_cert_reqs": "none"} and options["sentinel_kwargs"]["ssl"] is True
    assert broker(Settings(redis_url="redis://h:1/0")) == ("redis://h:1/0", {}, None)  # no Sentinel: as before
    for bad in ({"redis_sentinels": "s1:x", "redis_sentinel_master": "mm"}, {"redis_sentinels": "s1:26379"}):
        with pytest.raises(ValueError, match="INFERQ_REDIS_SENTINEL"):
            Settings(**bad)


async def test_a_master_demoted_under_a_kept_connection_is_retried(tmp_path: Path) -> None:
    """A master made a replica while a client keeps its connection (a failover behind one address,
    as a managed Redis's endpoint does it) answers writes with READONLY: the client drops that
    connection and tries again, and the write goes through once the address leads to a master."""
    a, b = start_redis(free_port(), tmp_path, name="a"), start_redis(free_port(), tmp_path, name="b")
    r = make_redis(a.url)
    try:
        await r.set("k", "v")  # the pool keeps this connection
        await r.replicaof("127.0.0.1", b.port)
        write = asyncio.create_task(retried(lambda: r.set("k", "after"), seconds=30))
        with redis.Redis(port=a.port) as direct:
            await eventually_async(lambda: direct.info("errorstats").get("errorstat_READONLY", {}).get("count", 0),
                                   10, "writes refused with READONLY", until=lambda n: n >= 2)
            assert not write.done()  # refused more than once, and still trying
            direct.replicaof("NO", "ONE")
        assert await write is True and await r.get("k") == "after"
    finally:
        await r.aclose()
        a.stop(signal.SIGKILL)
        b.stop(signal.SIGKILL)


def test_inferq_up_asks_the_sentinels_and_starts_no_redis_of_its_own(tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    s = Settings(cache_dir=tmp_path, redis_url="redis://:secret@ignored.invalid:1/0", redis_sentinel_master="mm",
                 redis_sentinels=f"127.0.0.1:{free_port()}")
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        assert launcher.up(s) == 1
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
    out = capsys.readouterr().out
    assert "Redis at master 'mm' of Sentinels 127.0.0.1:" in out and "does not answer" in out
    assert "secret" not in out and "redis  " not in out  # nothing started
