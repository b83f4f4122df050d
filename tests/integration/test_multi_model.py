"""A multi-model worker (INFERQ_MODELS) on CPU: the tiny model and a second tiny model (other weights)
on one worker, one awake at a time; on vLLM's CPU build a swap stops one engine and starts the other.

One flow, three engine starts (each 20-60 s on 2 cores): a job for the sleeping model waits for its
wake and says so first (a ``loading`` event, through an OpenAI stream that never sees it), the
awake model's running job is paused when its model sleeps (back to the queue with its progress kept,
no ``restart``: worker/jobs/resume.py) and continues to its end after the swap back, on an engine
started again, each token streamed once, and the first model's text at temperature 0 after that swap
is its text before it."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from inferq.shared.settings import Settings
from inferq.worker.engine.models import tiny_variant_dir
from tests.conftest import ahead, take
from tests.fleet import Fleet
from tests.helpers import LONG_JOB, submit, wait_status
from tests.wait import eventually

pytestmark = pytest.mark.integration
A, B = "tiny-a", "tiny-b"
SWAP_S = 600  # a swap on the 2-core machine: an engine stopped and another started (minutes when it is busy)
PROMPT = {"prompt": "def main(args):", "max_tokens": 16, "temperature": 0}
HANDED_BACK = LONG_JOB  # tokens of the job that runs while its model is put to sleep (its grace is 1 s)


@ahead("multi")
def start_multi(request: pytest.FixtureRequest) -> Fleet:
    """Redis, a gateway and one worker of two models (not waited for)."""
    second = tiny_variant_dir(Settings(), seed=7)
    models = [{"name": A, "settings": {"dtype": "float32"}},
              {"name": B, "model": str(second), "settings": {"dtype": "float32"}}]
    f = Fleet(request.getfixturevalue("logdir"), extra_env={
        "INFERQ_MODELS": json.dumps(models), "INFERQ_MAX_NUM_SEQS": "8", "INFERQ_SWAP_MIN_AWAKE_S": "1",
        "INFERQ_SWAP_GRACE_S": "1", "INFERQ_SWAP_CHECK_S": "0.2",
        "INFERQ_SWAP_PRESPAWN": "true"})
    return f.launch()


def cards(f: Fleet) -> dict[str, dict[str, Any]]:
    with f.http() as http:
        return {m["id"]: m for m in http.get("/v1/models").json()["data"]}


@pytest.fixture(scope="module")
def multi(request: pytest.FixtureRequest) -> Iterator[Fleet]:
    f = take("multi", request)
    try:
        eventually(lambda: cards(f), SWAP_S, f"model {A} awake", procs=list(f.workers.values()),
                   until=lambda c: c.get(A, {}).get("state") == "awake", interval=0.5, ignore=(httpx.HTTPError,))
        yield f
    finally:
        f.stop()


def log_of(f: Fleet, job_id: str) -> list[dict[str, Any]]:
    """The job's events as its log holds them (the REST view replays nothing: read the stream's)."""
    import redis

    from inferq.shared import keys

    r = redis.Redis(port=f.redis_port, decode_responses=True)
    return [json.loads(fields["e"]) for _, fields in r.xrange(keys.job_log(job_id))]


def record(f: Fleet, job_id: str, field: str) -> str | None:
    """A field of the job's record as Redis holds it (JSON-encoded)."""
    import redis

    from inferq.shared import keys

    return redis.Redis(port=f.redis_port, decode_responses=True).hget(keys.job(job_id), field)


def chat_stream(f: Fleet, out: dict[str, Any]) -> None:
    """A streamed chat completion for the sleeping model, as an OpenAI client reads it."""
    body = {"model": B, "messages": [{"role": "user", "content": "hello"}], "max_tokens": 8, "stream": True,
            "temperature": 0}
    with httpx.Client(base_url=f.base, timeout=SWAP_S) as http, \
            http.stream("POST", "/v1/chat/completions", json=body) as r:
        out["status"] = r.status_code
        out["data"] = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]


