"""Small clients for the tests: submit, poll, and read a WebSocket to its end."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import redis
from redis.asyncio import Redis
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosedError

from inferq.shared import keys
from inferq.shared.schemas import TERMINAL_STATUSES
from inferq.shared.store import queue_depths
from inferq.worker.engine.models import TINY_MAX_LEN
from tests.wait import eventually

#: max_tokens of a job (with ignore_eos) that is still running when a test acts on it: about 17 s
#: alone on the 2-core machine; a test that cancels it, or waits for its deadline, ends it long
#: before that
LONG_JOB = TINY_MAX_LEN - 192


def submit(http: httpx.Client, **body: Any) -> str:
    r = http.post("/v1/jobs", json=body)
    assert r.status_code == 202, r.text
    return str(r.json()["id"])


def wait_status(http: httpx.Client, job_id: str, statuses: set[str] | frozenset[str] = TERMINAL_STATUSES,
                timeout: float = 120) -> dict:
    """The job's view once its status is one of ``statuses`` (by default: once it has ended)."""
    return eventually(lambda: http.get(f"/v1/jobs/{job_id}").json(), timeout,
                      f"job {job_id} to reach {sorted(statuses)}", until=lambda view: view["status"] in statuses)


def fresh_rate_window(r: redis.Redis, ip: str = "127.0.0.1") -> None:
    """Forget the client address's submissions of the last minute. Without API keys a rate limit
    counts per address, in one window for every gateway on the Redis: a test with a limit must not
    find it filled by another test's gateway less than a minute before."""
    r.delete(keys.rate(f"ip:{ip}"))


def ran_out_first(view: dict, let_go_at: float) -> bool:
    """The job ended ``succeeded`` before the client let go (closed its socket or stream).

    A cancel-on-disconnect test needs the job still running when the client goes: on a busy
    machine a long job can run to its end first. Such a try proves nothing either way and is run
    again; a job that ends ``succeeded`` *after* the client went is a failure."""
    return view["status"] == "succeeded" and view["finished_at"] <= let_go_at


async def queue_depth(r: Redis, model: str) -> int:
    """Jobs waiting in the model's Celery queue, all priorities together (one round trip)."""
    return sum(await queue_depths(r, model))


async def ws_events(url: str, send: dict | None = None, timeout: float = 120) -> list[dict]:
    """Every message a WebSocket sends until the server closes it (within ``timeout`` seconds)."""
    out = []
    async with asyncio.timeout(timeout), connect(url, open_timeout=10, close_timeout=5) as ws:
        if send is not None:
            await ws.send(json.dumps(send))
        try:
            async for msg in ws:
                out.append(json.loads(msg))
        except ConnectionClosedError:  # closed with an error code: the events say why
            pass
    return out


def token_text(events: list[dict], index: int = 0) -> str:
    return "".join(e["text"] for e in events if e["type"] == "token" and e.get("index", 0) == index)


def assert_seq_exact(events: list[dict], after: int = 0) -> None:
    """Job events carry seq after+1, after+2, ... with no gap and no duplicate."""
    seqs = [e["seq"] for e in events if e["type"] in ("token", "done", "error")]
    assert seqs == list(range(after + 1, after + 1 + len(seqs))), seqs
