"""The chaos suite's client: what a careful user does, and the checks made of every job after.

A client submits with an ``Idempotency-Key`` (retried through outages), follows the job over a
WebSocket that resumes with ``?after=SEQ``, and polls its end. Afterwards every job is replayed
from its first event on a fresh socket: a job that ended must replay, seq by seq, to its text.
"""

from __future__ import annotations

import contextlib
import json
import statistics
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import httpx
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed, WebSocketException

from inferq.shared.schemas import TERMINAL_STATUSES
from tests.wait import WaitTimeout, eventually_async

Event = dict[str, Any]


@dataclass
class Followed:
    events: list[Event] = field(default_factory=list)
    bare_closes: int = 0  # the socket dropped with no close frame and no error event (1006)
    told: int = 0  # the gateway sent an error event (seq 0) and closed: the client retries
    times: list[float] = field(default_factory=list)  # when each event arrived (time.time())


@dataclass
class Outcome:
    job_id: str
    followed: Followed
    final: dict[str, Any] | None = None
    replay: list[Event] | None = None


def client_text(events: list[Event]) -> tuple[str, bool]:
    """The text a careful client assembles (dropping text before each restart), and whether every
    seq arrived exactly once, in order, from 1."""
    text, ok = "", [e["seq"] for e in events] == list(range(1, len(events) + 1))
    for e in events:
        if e["type"] == "restart":
            text = ""
        elif e["type"] == "token" and e.get("index", 0) == 0:
            text += e["text"]
    return text, ok


def corrupted(o: Outcome) -> bool:
    """What a client saw, or what the log replays, disagrees with the job's end."""
    if o.final is None:
        return False  # counted as lost instead
    text, in_order = client_text(o.followed.events)
    replay = o.replay or []
    replayed, replay_ok = client_text(replay)
    ended = bool(replay) and replay[-1]["type"] in ("done", "error")
    if not in_order or not replay_ok or not ended:
        return True
    return o.final["status"] == "succeeded" and not (text == replayed == o.final["text"])


def figures(outcomes: list[Outcome]) -> dict[str, Any]:
    """The figures every scenario reports (lost, stranded, corrupted must be 0)."""
    failed: Counter[str] = Counter()
    restarts: Counter[str] = Counter()  # restart events by reason: an attempt lost
    succeeded = lost = 0
    for o in outcomes:
        restarts.update(e.get("reason", "?") for e in o.replay or o.followed.events if e["type"] == "restart")
        if o.final is None:
            lost += 1
        elif o.final["status"] == "succeeded":
            succeeded += 1
        else:
            err = o.final.get("error") or {}
            failed[err.get("code") or err.get("type") or o.final["status"]] += 1
    return {"submitted": len(outcomes), "succeeded": succeeded, "failed": dict(failed), "lost": lost,
            "corrupted": sum(corrupted(o) for o in outcomes), "restarts": dict(restarts),
            "bare_closes": sum(o.followed.bare_closes for o in outcomes)}


def summary(xs: list[float]) -> dict[str, float | int]:
    if not xs:
        return {"n": 0}
    return {"n": len(xs), "p50": round(statistics.median(xs), 3), "max": round(max(xs), 3)}


