"""The gateway's one SSE response (api/sse.py), driven as an ASGI server drives it: what it sends,
when it pings, and that a client going away mid-stream (and only then) cancels the stream's jobs."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import redis.exceptions

from inferq.api.sse import EventStream, Payload, encode

HEADERS = {"X-Inferq-Job-Id": "job-1"}
ITEMS = [Payload('{"a":"b"}'), Payload("two\nlines"), Payload('{"x":1}', event="response.created"),
         Payload("[DONE]", last=True)]


async def payloads(items: list[Payload], *, fail: bool = False, hang: bool = False,
                   delay: float = 0.0) -> AsyncIterator[Payload]:
    for p in items:
        if delay:
            await asyncio.sleep(delay)
        yield p
    if fail:
        raise redis.exceptions.ConnectionError("redis away")
    if hang:
        await asyncio.Event().wait()


async def drive(stream: EventStream, gone_after: int | None = None) -> list[dict]:
    """Run the response; the client goes away once ``gone_after`` messages were sent."""
    sent: list[dict] = []
    gone = asyncio.Event()

    async def send(message: dict) -> None:
        sent.append(message)
        if gone_after is not None and len(sent) >= gone_after:
            gone.set()

    async def receive() -> dict:
        await gone.wait()
        return {"type": "http.disconnect"}

    await asyncio.wait_for(stream({"type": "http"}, receive, send), 5)
    return sent


def bodies(sent: list[dict]) -> list[bytes]:
    return [m["body"] for m in sent if m["type"] == "http.response.body"]


def test_a_payload_is_one_event_and_line_breaks_make_data_lines() -> None:
    assert encode(Payload('{"a":1}')) == b'data: {"a":1}\n\n'
    assert encode(Payload("x", event="response.done")) == b"event: response.done\ndata: x\n\n"
    assert encode(Payload("one\r\ntwo\rthree")) == b"data: one\ndata: two\ndata: three\n\n"
    assert encode(Payload("x\ny", event="bad\nname")) == b"event: badname\ndata: x\ndata: y\n\n"


async def test_every_payload_in_order_then_the_end_and_no_cancel() -> None:
    cancels: list[int] = []
    sent = await drive(EventStream(payloads(ITEMS[1:]), lambda: cancels.append(1), HEADERS, first=ITEMS[0]))
    start = sent[0]
    assert start["type"] == "http.response.start" and start["status"] == 200
    headers = dict(start["headers"])
    assert headers[b"content-type"].startswith(b"text/event-stream") and headers[b"x-inferq-job-id"] == b"job-1"
    assert headers[b"cache-control"] == b"no-store" and headers[b"x-accel-buffering"] == b"no"
    assert bodies(sent) == [encode(p) for p in ITEMS] + [b""] and sent[-1]["more_body"] is False
    assert cancels == []


async def test_a_failure_mid_stream_is_the_last_payload_an_error_body() -> None:
    cancels: list[int] = []
    sent = await drive(EventStream(payloads(ITEMS[:2], fail=True), lambda: cancels.append(1), HEADERS))
    *_, error, end = bodies(sent)
    assert error.startswith(b'data: {"error":') and b"service_unavailable" in error and end == b""
    assert cancels == []  # the stream said how it ended: its jobs are not the client's to cancel


async def test_a_client_gone_mid_stream_cancels_its_jobs() -> None:
    cancels: list[int] = []
    sent = await drive(EventStream(payloads(ITEMS[:2], hang=True), lambda: cancels.append(1), HEADERS), gone_after=3)
    assert bodies(sent)[:2] == [encode(p) for p in ITEMS[:2]]
    assert cancels == [1]


async def test_a_client_gone_after_the_last_payload_cancels_nothing() -> None:
    cancels: list[int] = []
    await drive(EventStream(payloads(ITEMS), lambda: cancels.append(1), HEADERS), gone_after=len(ITEMS) + 1)
    assert cancels == []


async def test_an_idle_stream_is_pinged_and_the_pings_stop_at_its_end() -> None:
    sent = await drive(EventStream(payloads(ITEMS, delay=0.1), None, HEADERS, ping_s=0.02))
    got = bodies(sent)
    pings = [b for b in got if b.startswith(b": ping - ")]
    assert pings and all(b.endswith(b"\n\n") for b in pings)
    assert [b for b in got if not b.startswith(b": ping")] == [encode(p) for p in ITEMS] + [b""]
    assert got[-1] == b""  # nothing after the end of the body
