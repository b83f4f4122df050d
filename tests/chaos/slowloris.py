"""Chaos scenario about clients that hold the gateway's connections (the others: tests/chaos/scenarios.py).

- ``slow_clients``: while jobs stream, thousands of connections that send part of a request's head
  and stop (or send nothing), as a slowloris attack does. The gateway must drop every one of them by
  itself (``INFERQ_HTTP_HEADER_TIMEOUT_S``, its default here), serve new clients meanwhile, and every
  job must end.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import httpx

from tests.chaos.client import Client, figures
from tests.chaos.scenarios import long_jobs, run_jobs
from tests.fleet import Fleet
from tests.wait import eventually_async

SCENARIOS = ["slow_clients"]
#: What a held connection sends before it stops: nothing, a request line cut short, headers without
#: their end, a WebSocket upgrade without its end
HALF_SENT = [b"", b"GET /v1/qu", b"GET /v1/queue HTTP/1.1\r\nHost: gw\r\nX-Slow: a",
             b"GET /v1/generate HTTP/1.1\r\nHost: gw\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"]


async def _hold(port: int, data: bytes) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(data)
    await writer.drain()
    return reader, writer


async def _dropped(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, timeout: float) -> bool:
    """Whether the gateway closed the connection within ``timeout`` (a 408 may come first)."""
    try:
        async with asyncio.timeout(timeout):
            while await reader.read(65536):
                pass
        return True
    except TimeoutError:
        return False
    except OSError:  # reset by the gateway
        return True
    finally:
        writer.close()


async def _new_clients(fleet: Fleet, key: str | None, n: int) -> int:
    """How many of ``n`` new clients, each on a connection of its own, were answered 200."""
    served = 0
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    for _ in range(n):
        async with httpx.AsyncClient(base_url=fleet.base, timeout=60, headers=headers) as http:
            with contextlib.suppress(httpx.HTTPError):
                served += (await http.get("/v1/queue")).status_code == 200
    return served


async def slow_clients(fleet: Fleet, client: Client, jobs: int = 16, max_tokens: int = 4000,
                       connections: int = 2000, new_clients: int = 20, drop_timeout_s: float = 180) -> dict[str, Any]:
    """``connections`` half-sent requests held open while ``jobs`` jobs stream; meanwhile
    ``new_clients`` new clients and one new job must be served, and the gateway must drop every
    held connection. ``streaming_at_drop``: jobs still running once every connection was dropped
    (long jobs outlast the header deadline; not a verdict: a fast machine may end them sooner)."""
    port = int(fleet.base.rsplit(":", 1)[1])

    async def attack(ids: list[str]) -> dict[str, Any]:
        await eventually_async(lambda: len(ids) >= jobs, 300, f"all {jobs} jobs submitted")
        await client.wait_running(ids[-1])
        opened = await asyncio.gather(*(_hold(port, HALF_SENT[i % len(HALF_SENT)]) for i in range(connections)),
                                      return_exceptions=True)
        held = [c for c in opened if not isinstance(c, BaseException)]
        served = await _new_clients(fleet, client.key, new_clients)
        fresh = Client(fleet.base, fleet.ws, client.key)
        try:
            job = await fresh.final(await fresh.submit({"prompt": "a new client", "max_tokens": 16}), 300)
        finally:
            await fresh.aclose()
        dropped = await asyncio.gather(*(_dropped(r, w, drop_timeout_s) for r, w in held))
        views = [(await client.http.get(f"/v1/jobs/{i}")).json() for i in ids]
        return {"held": len(held), "not_opened": connections - len(held), "dropped": sum(dropped),
                "new_clients": new_clients, "served_meanwhile": served,
                "new_job": job["status"] if job else "did not end",
                "streaming_at_drop": sum(v.get("status") == "running" for v in views)}

    outcomes, extra = await run_jobs(client, jobs, long_jobs(max_tokens), concurrency=jobs, during=attack)
    report = figures(outcomes)
    report.update(extra, workers_alive=len(fleet.live()), workers=len(fleet.workers))
    return report


def problems(name: str, r: dict[str, Any]) -> list[str]:
    """What went wrong in the scenario's report, beyond what every scenario checks."""
    bad = []
    if not r["held"] or r["dropped"] < r["held"]:
        bad.append(f"the gateway dropped {r['dropped']} of {r['held']} half-sent connections")
    if r["served_meanwhile"] < r["new_clients"] or r["new_job"] != "succeeded":
        bad.append(f"new clients served {r['served_meanwhile']}/{r['new_clients']}, new job {r['new_job']}")
    if r["succeeded"] + sum(r["failed"].values()) != r["submitted"]:
        bad.append("not every job ended")
    return bad


def cell(name: str, r: dict[str, Any]) -> str:
    return (f"{r['held']} half-sent connections held ({r['not_opened']} not opened), dropped by the gateway: "
            f"{r['dropped']}; new clients served meanwhile: {r['served_meanwhile']}/{r['new_clients']}, "
            f"a new job {r['new_job']}; jobs streaming when the last was dropped: {r['streaming_at_drop']}")
