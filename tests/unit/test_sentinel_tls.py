"""Redis Sentinel over TLS: a TLS-only master (with a password), its TLS replica and a TLS-only
Sentinel with a password of its own, certificates from a throwaway CA that every client checks
(``rediss://...?ssl_ca_certs=CA``, hostname included). Every client inferq makes from the settings
finds the master through the Sentinel and speaks TLS to both: the asyncio client (a Lua script of
the job store), the thread client, ``inferq up``'s check, the gateway's pub/sub reader and Celery's
broker (kombu's Sentinel transport); then the master is SIGKILLed and they all go on with the
promoted replica, over TLS too. Then servers that ask clients for a certificate (Redis' default) and
a certificate that does not name the servers' address: the URL's client certificate and
``ssl_check_hostname=false`` reach every client too, the gateway's pub/sub reader included.

Skipped only where redis-server was built without TLS."""

from __future__ import annotations

import asyncio
import datetime
import functools
import ipaddress
import shutil
import signal
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
import redis
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from kombu.message import Message
from redis.sentinel import MasterNotFoundError

from inferq.api.pubsub import Subscriber
from inferq.cli.procs import RedisProc, RedisTls, redis_pings, start_redis
from inferq.shared import keys
from inferq.shared.celery_app import make_celery
from inferq.shared.redis import (
    TRANSIENT,
    RedisTarget,
    listen,
    make_redis,
    make_sync_redis,
    master_address,
    retried,
)
from inferq.shared.schemas import JobRecord, JobRequest
from inferq.shared.settings import Settings
from inferq.shared.store import JobStore
from tests.procs import free_port, start_sentinel
from tests.wait import eventually, eventually_async

MASTER = "inferq-tls"
PASSWORD = "data p@ss"  # the data servers' (URL-quoted in INFERQ_REDIS_URL)
SENTINEL_PASSWORD = "sentinel-pass"


@functools.cache
def no_tls() -> str | None:
    """Why redis-server cannot serve TLS (None: it can). Told to listen nowhere, a build with TLS
    exits saying so; one without it refuses the ``tls-port`` option (Redis 7.0: a bad directive)."""
    try:
        out = subprocess.run([shutil.which("redis-server") or "redis-server", "--port", "0", "--tls-port", "0",
                              "--save", "", "--appendonly", "no"], capture_output=True, text=True, timeout=10)
    except subprocess.TimeoutExpired:
        return None  # it started: it took the option
    text = out.stdout + out.stderr
    return f"redis-server has no TLS: {text.strip()[-300:]}" if "tls" in text.lower() else None


def make_certificates(folder: Path, *, names_address: bool = True, client_certificates: bool = False) -> RedisTls:
    """A throwaway CA and one certificate it signed, for every server and, with
    ``client_certificates``, every client too. ``names_address``: the certificate names 127.0.0.1,
    where the Sentinels say the servers are (else only ``redis.example``, which no client checks
    for: ``ssl_check_hostname=false``)."""
    now = datetime.datetime.now(datetime.UTC)
    valid = {"not_valid_before": now - datetime.timedelta(hours=1), "not_valid_after": now + datetime.timedelta(days=1)}
    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "inferq test CA")])
    ca = (x509.CertificateBuilder(**valid).subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
          .serial_number(x509.random_serial_number())
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                       content_commitment=False, key_encipherment=False, data_encipherment=False,
                                       key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
          .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
          .sign(ca_key, hashes.SHA256()))
    names: list[x509.GeneralName] = [x509.DNSName("redis.example")]
    if names_address:
        names += [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
    cert = (x509.CertificateBuilder(**valid)
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "redis.example")]))
            .issuer_name(ca_name).public_key(key.public_key()).serial_number(x509.random_serial_number())
            .add_extension(x509.SubjectAlternativeName(names), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            # a client's too: the servers' links to each other (a replica to its master, the
            # Sentinel to the servers) show it, and so do the clients asked for one
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]),
                           critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
            .sign(ca_key, hashes.SHA256()))
    tls = RedisTls(cert=folder / "redis.crt", key=folder / "redis.key", ca=folder / "ca.crt",
                   client_certificates=client_certificates, names_address=names_address)
    tls.ca.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    tls.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    tls.key.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                          serialization.NoEncryption()))
    return tls


