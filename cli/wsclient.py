"""A small WebSocket client for the command line: ``inferq stream`` and ``inferq generate``.

Tokens go to stdout, everything else to stderr (``[job ...]``, the final ``[status: ...]`` line,
``error: ...``). The exit codes, as the README's CLI section lists them: :data:`OK` (the job
succeeded), :data:`JOB_DID_NOT_SUCCEED` (it failed or was cancelled, or the gateway refused it:
unknown job, invalid request, full queue), 2 (bad arguments: argparse's), :data:`UNREACHABLE` (no
gateway answered at the URL, or the connection was lost before the job ended) and
:data:`INTERRUPTED` (Ctrl-C; ``generate`` then cancels its job).
"""

from __future__ import annotations

import asyncio
import errno
import json
import socket
import sys
import urllib.error
import urllib.request
from typing import Any

from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus, InvalidURI

from inferq.shared.jsonl import one_line
from inferq.shared.schemas import ErrorEvent, ErrorInfo

OK = 0
JOB_DID_NOT_SUCCEED = 1
USAGE = 2
UNREACHABLE = 3
INTERRUPTED = 130
OPEN_TIMEOUT_S = 10.0
_SCHEMES = {"ws://": "ws://", "wss://": "wss://", "http://": "ws://", "https://": "wss://"}


class Unreachable(Exception):
    """No gateway to talk to: the one line to print is ``str(self)``."""


def error_line(ev: ErrorEvent) -> str:
    """How an ``error`` event reads on a terminal: ``type (code): message``."""
    return _error_text(ev.error)


def _error_text(e: ErrorInfo) -> str:
    return f"{e.type} ({e.code}): {e.message}" if e.code else f"{e.type}: {e.message}"


def ws_base(url: str) -> str:
    """The gateway's WebSocket base for ``url`` (``ws[s]://`` as it is; ``http[s]://`` becomes
    ``ws[s]://``); ValueError for any other scheme."""
    for scheme, ws in _SCHEMES.items():
        if url.lower().startswith(scheme):
            return ws + url[len(scheme):].rstrip("/")
    raise ValueError(f"--url {url!r}: give the gateway as ws://, wss://, http:// or https://HOST:PORT")


def _why(e: BaseException) -> str:
    """Why a connection could not be made, in a few words."""
    if isinstance(e, InvalidStatus):
        return f"it answered HTTP {e.response.status_code} instead of opening a WebSocket"
    if isinstance(e, socket.gaierror):
        return f"unknown host ({e.strerror})"
    if isinstance(e, TimeoutError):
        return f"no answer within {OPEN_TIMEOUT_S:g} s"
    if isinstance(e, ConnectionRefusedError) or "Connect call failed" in str(e):
        return "connection refused"  # several addresses (localhost: ::1 and 127.0.0.1) fail as one OSError
    if isinstance(e, OSError) and e.errno is not None:
        return (e.strerror or errno.errorcode.get(e.errno, str(e.errno))).lower()
    return str(e) or type(e).__name__


async def _print_events(base: str, path: str, first: dict[str, Any] | None, raw: bool,
                        label: str) -> tuple[int | None, str | None]:
    """Print the socket's events. The exit code, once a final event (``done`` or ``error``) came;
    None when the gateway ended the stream without one (``--after`` the job's last event): the
    caller then asks for the job's status. And the id an ``accepted`` event gave, if any. ``label``:
    the gateway as the user gave it, for the messages."""
    code, job_id = None, None
    try:
        ws = await connect(base + path, open_timeout=OPEN_TIMEOUT_S)
    except (OSError, InvalidHandshake, InvalidURI) as e:
        raise Unreachable(f"cannot reach the gateway at {label}: {_why(e)}") from None
    async with ws:
        if first is not None:
            await ws.send(json.dumps(first))
        try:
            async for msg in ws:
                ev = json.loads(msg)
                _show(msg, ev, raw)
                if ev["type"] == "accepted":
                    job_id = ev["id"]
                elif ev["type"] == "done":
                    code = OK if ev.get("status", "succeeded") == "succeeded" else JOB_DID_NOT_SUCCEED
                elif ev["type"] == "error":
                    code = JOB_DID_NOT_SUCCEED
        except ConnectionClosed:
            pass
    if code is None and ws.close_code != 1000:  # no close frame, or not a normal end: the gateway went away
        raise Unreachable(f"the connection to the gateway at {label} was lost before the job ended")
    return code, job_id


