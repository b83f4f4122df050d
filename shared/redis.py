"""Redis client construction, with the same options in every process.

Every client of the gateway and the workers comes from here: :func:`make_redis` (asyncio),
:func:`make_sync_redis` (threads), :func:`master_address` (where the gateway's own pub/sub reader
connects; :meth:`RedisTarget.ssl_context` is TLS as the URL asks for it) and, for Celery,
shared/celery_app.py, all from one :class:`RedisTarget`. With Sentinels (``INFERQ_REDIS_SENTINELS``)
a client asks them for the master each time it opens a connection, so after a failover its next
connection goes to the new master; the errors of the switch (the old master gone, or answering
``READONLY`` as a replica, no master known yet) are :data:`TRANSIENT`.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar, cast
from urllib.parse import urlparse

import redis as sync_redis
import redis.sentinel as sync_sentinel
from redis.asyncio import BlockingConnectionPool, Redis
from redis.asyncio.connection import SSLConnection, parse_url
from redis.asyncio.retry import Retry
from redis.asyncio.sentinel import Sentinel, SentinelConnectionPool
from redis.backoff import ExponentialBackoff, NoBackoff
from redis.connection import HiredisRespSerializer
from redis.exceptions import ConnectionError, ReadOnlyError, TimeoutError
from redis.retry import Retry as SyncRetry
from redis.typing import EncodableT
from tenacity import AsyncRetrying, retry_if_exception_type, stop_after_delay, wait_exponential

from inferq.shared.settings import Settings

T = TypeVar("T")
log = logging.getLogger(__name__)
#: What a Redis restart or failover raises: redis-py's connection errors (a Sentinel's
#: MasterNotFoundError among them), a timeout, a demoted master's READONLY, an OSError from the socket
TRANSIENT = (ConnectionError, TimeoutError, ReadOnlyError, OSError)
#: Seconds a Sentinel may take to answer (or refuse) before the next one in the list is asked
SENTINEL_TIMEOUT_S = 1.0

_PACKER = HiredisRespSerializer()


class _HiredisPacking:
    """Commands packed by hiredis (C), as redis-py's synchronous client packs them when hiredis is
    installed; its asyncio client packs in Python, about 1.8 µs per argument: 15 µs per streamed
    token in a worker's event batches (eight arguments per event), 8x less with hiredis."""

    def pack_command(self, *args: Any) -> list[bytes]:
        packed: list[bytes] = _PACKER.pack(*args)
        return packed

    def pack_commands(self, commands: Iterable[Iterable[Any]]) -> list[bytes]:
        return [b"".join(_PACKER.pack(*c)[0] for c in commands)]


_packing: dict[type, type] = {}


def _hiredis_packing(cls: type) -> type:
    """``cls`` (a TCP, TLS or Unix socket connection class) with :class:`_HiredisPacking`."""
    if cls not in _packing:
        _packing[cls] = type(f"Hiredis{cls.__name__}", (_HiredisPacking, cls), {})
    return _packing[cls]


