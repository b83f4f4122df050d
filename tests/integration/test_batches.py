"""The Batch API, online, driven by the official openai SDK against the session stack: a batch's
lines run as ordinary low-priority jobs, interactive requests overtake them, format errors fail
a batch before anything runs, refused bodies land in the error file as the API answers them,
cancel stops a batch, and a batch outlives the gateway that was advancing it."""

from __future__ import annotations

import json
import signal
import sys
import threading
from pathlib import Path

import httpx
import openai
import pytest

from inferq.shared import keys
from tests.conftest import free_port, http_ok, inferq_env, spawn
from tests.wait import eventually

pytestmark = pytest.mark.integration
CHAT = "/v1/chat/completions"


@pytest.fixture
def client(stack) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{stack.base}/v1", api_key="unused", max_retries=0)


def jsonl(rows: list[dict]) -> bytes:
    return "".join(json.dumps(r) + "\n" for r in rows).encode()


def chat_line(i: int, **body: object) -> dict:
    body = {"messages": [{"role": "user", "content": f"line {i}"}], "max_tokens": 8, **body}
    return {"custom_id": f"req-{i}", "method": "POST", "url": CHAT, "body": body}


def wait_batch(client: openai.OpenAI, batch_id: str, statuses: set[str], timeout: float = 300) -> object:
    """The batch once its status is one of ``statuses``."""
    return eventually(lambda: client.batches.retrieve(batch_id), timeout, f"batch {batch_id} to be {sorted(statuses)}",
                      until=lambda b: b.status in statuses, interval=0.1)


def output_lines(client: openai.OpenAI, file_id: str | None) -> list[dict]:
    if file_id is None:
        return []
    return [json.loads(x) for x in client.files.content(file_id).text.splitlines()]


def queued_depth(stack) -> int:
    r = stack.redis.client()
    return sum(r.llen(q) for q in keys.queue_lists("inferq-tiny"))


def test_200_lines_through_the_sdk_while_interactive_requests_go_first(stack, client) -> None:
    rows = [chat_line(i, max_tokens=96, ignore_eos=True) for i in range(198)]
    rows.insert(7, chat_line(1000, max_tokens=-1))  # refused by the endpoint: 400
    rows.insert(50, chat_line(1001, model="no-such-model"))  # refused by the endpoint: 404
    up = client.files.create(file=("requests.jsonl", jsonl(rows)), purpose="batch")
    assert (up.purpose, up.bytes, up.filename) == ("batch", len(jsonl(rows)), "requests.jsonl")
    assert client.files.content(up.id).content == jsonl(rows)
    batch = client.batches.create(input_file_id=up.id, endpoint=CHAT, completion_window="24h",
                                  metadata={"run": "sdk"})
    assert batch.status == "validating" and batch.metadata == {"run": "sdk"}

    # Interactive requests, sent while batch lines wait in the queue, go ahead of them.
    eventually(lambda: queued_depth(stack) >= 30, 120, "30 of the batch's lines waiting in the queue", interval=0.02)
    interactive: list[str] = []

    def ask(i: int) -> None:
        r = client.chat.completions.create(model="inferq-tiny", messages=[{"role": "user", "content": f"now {i}"}],
                                           max_tokens=8)
        interactive.append(r.id)

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert len(interactive) == 3

    done = wait_batch(client, batch.id, {"completed", "failed", "cancelled", "expired"})
    assert done.status == "completed", done
    assert (done.request_counts.total, done.request_counts.completed, done.request_counts.failed) == (200, 198, 2)
    assert done.in_progress_at and done.finalizing_at and done.completed_at
    out = output_lines(client, done.output_file_id)
    errs = output_lines(client, done.error_file_id)
    assert sorted(x["custom_id"] for x in out) == sorted(f"req-{i}" for i in range(198))
    for line in out:
        assert line["response"]["status_code"] == 200 and line["error"] is None
        body = line["response"]["body"]
        assert body["object"] == "chat.completion" and body["id"] == line["response"]["request_id"]
        assert body["usage"]["completion_tokens"] == 96 and body["choices"][0]["finish_reason"] == "length"

    # The error file holds what the endpoint answers for those bodies, status and error alike.
    assert [e["custom_id"] for e in errs] == ["req-1000", "req-1001"]
    with stack.http() as http:
        for e, row in zip(errs, (rows[7], rows[50]), strict=True):
            direct = http.post(CHAT, json=row["body"])
            assert e["response"]["status_code"] == direct.status_code and direct.status_code in (400, 404)
            assert e["response"]["body"] == direct.json()

        # Timestamps: an interactive request that found batch lines waiting started before them.
        # (How many lines still wait when it arrives depends on the machine's speed; with 10 or
        # more waiting, first come first served would start every one of them before it.)
        views = [http.get(f"/v1/jobs/{line['response']['request_id']}").json() for line in out]
        tested = 0
        for job_id in interactive:
            me = http.get(f"/v1/jobs/{job_id}").json()
            waiting = [v for v in views if v["created_at"] < me["created_at"] < v["started_at"]]
            if len(waiting) >= 10:
                tested += 1
                overtaken = [v for v in waiting if v["started_at"] > me["started_at"]]
                assert overtaken, f"{job_id} started after all {len(waiting)} batch lines waiting before it"
            assert me["finished_at"] < done.completed_at
        assert tested, "no interactive request found 10 batch lines waiting: the scenario did not happen"
    assert batch.id in [b.id for b in client.batches.list(limit=100)]


