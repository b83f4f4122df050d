"""The differential suite's Responses API steps that take more than one request (test_openai_diff.py
runs them on both servers and compares what they give): a background response read back and
cancelled while it runs, and cancels that are refused. Each step gives what a client depends on
and what does not hang on timing: the HTTP status, the error's shape, and the named fields of the
response object (not its text or usage, which depend on how far it ran)."""

from __future__ import annotations

from typing import Any

import httpx

from tests.helpers import LONG_JOB

MODEL = "inferq-tiny"
SHORT = {"model": MODEL, "input": "Say hi", "temperature": 0, "max_output_tokens": 8}


def _step(r: httpx.Response, *fields: str) -> dict[str, Any]:
    body = r.json()
    out: dict[str, Any] = {"status": r.status_code}
    if r.status_code >= 400:
        err = body.get("error", body)
        out["error"] = {k: type(err.get(k)).__name__ for k in ("message", "type")}
    else:
        out["values"] = {k: body.get(k) for k in fields}
    return out


def lifecycle(http: httpx.Client) -> dict[str, dict[str, Any]]:
    """Per step (a case name), what the server answered."""
    out: dict[str, dict[str, Any]] = {}
    done = http.post("/v1/responses", json=SHORT).json()
    out["responses cancel a finished one"] = _step(http.post(f"/v1/responses/{done['id']}/cancel"))
    # long: still running when it is read back and cancelled, on either server
    bg = http.post("/v1/responses", json={**SHORT, "max_output_tokens": LONG_JOB, "background": True})
    out["responses background"] = _step(bg, "status", "background")
    rid = bg.json()["id"]
    out["responses background retrieve"] = _step(http.get(f"/v1/responses/{rid}"), "object", "background")
    out["responses background cancel"] = _step(http.post(f"/v1/responses/{rid}/cancel"), "status", "background")
    out["responses background retrieve cancelled"] = _step(http.get(f"/v1/responses/{rid}"), "status")
    out["responses background cancel again"] = _step(http.post(f"/v1/responses/{rid}/cancel"), "status")
    return out