def settings_for(tls: RedisTls, *sentinels: RedisProc, down: int | None = None) -> Settings:
    """inferq's settings: the Sentinels (after one that is ``down``, if given), the data's database
    and password, and TLS as ``tls``'s clients speak it."""
    addresses = ([f"127.0.0.1:{down}"] if down else []) + [f"127.0.0.1:{s.port}" for s in sentinels]
    url = f"rediss://:{quote(PASSWORD, safe='')}@ignored.invalid:1/3?{tls.query()}&ssl_cert_reqs=required"
    return Settings(redis_url=url, redis_sentinels=",".join(addresses), redis_sentinel_master=MASTER,
                    redis_sentinel_password=SENTINEL_PASSWORD, served_model_name="sentinel-tls-m")


def direct(server: RedisProc) -> redis.Redis:
    """A client of ``server`` itself (no Sentinel), on the settings' database."""
    return redis.Redis.from_url(server.url.replace("/0?", "/3?", 1), decode_responses=True)


@dataclass
class Topology:
    master: RedisProc
    replica: RedisProc
    sentinel: RedisProc
    settings: Settings

    def fail_over(self) -> None:
        """SIGKILL the master; the Sentinel promotes the replica once the master missed a second of pings."""
        with redis.Redis.from_url(self.sentinel.url) as s:
            s.sentinel_set(MASTER, "down-after-milliseconds", 1000)
            s.sentinel_set(MASTER, "failover-timeout", 3000)
        self.master.stop(signal.SIGKILL)

    def promoted(self) -> bool:
        """The Sentinel names the replica as the master, the failover over."""
        with redis.Redis.from_url(self.sentinel.url, decode_responses=True) as s:
            m = s.sentinel_master(MASTER)
        return (m["ip"], m["port"], m["flags"]) == ("127.0.0.1", self.replica.port, "master")


@pytest.fixture
def topology(tmp_path: Path) -> Iterator[Topology]:
    if (reason := no_tls()) is not None:
        pytest.skip(reason)
    tls = make_certificates(tmp_path)
    master = start_redis(free_port(), tmp_path, name="master", tls=tls, password=PASSWORD)
    started = [master]
    try:
        with direct(master) as m:
            m.config_set("repl-diskless-sync-delay", 0)  # the replica's first sync at once, not 5 s later
        replica = start_redis(free_port(), tmp_path, name="replica", replica_of=master.port, tls=tls,
                              password=PASSWORD)
        started.append(replica)
        with direct(replica) as r:
            eventually(lambda: r.info("replication").get("master_link_status"), 10, "the replica in sync over TLS",
                       until=lambda s: s == "up", procs=started)
        # no failover until the test kills the master: a machine so busy that the master misses a
        # second of pings must not start one sooner (the test sets 1 s before the kill)
        sentinel = start_sentinel(free_port(), tmp_path, master.port, master=MASTER, quorum=1, down_after_ms=60_000,
                                  tls=tls, password=SENTINEL_PASSWORD, master_password=PASSWORD)
        started.append(sentinel)
        with redis.Redis.from_url(sentinel.url, decode_responses=True) as s:
            # a Sentinel whose timer fell 2 s behind (a busy machine) does nothing for its "TILT"
            # period: 1 s here, not 30
            s.execute_command("SENTINEL", "DEBUG", "tilt-period", 1000)
            eventually(lambda: s.sentinel_master(MASTER), 10, "the Sentinel to see the replica",
                       until=lambda m: m["num-slaves"] >= 1, procs=started)
        # the first Sentinel is one that is down (nothing listens there): every client must go on
        yield Topology(master, replica, sentinel, settings_for(tls, sentinel, down=free_port()))
    finally:
        for p in started:
            p.stop(signal.SIGKILL)