def test_format_errors_fail_the_batch_before_any_job_is_queued(stack, client) -> None:
    r = stack.redis.client()
    submitted = r.hget(keys.STATS, keys.stat("submitted", "inferq-tiny"))
    good = chat_line(1)
    text = "\n".join([
        json.dumps(good),
        "{not json",
        json.dumps({k: v for k, v in chat_line(2).items() if k != "custom_id"}),
        json.dumps({**chat_line(3), "method": "GET"}),
        json.dumps({**chat_line(4), "url": "/v1/completions"}),
        json.dumps(good),
    ]) + "\n"
    up = client.files.create(file=("bad.jsonl", text.encode()), purpose="batch")
    batch = client.batches.create(input_file_id=up.id, endpoint=CHAT, completion_window="24h")
    failed = wait_batch(client, batch.id, {"failed", "in_progress", "completed"}, timeout=60)
    assert failed.status == "failed" and failed.failed_at and failed.output_file_id is None
    assert [(e.code, e.line) for e in failed.errors.data] == [
        ("invalid_json_line", 2), ("missing_custom_id", 3), ("invalid_method", 4), ("mismatched_url", 5),
        ("duplicate_custom_id", 6)]
    assert r.hget(keys.STATS, keys.stat("submitted", "inferq-tiny")) == submitted, "no job was queued"


def test_cancel_stops_queued_lines_and_aborts_running_ones(stack, client) -> None:
    rows = [chat_line(i, max_tokens=1500, ignore_eos=True) for i in range(150)]
    up = client.files.create(file=("long.jsonl", jsonl(rows)), purpose="batch")
    batch = client.batches.create(input_file_id=up.id, endpoint=CHAT, completion_window="24h")
    wait_batch(client, batch.id, {"in_progress"}, timeout=60)
    eventually(lambda: queued_depth(stack) > 0, 60, "lines waiting in the queue (others run)", interval=0.02)
    asked = client.batches.cancel(batch.id)
    assert asked.status in ("cancelling", "cancelled") and asked.cancelling_at
    done = wait_batch(client, batch.id, {"cancelled", "completed"}, timeout=120)
    assert done.status == "cancelled" and done.cancelled_at
    counts = done.request_counts
    assert counts.total == 150 and counts.completed + counts.failed == 150 and counts.failed > 0
    errs = output_lines(client, done.error_file_id)
    assert len(errs) == counts.failed and {e["error"]["code"] for e in errs} == {"batch_cancelled"}
    assert queued_depth(stack) == 0
    with stack.http() as http:  # the engines let go of the aborted lines
        from tests.integration.test_cancel_and_scale import wait_engines_idle
        wait_engines_idle(http, timeout=60)
    with pytest.raises(openai.BadRequestError):
        client.batches.cancel(batch.id)


