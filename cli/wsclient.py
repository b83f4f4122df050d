"""A small WebSocket client for the command line: ``inferq stream`` and ``inferq generate``."""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosedError

from inferq.shared.schemas import ErrorEvent


def error_line(ev: ErrorEvent) -> str:
    """How an ``error`` event reads on a terminal: ``type (code): message``."""
    e = ev.error
    return f"{e.type} ({e.code}): {e.message}" if e.code else f"{e.type}: {e.message}"


async def _print_events(url: str, first: dict[str, Any] | None, raw: bool) -> int:
    status = 1
    async with connect(url) as ws:
        if first is not None:
            await ws.send(json.dumps(first))
        try:
            async for msg in ws:
                ev = json.loads(msg)
                if raw:
                    print(msg, flush=True)
                elif ev["type"] == "accepted":
                    print(f"[job {ev['id']}]", file=sys.stderr, flush=True)
                elif ev["type"] == "token":
                    print(ev["text"], end="", flush=True)
                elif ev["type"] == "done":
                    print(f"\n[{ev.get('status', 'succeeded')}: {ev['finish_reason']}, {ev['usage']}]",
                          file=sys.stderr)
                if ev["type"] == "error":
                    print(f"\n[{error_line(ErrorEvent.model_validate(ev))}]", file=sys.stderr)
                status = 0 if ev["type"] == "done" else status
        except ConnectionClosedError:
            pass
    return status


def stream(base: str, job_id: str, after: int = 0, raw: bool = False) -> int:
    """Print a job's tokens as they arrive (replaying what came before ``after``)."""
    return asyncio.run(_print_events(f"{base}/v1/jobs/{job_id}/stream?after={after}", None, raw))


def generate(base: str, body: dict[str, Any], raw: bool = False) -> int:
    """Submit a job over ``WS /v1/generate`` and print its tokens; Ctrl-C cancels it."""
    return asyncio.run(_print_events(f"{base}/v1/generate", body, raw))