class Celery:
    """Celery's app as the gateway and the workers build it from the settings."""

    def __init__(self, settings: Settings) -> None:
        self.app, self.queue = make_celery(settings), keys.queue(settings.served_model_name)

    def send(self, payload: str) -> None:
        self.app.send_task(keys.TASK_NAME, args=[payload], task_id=payload, queue=self.queue, priority=5)

    def receive(self) -> str:
        """The next task's payload, consumed as a worker consumes (BRPOP on kombu's asynchronous
        connection pool), and acknowledged."""
        got: list[str] = []

        def take(body: Any, message: Message) -> None:
            got.append(body[0][0])
            message.ack()

        with self.app.connection_for_read() as conn, \
                conn.Consumer(self.app.amqp.queues[self.queue], callbacks=[take], accept=["json"]):
            # drain_events raises TimeoutError (an OSError: TRANSIENT) after a second with nothing
            eventually(lambda: conn.drain_events(timeout=1) or got, 20, "a task", ignore=TRANSIENT)
        return got[0]


async def test_every_client_speaks_tls_to_the_sentinels_and_the_master(topology: Topology) -> None:
    s = topology.settings
    # a Sentinel has a second to answer, TLS handshake included: on a busy machine, ask again
    assert await eventually_async(lambda: master_address(s), 10, "the master's address", ignore=TRANSIENT) == \
        ("127.0.0.1", topology.master.port)
    eventually(lambda: redis_pings(s), 10, "inferq up's check through the Sentinels")
    r, sync = make_redis(s), make_sync_redis(s, decode_responses=True)
    store = JobStore(r, 600)
    celery = Celery(s)
    got: list[str] = []
    seen: list[str] = []

    async def handle(data: str) -> None:
        seen.append(data)

    sub = Subscriber(s, lambda _channel, data: got.append(data), lambda _channel: None)
    listener = asyncio.create_task(listen(r, "tls-test", handle, retry_s=0.05))
    try:
        # every client on the master, over TLS (its only port), through the Sentinel (TLS only too)
        await sub.start()
        await sub.subscribe("tls-test")
        await eventually_async(lambda: r.pubsub_numsub("tls-test"), 10, "both readers subscribed",
                               until=lambda n: n[0][1] == 2)
        job = JobRecord(id="job-tls", model="m", request=JobRequest(prompt="p"))
        await store.create(job)  # a Lua script
        assert (await store.get(job.id)) is not None
        assert sync.set("sync", "before") and sync.get("sync") == "before"
        await asyncio.to_thread(celery.send, "before")
        assert await asyncio.to_thread(celery.receive) == "before"
        await r.publish("tls-test", "before")
        await eventually_async(lambda: got and seen, 10, "the message through both readers")
        assert got == seen == ["before"]
        with direct(topology.master) as master:
            assert master.get("sync") == "before" and master.exists(keys.job(job.id)) == 1
            eventually(lambda: master.execute_command("WAIT", 1, 1000), 20, "the writes on the replica",
                       until=lambda n: n == 1)  # before the master dies

        # the master SIGKILLed: the same clients go on with the promoted replica, over TLS
        topology.fail_over()
        await eventually_async(lambda: asyncio.to_thread(topology.promoted), 30, "the Sentinel to promote the replica",
                               interval=0.1)
        assert await eventually_async(lambda: master_address(s), 10, "the new master's address",
                                      ignore=TRANSIENT) == ("127.0.0.1", topology.replica.port)
        claim = await retried(lambda: store.claim(job.id, "w1"))  # the script loaded again (NOSCRIPT)
        assert claim is not None and claim.attempt == 1 and (await store.get(job.id)).worker == "w1"
        assert eventually(lambda: sync.set("sync", "after"), 10, "the thread's client on the new master",
                          ignore=TRANSIENT)
        await asyncio.to_thread(celery.send, "after")
        assert await asyncio.to_thread(celery.receive) == "after"
        with direct(topology.replica) as new:
            assert new.execute_command("ROLE")[0] == "master" and new.get("sync") == "after"
        await eventually_async(lambda: r.pubsub_numsub("tls-test"), 30, "both readers subscribed again",
                               until=lambda n: n[0][1] == 2, ignore=TRANSIENT)
        await r.publish("tls-test", "after")
        await eventually_async(lambda: len(got) == len(seen) == 2, 10, "the message through both readers")
        assert got == seen == ["before", "after"]
    finally:
        listener.cancel()
        await sub.stop()
        sync.close()
        await r.aclose()