class Client:
    def __init__(self, base: str, ws_base: str, key: str | None = None) -> None:
        self.ws_base, self.key = ws_base, key
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        self.http = httpx.AsyncClient(base_url=base, timeout=30, headers=headers)

    async def aclose(self) -> None:
        await self.http.aclose()

    def ws_url(self, path: str, after: int | str = 0) -> str:
        return f"{self.ws_base}{path}?after={after}" + (f"&api_key={self.key}" if self.key else "")

    async def submit(self, body: dict[str, Any], idempotency_key: str | None = None) -> str:
        headers = {"Idempotency-Key": idempotency_key or uuid.uuid4().hex}

        async def post() -> httpx.Response:  # the same key each time: one job however many tries
            return await self.http.post("/v1/jobs", json=body, headers=headers)

        r = await eventually_async(post, 120, "the job accepted", until=lambda r: r.status_code == 202, interval=0.5,
                                   ignore=(httpx.HTTPError,))
        return str(r.json()["id"])

    async def follow(self, job_id: str, timeout: float) -> Followed:
        """The job's events, on sockets reconnected after the last event seen, until its end or
        ``timeout``: what was followed either way."""
        f = Followed()

        async def to_the_end() -> bool:  # one socket: True once the job's end came
            last = f.events[-1]["seq"] if f.events else 0
            try:
                async with connect(self.ws_url(f"/v1/jobs/{job_id}/stream", last), open_timeout=5) as ws:
                    async for raw in ws:
                        ev = json.loads(raw)
                        if ev["seq"] == 0:  # the gateway's own error (e.g. Redis away): retry
                            f.told += 1
                            break
                        f.events.append(ev)
                        f.times.append(time.time())
                        if ev["type"] in ("done", "error"):
                            return True
            except ConnectionClosed as e:
                f.bare_closes += e.rcvd is None
            except (TimeoutError, OSError, WebSocketException):
                pass
            return False

        with contextlib.suppress(WaitTimeout):
            await eventually_async(to_the_end, timeout, f"the end of job {job_id}'s stream", interval=0.3)
        return f

    async def replay(self, job_id: str) -> list[Event] | None:
        """Every logged event of the job, from the first, on a fresh socket (None: refused)."""
        events: list[Event] = []
        try:
            async with connect(self.ws_url(f"/v1/jobs/{job_id}/stream"), open_timeout=10) as ws:
                async for raw in ws:
                    ev = json.loads(raw)
                    if ev["seq"] == 0:
                        return None
                    events.append(ev)
                    if ev["type"] in ("done", "error"):
                        break
        except (TimeoutError, OSError, WebSocketException):
            return None
        return events

    async def final(self, job_id: str, timeout: float) -> dict[str, Any] | None:
        """The job's view once it has ended (None: not within ``timeout``)."""
        async def ended() -> dict[str, Any] | None:
            r = await self.http.get(f"/v1/jobs/{job_id}")
            return dict(r.json()) if r.status_code == 200 and r.json()["status"] in TERMINAL_STATUSES else None

        try:
            return await eventually_async(ended, timeout, f"job {job_id} to end", interval=0.25,
                                          ignore=(httpx.HTTPError,))
        except WaitTimeout:
            return None

    async def outcome(self, job_id: str, followed: Followed, timeout: float = 300) -> Outcome:
        o = Outcome(job_id, followed, await self.final(job_id, timeout))
        if o.final is not None:
            o.replay = await self.replay(job_id)
        return o

    async def wait_running(self, job_id: str, timeout: float = 120) -> dict[str, Any] | None:
        """The job's view once it is running and has produced text (None: it never did)."""
        async def view() -> dict[str, Any]:
            return dict((await self.http.get(f"/v1/jobs/{job_id}")).json())

        try:
            v = await eventually_async(view, timeout, f"job {job_id} running with text, or its end",
                                       until=lambda v: (v["status"] == "running" and v["text"])
                                       or v["status"] in TERMINAL_STATUSES)
        except WaitTimeout:
            return None
        return v if v["status"] == "running" else None

    async def cancel_to_abort(self, n: int) -> list[float]:
        """Seconds from DELETE to the job's `cancelled` end, for ``n`` long jobs caught running."""
        out = []
        for _ in range(n):
            job_id = await self.submit({"prompt": "cancel me", "max_tokens": 1500, "ignore_eos": True})
            if await self.wait_running(job_id, 60) is None:
                continue
            t0 = time.time()
            await self.http.delete(f"/v1/jobs/{job_id}")
            v = await self.final(job_id, 30)
            if v and v["status"] == "cancelled":
                out.append(v["finished_at"] - t0)
        return out