def test_files_api_round_trip_and_refusals(stack, client) -> None:
    data = jsonl([chat_line(1)])
    up = client.files.create(file=("one.jsonl", data), purpose="batch")
    assert client.files.retrieve(up.id).bytes == len(data)
    assert up.expires_at == up.created_at + 30 * 86400, "batch files expire after 30 days by default, as OpenAI's"
    hour = client.files.create(file=("hour.jsonl", data), purpose="batch",
                               expires_after={"anchor": "created_at", "seconds": 3600})
    assert client.files.retrieve(hour.id).expires_at == hour.created_at + 3600
    for bad in ({"anchor": "created_at", "seconds": 60}, {"anchor": "created_at", "seconds": "soon"}):
        with pytest.raises(openai.BadRequestError, match=r"expires_after\[seconds\]: must be an integer from 3600"):
            client.files.create(file=("x.jsonl", data), purpose="batch", expires_after=bad)  # type: ignore[arg-type]
    with pytest.raises(openai.BadRequestError, match=r"expires_after\[anchor\]"):
        client.files.create(file=("x.jsonl", data), purpose="batch",
                            expires_after={"anchor": "last_active_at", "seconds": 3600})  # type: ignore[typeddict-item]
    later = client.batches.create(input_file_id=hour.id, endpoint=CHAT, completion_window="24h",
                                  output_expires_after={"anchor": "created_at", "seconds": 86400})
    assert later.status == "validating"
    with pytest.raises(openai.BadRequestError, match="output_expires_after"):
        client.batches.create(input_file_id=hour.id, endpoint=CHAT, completion_window="24h",
                              output_expires_after={"anchor": "created_at", "seconds": 10})
    assert up.id in [f.id for f in client.files.list(purpose="batch")]
    with pytest.raises(openai.BadRequestError, match="purpose"):
        client.files.create(file=("x.jsonl", data), purpose="fine-tune")
    with pytest.raises(openai.BadRequestError, match="UTF-8"):
        client.files.create(file=("x.jsonl", b"\xff\xfe"), purpose="batch")
    with pytest.raises(openai.NotFoundError) as missing:
        client.batches.create(input_file_id="file-000000000000000000000000", endpoint=CHAT,
                              completion_window="24h")
    assert missing.value.body["param"] == "input_file_id", missing.value.body  # the field, as OpenAI names it
    with pytest.raises(openai.BadRequestError, match="completion_window"):
        client.batches.create(input_file_id=up.id, endpoint=CHAT, completion_window="1h")  # type: ignore[arg-type]
    assert client.files.delete(up.id).deleted
    with pytest.raises(openai.NotFoundError):
        client.files.retrieve(up.id)
    with pytest.raises(openai.NotFoundError):
        client.batches.retrieve("batch_000000000000000000000000")


def test_a_batch_outlives_the_gateway_advancing_it(stack, client, logdir: Path) -> None:
    """A second gateway takes the batch's lease and is killed mid-batch; the session gateway's
    runner takes the batch over once the lease lapses, and every line is answered once."""
    port = free_port()
    gw = spawn("gateway-batch", [sys.executable, "-m", "inferq.cli", "api", "--port", str(port)],
               inferq_env(stack.redis.url, INFERQ_BATCH_LEASE_S="2"), logdir)
    try:
        eventually(lambda: http_ok(f"http://127.0.0.1:{port}/readyz"), 60, "a second gateway", procs=[gw], interval=0.2)
        other = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0)
        rows = [chat_line(i, max_tokens=64, ignore_eos=True) for i in range(60)]
        up = other.files.create(file=("takeover.jsonl", jsonl(rows)), purpose="batch")
        batch = other.batches.create(input_file_id=up.id, endpoint=CHAT, completion_window="24h")
        r = stack.redis.client()
        assert r.get(keys.batch_part(batch.id, "lease")).split(":")[1] == str(gw.pid), \
            "the gateway that creates a batch advances it"
        eventually(lambda: int(r.hget(keys.batch(batch.id), "next") or 0) > 0, 60, "the batch to start", interval=0.02)
        gw.stop(signal.SIGKILL)
        assert client.batches.retrieve(batch.id).status == "in_progress"
        done = wait_batch(client, batch.id, {"completed", "failed", "cancelled"}, timeout=240)
    finally:
        gw.stop()
    assert done.status == "completed" and done.request_counts.completed == 60
    out = output_lines(client, done.output_file_id)
    assert sorted(x["custom_id"] for x in out) == sorted(f"req-{i}" for i in range(60))
    with httpx.Client(base_url=stack.base) as http:
        assert all(http.get(f"/v1/jobs/{x['response']['request_id']}").json()["status"] == "succeeded" for x in out)