def _show(msg: str | bytes, ev: dict[str, Any], raw: bool) -> None:
    """Print one event: as it came (``raw``), or its text on stdout and a line about the job on
    stderr; an error's line either way."""
    if raw:  # one event a line, also for a reader that splits at U+2028 and the like
        print(one_line(msg) if isinstance(msg, str) else msg, flush=True)
    elif ev["type"] == "accepted":
        print(f"[job {ev['id']}]", file=sys.stderr, flush=True)
    elif ev["type"] == "loading":  # the model sleeps: the job waits for a worker to wake it
        eta = ev.get("expected_s")
        print(f"[model {ev.get('model')} is asleep: waiting for a worker to wake it"
              f"{f', about {eta:g} s' if eta is not None else ''}]", file=sys.stderr, flush=True)
    elif ev["type"] == "token":
        print(ev["text"], end="", flush=True)
    elif ev["type"] == "done":
        print(f"\n[{ev.get('status', 'succeeded')}: {ev['finish_reason']}, {ev['usage']}]", file=sys.stderr)
    if ev["type"] == "error":
        print(f"\n[{error_line(ErrorEvent.model_validate(ev))}]", file=sys.stderr)


def _http_base(base: str) -> str:
    return "http" + base[2:]  # ws:// -> http://, wss:// -> https://


def _final_status(base: str, job_id: str, label: str) -> int:
    """A stream that ended with no final event (``--after`` its last one): the job's own status,
    printed as its final event would be."""
    url = f"{_http_base(base)}/v1/jobs/{job_id}"
    try:
        with urllib.request.urlopen(url, timeout=OPEN_TIMEOUT_S) as r:
            view = json.loads(r.read())
    except urllib.error.HTTPError as e:
        raise Unreachable(f"the job's stream ended, and GET {url} answered HTTP {e.code}") from None
    except OSError as e:
        reason = e.reason if isinstance(e, urllib.error.URLError) else e
        why = _why(reason) if isinstance(reason, BaseException) else str(reason)
        raise Unreachable(f"cannot reach the gateway at {label}: {why}") from None
    status = view["status"]
    if status in ("queued", "running"):
        raise Unreachable(f"the gateway ended the stream of job {job_id} while it is {status}")
    if status == "failed" and view.get("error"):
        print(f"[{_error_text(ErrorInfo.model_validate(view['error']))}]", file=sys.stderr)
    else:
        print(f"[{status}: {view['finish_reason']}, {view['usage']}]", file=sys.stderr)
    return OK if status == "succeeded" else JOB_DID_NOT_SUCCEED


def _run(base: str, path: str, first: dict[str, Any] | None, raw: bool, job_id: str | None) -> int:
    label = base.rstrip("/")
    try:
        base = ws_base(base)
        code, accepted = asyncio.run(_print_events(base, path, first, raw, label))
        if code is not None:
            return code
        if (job_id := accepted or job_id) is None:
            raise Unreachable(f"the gateway at {label} closed the socket before it accepted the job")
        return _final_status(base, job_id, label)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return USAGE
    except Unreachable as e:
        print(f"error: {e}", file=sys.stderr)
        return UNREACHABLE
    except KeyboardInterrupt:
        return INTERRUPTED


def stream(base: str, job_id: str, after: int = 0, raw: bool = False) -> int:
    """Print a job's tokens as they arrive (replaying what came before ``after``)."""
    return _run(base, f"/v1/jobs/{job_id}/stream?after={after}", None, raw, job_id)


def generate(base: str, body: dict[str, Any], raw: bool = False) -> int:
    """Submit a job over ``WS /v1/generate`` and print its tokens; Ctrl-C cancels it."""
    return _run(base, "/v1/generate", body, raw, None)
