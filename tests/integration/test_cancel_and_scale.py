"""Cancellation reaches the engine; batching and several workers, shown from engine statistics."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time

import httpx
import pytest
from websockets.asyncio.client import connect

from tests.helpers import LONG_JOB, ran_out_first, submit, wait_status
from tests.wait import eventually, eventually_async

pytestmark = pytest.mark.integration


def engine_requests(http: httpx.Client) -> dict[str, int]:
    return {w["id"]: w["stats"]["engine_requests"] for w in http.get("/v1/workers").json()}


def wait_engines_idle(http: httpx.Client, timeout: float = 15) -> dict[str, int]:
    """Each engine's requests, once both engines hold none."""
    return eventually(lambda: engine_requests(http), timeout, "both engines to hold no request",
                      until=lambda held: len(held) == 2 and not any(held.values()), interval=0.2)


def skipped_by_a_worker(stack, job_id: str) -> bool:
    """A worker took the job's message and left the job alone (its runner logs that)."""
    return any(f"job {job_id} skipped" in w.log.read_text(errors="replace") for w in stack.workers.values())


def test_cancel_running_job_aborts_it_in_the_engine(stack) -> None:
    with stack.http() as http:
        for _ in range(5):  # on a busy machine a job may finish before its cancel lands: try again
            job_id = submit(http, prompt="def long():", max_tokens=LONG_JOB, ignore_eos=True)
            eventually(lambda job_id=job_id: http.get(f"/v1/jobs/{job_id}").json()["first_token_at"] is not None,
                       60, "the job's first token (it is generating)")
            cancel_at = time.time()
            r = http.delete(f"/v1/jobs/{job_id}")
            assert r.status_code == 202
            view = wait_status(http, job_id, timeout=60)
            if ran_out_first(view, cancel_at):
                continue  # it ran to its end before the cancel was sent (ended after it: a failure)
            break
        assert view["status"] == "cancelled", view
        assert view["finish_reason"] == "cancelled"
        assert 0 < view["usage"]["completion_tokens"] < LONG_JOB
        wait_engines_idle(http)


def test_cancel_queued_job_never_runs(stack) -> None:
    for w in stack.workers.values():  # freeze the workers: nothing is taken from the queue
        os.kill(w.proc.pid, signal.SIGSTOP)
    try:
        with stack.http() as http:
            job_id = submit(http, prompt="never", max_tokens=8)
            assert http.get(f"/v1/jobs/{job_id}").json()["status"] == "queued"
            assert http.delete(f"/v1/jobs/{job_id}").json()["status"] == "cancelled"
    finally:
        for w in stack.workers.values():
            os.kill(w.proc.pid, signal.SIGCONT)
    # A stopped worker's pending BRPOP may already hold the message, so neither the queue nor
    # the unacked set says whether a worker has looked at it: the worker's own log does.
    eventually(lambda: skipped_by_a_worker(stack, job_id), 30, "a worker to take the job's message and skip it",
               interval=0.1)
    with stack.http() as http:
        view = http.get(f"/v1/jobs/{job_id}").json()
    assert view["status"] == "cancelled" and view["started_at"] is None and view["worker"] is None
    assert view["text"] == "" and view["usage"] is None


async def test_closing_generate_socket_cancels_the_job(stack) -> None:
    for _ in range(3):  # a try where the job ran out before the close is run again (ran_out_first)
        async with connect(f"{stack.ws}/v1/generate") as ws:
            await ws.send(json.dumps({"prompt": "stream", "max_tokens": LONG_JOB, "ignore_eos": True}))
            accepted = json.loads(await ws.recv())
            for _ in range(3):
                assert json.loads(await ws.recv())["type"] == "token"
            closing_at = time.time()
        with stack.http() as http:
            view = wait_status(http, accepted["id"], timeout=60)
            if ran_out_first(view, closing_at):
                continue
            assert view["status"] == "cancelled", {k: view[k] for k in ("status", "finish_reason", "usage", "error")}
            assert view["usage"]["completion_tokens"] < LONG_JOB
            wait_engines_idle(http)
            return
    pytest.fail("in 3 tries, the job always finished before the socket closed")


def test_64_concurrent_jobs_batch_in_the_engine_and_spread_over_workers(stack) -> None:
    async def run() -> list[dict]:
        async with httpx.AsyncClient(base_url=stack.base, timeout=120) as http:
            async def one(i: int) -> dict:
                r = await http.post("/v1/jobs", json={"prompt": f"job {i}:", "max_tokens": 64, "ignore_eos": True})
                assert r.status_code == 202, r.text
                job_id = r.json()["id"]

                async def view() -> dict:
                    return (await http.get(f"/v1/jobs/{job_id}")).json()
                return await eventually_async(view, 240, f"job {job_id} to end", interval=0.1,
                                              until=lambda v: v["status"] not in ("queued", "running"))
            return await asyncio.gather(*(one(i) for i in range(64)))

    views = asyncio.run(run())
    assert all(v["status"] == "succeeded" for v in views), [v["status"] for v in views]
    assert all(v["usage"]["completion_tokens"] == 64 for v in views)
    assert {v["worker"] for v in views} == set(stack.workers), "both workers take jobs from the queue"
    with stack.http() as http:
        workers = http.get("/v1/workers").json()
    peaks = {w["id"]: w["stats"]["peak_running"] for w in workers}
    # engine statistics: an engine ran more than one request in the same batch at once (how the
    # 64 jobs split between the two engines depends on how busy the machine is)
    assert max(peaks.values()) > 1, peaks