@dataclass(frozen=True)
class RedisTarget:
    """Where Redis is: ``url`` (its db, user, password and TLS; its host and port unless Sentinels
    are given), and the Sentinels that name the master ``master``, with their own password."""

    url: str
    sentinels: tuple[tuple[str, int], ...] = ()
    master: str = ""
    sentinel_password: str = ""

    @classmethod
    def of(cls, where: Where) -> RedisTarget:
        if isinstance(where, RedisTarget):
            return where
        if isinstance(where, str):
            return cls(where)
        return cls(where.redis_url, tuple(where.sentinel_addresses), where.redis_sentinel_master,
                   where.redis_sentinel_password.get_secret_value())

    @property
    def tls(self) -> bool:
        return urlparse(self.url).scheme == "rediss"

    def connection_kwargs(self) -> dict[str, Any]:
        """The URL's options for a Sentinel-managed connection: no host or port (Sentinel's answer)."""
        o: dict[str, Any] = dict(parse_url(self.url))
        for k in ("host", "port", "path", "connection_class"):
            o.pop(k, None)
        return {**o, "ssl": True} if self.tls else o

    def sentinel_kwargs(self) -> dict[str, Any]:
        """How to speak to a Sentinel: short timeouts and no retry (the next one is asked instead),
        its own password, TLS with the data URL's options when that is rediss://."""
        o: dict[str, Any] = {"socket_timeout": SENTINEL_TIMEOUT_S, "socket_connect_timeout": SENTINEL_TIMEOUT_S}
        if self.sentinel_password:
            o["password"] = self.sentinel_password
        if self.tls:
            o.update(ssl=True, **{k: v for k, v in parse_url(self.url).items() if k.startswith("ssl_")})
        return o

    def ssl_context(self) -> ssl.SSLContext | None:
        """The TLS context redis-py's clients make of the URL's ``ssl_*`` options (None for
        redis://), its defaults included (certificate and name checked), for a connection opened
        by hand, as the gateway's pub/sub reader opens its own (its ``_ssl_context`` takes only
        ``ssl_ca_certs`` and ``ssl_cert_reqs``: no client certificate, no ``ssl_check_hostname``)."""
        if not self.tls:
            return None
        options: dict[str, Any] = {k: v for k, v in parse_url(self.url).items() if k.startswith("ssl_")}
        return SSLConnection(**options).ssl_context.get()

    def __str__(self) -> str:
        if not self.sentinels:
            u = urlparse(self.url)
            return u._replace(netloc=u.netloc.rpartition("@")[2]).geturl()  # no password in logs
        return f"master {self.master!r} of Sentinels " + ",".join(f"{h}:{p}" for h, p in self.sentinels)


#: What names a Redis: a URL, a target, or the settings (INFERQ_REDIS_URL and the Sentinel settings)
Where = str | RedisTarget | Settings


class _BlockingSentinelPool(SentinelConnectionPool, BlockingConnectionPool):
    """redis-py's Sentinel pool that waits for a free connection, as :func:`make_redis`'s does,
    and closes its connections to the Sentinels with itself."""
    async def aclose(self) -> None:
        await super().aclose()
        await self.sentinel_manager.aclose()


def _sentinel(t: RedisTarget) -> Sentinel:
    kw = t.sentinel_kwargs()
    return Sentinel(list(t.sentinels), sentinel_kwargs={**kw, "retry": Retry(NoBackoff(), 0)})


def make_redis(where: Where, *, max_connections: int = 64, health_check_interval: int = 15) -> Redis:
    """An asyncio client that decodes to str, retries dropped connections (each new connection
    asks the Sentinels, if any, for the master), and waits for a free connection instead of
    failing when all ``max_connections`` are busy."""
    t = RedisTarget.of(where)
    options: dict[str, Any] = {
        "decode_responses": True, "max_connections": max_connections, "timeout": 30,
        "health_check_interval": health_check_interval, "socket_keepalive": True,
        "retry": Retry(ExponentialBackoff(cap=2.0, base=0.05), retries=5),
        # READONLY: a master demoted under a kept connection; the connection is dropped and made anew
        "retry_on_error": [ConnectionError, TimeoutError, ReadOnlyError],
    }
    if t.sentinels:
        # redis-py leaves SentinelConnectionPool.__init__ unannotated
        pool: BlockingConnectionPool = _BlockingSentinelPool(  # type: ignore[no-untyped-call]
            t.master, _sentinel(t), **t.connection_kwargs(), **options)
    else:
        pool = BlockingConnectionPool.from_url(t.url, **options)
    pool.connection_class = _hiredis_packing(pool.connection_class)
    return Redis(connection_pool=pool)


def make_sync_redis(where: Where, **options: Any) -> sync_redis.Redis:
    """A synchronous client (for threads), through the Sentinels when there are some; ``options``
    as redis-py's (``decode_responses``, ``socket_timeout``, ``max_connections``...)."""
    t = RedisTarget.of(where)
    options = {"retry": SyncRetry(ExponentialBackoff(cap=2.0, base=0.05), 3),
               "retry_on_error": [ConnectionError, TimeoutError, ReadOnlyError], **options}
    if not t.sentinels:
        return sync_redis.Redis.from_url(t.url, **options)
    sentinels = sync_sentinel.Sentinel(list(t.sentinels), sentinel_kwargs={
        **t.sentinel_kwargs(), "retry": SyncRetry(NoBackoff(), 0)})
    master: sync_redis.Redis = sentinels.master_for(t.master, **t.connection_kwargs(), **options)
    return master


