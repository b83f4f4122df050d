"""Subscriber: the hub's one Redis pub/sub connection, read in bulk.

redis-py's ``PubSub.get_message`` costs tens of microseconds per message (a timeout scope, a retry
wrapper and several layers per call): a profile of the gateway fanning out tokens showed ~70 % of
its CPU there. Here one socket read is handed to hiredis (the parser redis-py itself uses) and
every complete reply in it is dispatched in a tight loop. The connection re-establishes itself
and re-subscribes after an error; a quiet connection is checked with PING. Messages published
while it was down are not replayed by Redis: the hub's listeners notice the gap in ``seq`` (or a
quiet spell) and read the job's log.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import Callable

import hiredis
from redis.asyncio.connection import parse_url

log = logging.getLogger(__name__)


def _command(*parts: str) -> bytes:
    out = [b"*%d\r\n" % len(parts)]
    for p in parts:
        b = p.encode()
        out.append(b"$%d\r\n%s\r\n" % (len(b), b))
    return b"".join(out)


class Subscriber:
    """Keeps ``channels`` subscribed on one connection; calls ``on_message(channel, data)`` for
    each message and ``on_subscribed(channel)`` when Redis confirms a subscription."""

    def __init__(self, url: str, on_message: Callable[[str, str], None],
                 on_subscribed: Callable[[str], None], ping_after_s: float = 5.0) -> None:
        self._opts = parse_url(url)
        self._ssl = url.startswith("rediss://")
        self._on_message = on_message
        self._on_subscribed = on_subscribed
        self._ping_after_s = ping_after_s
        self.channels: set[str] = set()
        self._writer: asyncio.StreamWriter | None = None
        self._task: asyncio.Task[None] | None = None
        self.connected = asyncio.Event()

    async def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="pubsub-reader")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
        self._close()

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
        await w.drain()

    async def _connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        o = self._opts
        if "path" in o:
            reader, writer = await asyncio.open_unix_connection(o["path"])
        else:
            reader, writer = await asyncio.open_connection(
                o.get("host", "localhost"), o.get("port", 6379),
                ssl=ssl.create_default_context() if self._ssl else None)
        if o.get("password"):
            auth = [o["username"], o["password"]] if o.get("username") else [o["password"]]
            writer.write(_command("AUTH", *auth))
            await writer.drain()
            if not (await reader.readline()).startswith(b"+OK"):
                writer.close()
                raise ConnectionError("Redis refused the pub/sub connection's AUTH")
        return reader, writer

    async def _run(self) -> None:
        backoff = 0.05
        while True:
            try:
                reader, self._writer = await self._connect()
                if self.channels:
                    self._writer.write(_command("SUBSCRIBE", *sorted(self.channels)))
                self.connected.set()
                backoff = 0.05
                await self._read(reader)
            except asyncio.CancelledError:
                raise
            except (OSError, ConnectionError, TimeoutError, hiredis.ProtocolError) as e:
                log.warning("pub/sub connection lost (%r); reconnecting in %.2f s", e, backoff)
            except Exception:  # a bug must not end every stream of this process: start over
                log.exception("pub/sub reader failed; reconnecting in %.2f s", backoff)
            self.connected.clear()
            self._close()
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, 2.0)

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
                        self._on_subscribed(channel)
                elif isinstance(reply, Exception):
                    log.warning("pub/sub: Redis answered %s", reply)

    def _close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None