@pytest.mark.timeout(4 * SWAP_S)
def test_a_worker_follows_demand_between_two_models(multi: Fleet) -> None:
    with multi.http() as http:
        before = wait_status(http, submit(http, model=A, **PROMPT))
        assert before["status"] == "succeeded" and before["worker"].endswith(f".{A}")
        assert cards(multi)[B]["state"] == "asleep"
        # a long job of A runs; a job for B arrives: B's wake puts A to sleep, A's job goes back
        long_job = submit(http, model=A, prompt="the long one", max_tokens=HANDED_BACK, ignore_eos=True)
        wait_status(http, long_job, {"running"})
        got: dict[str, Any] = {}
        stream = threading.Thread(target=chat_stream, args=(multi, got))
        stream.start()
        eventually(lambda: record(multi, long_job, "preemptions"), SWAP_S,
                   "the long job handed back as its model goes to sleep")
        stream.join(SWAP_S)
        assert got["status"] == 200 and got["data"][-1] == "[DONE]", got
        chunks = [json.loads(d) for d in got["data"][:-1]]  # every chunk an OpenAI chunk: no error, no wait
        assert all(c["object"] == "chat.completion.chunk" and "error" not in c for c in chunks), chunks
        events = log_of(multi, chunks[0]["id"])
        assert events[0] == {"type": "loading", "seq": 1, "model": B}  # B was never started: no estimate
        assert [e["seq"] for e in events] == list(range(1, len(events) + 1))
        assert events[-1]["type"] == "done"

        # A's job: paused, not counted as a failed attempt; after the swap back it continues to its end
        ended = wait_status(http, long_job, timeout=SWAP_S)
        events = log_of(multi, long_job)
        assert ended["status"] == "succeeded" and ended["usage"]["completion_tokens"] == HANDED_BACK
        assert (record(multi, long_job, "preemptions"), record(multi, long_job, "attempt")) == ("1", "2")
        assert not [e for e in events if e["type"] == "restart"], "it continued: nothing to discard"
        assert [e["type"] for e in events].count("done") == 1
        assert [e["seq"] for e in events] == list(range(1, len(events) + 1))
        tokens = [e for e in events if e["type"] == "token"]
        assert sum(e["n_tokens"] for e in tokens) == HANDED_BACK, "every token streamed once"
        assert "".join(e["text"] for e in tokens) == ended["text"]

        # differential: A's text at temperature 0 after its engine was stopped and started again
        after = wait_status(http, submit(http, model=A, **PROMPT), timeout=SWAP_S)
        assert after["status"] == "succeeded" and after["text"] == before["text"]

        state = cards(multi)
        assert (state[A]["state"], state[A]["awake_workers"], state[B]["state"], state[B]["asleep_workers"]) == \
            ("awake", 1, "asleep", 1)
        [swapper] = http.get("/v1/queue").json()["swappers"]
        assert [(s["from_model"], s["to_model"], s["cold"]) for s in swapper["recent"]] == \
            [(None, A, True), (A, B, True), (B, A, False)]
        assert swapper["recent"][1]["handed_back"] == 1
        # B's process was spawned ahead (INFERQ_SWAP_PRESPAWN) and imported vLLM while A served: its
        # start is its engine's; each start says where its seconds went
        for start in swapper["recent"][:2]:
            assert set(start["phases"]) == {"process", "setup", "engine", "consumer"}, start
            assert start["phases"]["engine"] > 0 and sum(start["phases"].values()) <= start["wake_s"] + 0.1
        assert swapper["recent"][1]["phases"]["process"] < 1.0, "imports done before B was needed"
        metrics = http.get("/metrics").text
    assert f'inferq_model_swap_seconds_count{{model="{A}"}} 1.0' in metrics
    assert f'inferq_model_starts_total{{model="{B}"}} 1.0' in metrics