def command(*parts: str) -> bytes:
    """A Redis command as the protocol (RESP) sends it."""
    return b"*%d\r\n" % len(parts) + b"".join(b"$%d\r\n%s\r\n" % (len(p.encode()), p.encode()) for p in parts)


@pytest.fixture(scope="module")
def client_certificates(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Settings]:
    """A TLS master and Sentinel that ask every client for a certificate (Redis' default), with a
    certificate that does not name the address the Sentinel gives: the settings carry a client
    certificate and ``ssl_check_hostname=false``."""
    if (reason := no_tls()) is not None:
        pytest.skip(reason)
    folder = tmp_path_factory.mktemp("tls-client-certificates")
    tls = make_certificates(folder, names_address=False, client_certificates=True)
    master = start_redis(free_port(), folder, name="master", tls=tls, password=PASSWORD)
    try:
        sentinel = start_sentinel(free_port(), folder, master.port, master=MASTER, quorum=1, down_after_ms=60_000,
                                  tls=tls, password=SENTINEL_PASSWORD, master_password=PASSWORD)
        try:
            yield settings_for(tls, sentinel)
        finally:
            sentinel.stop(signal.SIGKILL)
    finally:
        master.stop(signal.SIGKILL)


async def test_client_certificates_and_no_name_check_reach_every_client(client_certificates: Settings) -> None:
    """The URL's other ``ssl_*`` options (here a client certificate and key, no name check) go to
    the Sentinels and the master alike, in every client built from the settings."""
    s = client_certificates
    eventually(lambda: redis_pings(s), 10, "inferq up's check through the Sentinels")
    r, sync = make_redis(s), make_sync_redis(s, decode_responses=True)
    try:
        await JobStore(r, 600).create(JobRecord(id="job-mtls", model="m", request=JobRequest(prompt="p")))
        assert sync.exists(keys.job("job-mtls")) == 1
    finally:
        sync.close()
        await r.aclose()
    celery = Celery(s)
    await asyncio.to_thread(celery.send, "mtls")
    assert await asyncio.to_thread(celery.receive) == "mtls"
    # a connection opened by hand, as the gateway's pub/sub reader opens its own
    address = await eventually_async(lambda: master_address(s), 10, "the master's address", ignore=TRANSIENT)
    reader, writer = await asyncio.open_connection(*address, ssl=RedisTarget.of(s).ssl_context())
    try:
        writer.write(command("AUTH", PASSWORD) + command("PING"))
        assert [await reader.readline() for _ in range(2)] == [b"+OK\r\n", b"+PONG\r\n"]
    finally:
        writer.close()
        await writer.wait_closed()
    assert RedisTarget("redis://127.0.0.1:1/0").ssl_context() is None  # no TLS


async def test_the_gateways_pubsub_reader_takes_every_ssl_option(client_certificates: Settings) -> None:
    sub = Subscriber(client_certificates, lambda _channel, _data: None, lambda _channel: None)
    try:
        # its own connect (Subscriber.start tries again and again, quietly); the Sentinel asked
        # again if it was slow to answer, not when TLS fails (an OSError)
        _, writer = await eventually_async(sub._connect, 10, "the pub/sub connection", ignore=(MasterNotFoundError,))
        writer.close()
        await writer.wait_closed()
    finally:
        await sub.stop()