async def master_address(where: Where, sentinel: Sentinel | None = None) -> tuple[str, int]:
    """The master's (host, port): the URL's, or what the Sentinels say now (``sentinel``: one made
    by :func:`sentinel_for`, kept between calls). Raises MasterNotFoundError (transient) when none
    of them names a master that is up."""
    t = RedisTarget.of(where)
    if not t.sentinels:
        o = parse_url(t.url)
        return str(o.get("host", "localhost")), int(o.get("port", 6379))
    if sentinel is not None:
        found: tuple[str, int] = await sentinel.discover_master(t.master)
        return found
    async with _sentinel(t) as s:
        found = await s.discover_master(t.master)
        return found


def sentinel_for(where: Where) -> Sentinel | None:
    """A Sentinel client to pass :func:`master_address` again and again (None: no Sentinels)."""
    t = RedisTarget.of(where)
    return _sentinel(t) if t.sentinels else None


def redis_retrying(seconds: float = 30.0) -> AsyncRetrying:
    """Retry a Redis call through a restart or failover of up to ``seconds``."""
    return AsyncRetrying(
        retry=retry_if_exception_type(TRANSIENT),
        wait=wait_exponential(multiplier=0.05, max=1.0),
        stop=stop_after_delay(seconds),
        reraise=True,
    )


async def retried(call: Callable[[], Awaitable[T]], seconds: float = 30.0) -> T:
    """``await call()``, retried as :func:`redis_retrying` retries through a restart or failover
    of up to ``seconds``. The first try goes straight: tenacity's machinery costs ~0.1 ms a call,
    and the calls this serves (every job's claim and end, every event batch) nearly always
    succeed at once."""
    try:
        return await call()
    except TRANSIENT:
        pass
    async for attempt in redis_retrying(seconds):
        with attempt:
            return await call()
    raise AssertionError("unreachable")  # redis_retrying re-raises once it gives up


# redis-py types every reply ``bytes | str`` (a range: names, pairs or lists), whatever the client
# decodes. The clients made here decode to str (make_redis; make_sync_redis(decode_responses=True)),
# and these say so to the type checker, in this one place; they cost nothing at run time.

def text(reply: bytes | str) -> str:
    """One reply of a decoding client: a str."""
    return cast(str, reply)


def text_or_none(reply: bytes | str | None) -> str | None:
    """One reply of a decoding client that may be nil."""
    return cast(str | None, reply)


def texts(reply: Iterable[Any]) -> list[str]:
    """A list reply of a decoding client (LRANGE, HKEYS, a ZRANGE without scores...): strs."""
    return cast(list[str], reply)


def text_set(reply: Iterable[Any]) -> set[str]:
    """A set reply of a decoding client (SMEMBERS): strs."""
    return cast(set[str], reply)


def text_map(reply: Mapping[Any, Any]) -> dict[str, str]:
    """A hash reply of a decoding client (HGETALL): str to str."""
    return cast(dict[str, str], reply)


def stream_entries(reply: Iterable[Any] | None) -> list[tuple[str, dict[str, str]]]:
    """An XRANGE reply of a decoding client: (id, fields) pairs (never nil, whatever its type says)."""
    return cast(list[tuple[str, dict[str, str]]], reply)


def hash_fields(mapping: Mapping[str, EncodableT]) -> Mapping[EncodableT, EncodableT]:
    """HSET's ``mapping`` from str keys (redis-py's type for it is invariant in the key)."""
    return cast(Mapping[EncodableT, EncodableT], mapping)


async def listen(redis: Redis, channel: str, handle: Callable[[str], Awaitable[None]], retry_s: float = 0.5) -> None:
    """Pass each message published on ``channel`` to ``handle``, until cancelled; subscribe again
    after a lost connection (what was published meanwhile is missed)."""
    while True:
        try:
            async with redis.pubsub(ignore_subscribe_messages=True) as ps:
                await ps.subscribe(channel)
                async for raw in ps.listen():
                    if raw.get("type") == "message":
                        await handle(raw["data"])
        except asyncio.CancelledError:
            raise
        except Exception as e:
            log.warning("subscription to %s lost (%s); subscribing again", channel, e)
            await asyncio.sleep(retry_s)  # back off before reconnecting
