"""Subscriber: the hub's one Redis pub/sub connection, read in bulk.

redis-py's ``PubSub.get_message`` costs tens of microseconds per message (a timeout scope, a retry
wrapper and several layers per call): a profile of the gateway fanning out tokens showed ~70 % of
its CPU there. Here one socket read is handed to hiredis (the parser redis-py itself uses) and
every complete reply in it is dispatched in a tight loop. The connection re-establishes itself
(with backoff, reset only once Redis has answered properly) and re-subscribes; a quiet connection
is checked with PING; an error reply (NOAUTH, max clients, ...) counts as a broken connection.
With Sentinels each connection goes to the master they name at that moment, so after a failover
the reader re-subscribes on the new master.
Messages published while it was down are not replayed by Redis: the hub's listeners notice the
gap in ``seq`` (or a quiet spell) and read the job's log.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import Callable

import hiredis
from redis.asyncio.connection import parse_url
from redis.exceptions import RedisError

from inferq.shared.redis import RedisTarget, Where, master_address, sentinel_for

log = logging.getLogger(__name__)
CONNECT_TIMEOUT_S = 5.0
WRITE_BUFFER_WAIT = 1 << 16  # bytes of (un)subscribe commands not yet sent before one waits for them


def _command(*parts: str) -> bytes:
    out = [b"*%d\r\n" % len(parts)]
    for p in parts:
        b = p.encode()
        out.append(b"$%d\r\n%s\r\n" % (len(b), b))
    return b"".join(out)


class Subscriber:
    """Keeps ``channels`` subscribed on one connection; calls ``on_message(channel, data)`` for
    each message and ``on_subscribed(channel)`` when Redis confirms a subscription."""

    def __init__(self, where: Where, on_message: Callable[[str, str], None],
                 on_subscribed: Callable[[str], None], ping_after_s: float = 5.0) -> None:
        self._target = RedisTarget.of(where)
        self._opts = parse_url(self._target.url)
        self._sentinel = sentinel_for(self._target)  # None: the URL's host and port
        self._on_message = on_message
        self._on_subscribed = on_subscribed
        self._ping_after_s = ping_after_s
        self.channels: set[str] = set()
        self._writer: asyncio.StreamWriter | None = None
        self._task: asyncio.Task[None] | None = None
        self._backoff = 0.05
        self.connected = asyncio.Event()  # set once Redis has answered on the current connection

    async def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="pubsub-reader")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self._close()
        if self._sentinel is not None:
            await self._sentinel.aclose()

    async def subscribe(self, channel: str) -> None:
        self.channels.add(channel)
        await self._send("SUBSCRIBE", channel)  # when down, the reconnect subscribes it

    async def unsubscribe(self, channel: str) -> None:
        self.channels.discard(channel)
        await self._send("UNSUBSCRIBE", channel)

    async def _send(self, *parts: str) -> None:
        w = self._writer
        if w is None or w.is_closing():
            return
        w.write(_command(*parts))
        if w.transport.get_write_buffer_size() > WRITE_BUFFER_WAIT:  # Redis is slow to read: wait
            async with asyncio.timeout(CONNECT_TIMEOUT_S):
                await w.drain()

    async def _connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        o = self._opts
        async with asyncio.timeout(CONNECT_TIMEOUT_S):
            if "path" in o and self._sentinel is None:
                reader, writer = await asyncio.open_unix_connection(o["path"])
            else:
                host, port = await master_address(self._target, self._sentinel)
                reader, writer = await asyncio.open_connection(host, port, ssl=self._target.ssl_context())
                if (sock := writer.get_extra_info("socket")) is not None:
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
            try:
                if o.get("password"):
                    auth = [o["username"], o["password"]] if o.get("username") else [o["password"]]
                    writer.write(_command("AUTH", *auth))
                    await writer.drain()
                    answer = await reader.readline()
                    if not answer.startswith(b"+OK"):
                        raise ConnectionError(f"Redis refused the pub/sub connection's AUTH: {answer[:80]!r}")
            except BaseException:
                writer.close()
                raise
        return reader, writer

    async def _run(self) -> None:
        while True:
            try:
                reader, self._writer = await self._connect()
                if self.channels:
                    self._writer.write(_command("SUBSCRIBE", *sorted(self.channels)))
                self._writer.write(_command("PING"))  # its answer proves the connection usable
                await self._read(reader)
            except asyncio.CancelledError:
                raise
            except (OSError, ConnectionError, TimeoutError, hiredis.ProtocolError, RedisError) as e:
                log.warning("pub/sub connection lost (%r); reconnecting in %.2f s", e, self._backoff)
            except Exception:  # a bug must not end every stream of this process: start over
                log.exception("pub/sub reader failed; reconnecting in %.2f s", self._backoff)
            self.connected.clear()
            self._close()
            await asyncio.sleep(self._backoff)
            self._backoff = min(self._backoff * 2, 2.0)

    def _healthy(self) -> None:
        if not self.connected.is_set():
            self.connected.set()
            self._backoff = 0.05

    async def _read(self, reader: asyncio.StreamReader) -> None:
        parser = hiredis.Reader(encoding="utf-8")
        pinged = False
        while True:
            try:
                async with asyncio.timeout(self._ping_after_s):
                    data = await reader.read(1 << 16)
            except TimeoutError:
                if pinged:
                    raise ConnectionError("no answer to PING") from None
                await self._send("PING")
                pinged = True
                continue
            if not data:
                raise ConnectionError("closed by Redis")
            pinged = False
            parser.feed(data)
            while (reply := parser.gets()) is not False:
                if isinstance(reply, list) and len(reply) == 3:
                    kind, channel, payload = reply
                    if kind == "message":
                        self._on_message(channel, payload)
                    elif kind == "subscribe":
                        self._healthy()
                        self._on_subscribed(channel)
                elif isinstance(reply, Exception):
                    raise ConnectionError(f"Redis answered the pub/sub connection with an error: {reply}")
                else:  # PONG (["pong", ""] once subscribed)
                    self._healthy()

    def _close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None
