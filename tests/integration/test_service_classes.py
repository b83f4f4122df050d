"""Interactive and batch work on one worker (docs/design.md, "Service classes"): a worker of 2 slots
and 1 more for interactive work takes 2 batch jobs at most, an interactive job starts while both
run (it does not wait for one to end), and interactive work that finds every slot held gets the
youngest batch job's slot: that job is paused, handed back with its progress kept (no restart event:
worker/jobs/resume.py), and continues where it stopped; it ends once, its log replaying to its whole
text with every token once."""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import pytest
import redis

from inferq.shared import keys
from tests.conftest import ahead, take
from tests.fleet import Fleet
from tests.helpers import LONG_JOB, submit, wait_status
from tests.wait import eventually

pytestmark = pytest.mark.integration
BATCH_JOB = LONG_JOB // 2  # still running while the test acts (about 8 s alone on the 2-core machine)


@ahead("classes_fleet")
def start_fleet(request: pytest.FixtureRequest) -> Fleet:
    """Redis, a gateway and one worker of 2 slots and 1 for interactive work (not waited for)."""
    logdir = request.getfixturevalue("logdir") / "classes"
    logdir.mkdir(exist_ok=True)
    f = Fleet(logdir, extra_env={"INFERQ_MAX_NUM_SEQS": "2", "INFERQ_INTERACTIVE_RESERVE": "1"})
    return f.launch()


@pytest.fixture(scope="module")
def fleet(request: pytest.FixtureRequest) -> Iterator[Fleet]:
    f = take("classes_fleet", request)
    try:
        for wid in list(f.workers):
            f.wait_worker(wid)
        yield f
    finally:
        f.stop()


def classes(http: httpx.Client) -> dict:
    [worker] = http.get("/v1/workers").json()
    return worker["classes"]


def statuses(http: httpx.Client, ids: list[str]) -> list[str]:
    return [http.get(f"/v1/jobs/{i}").json()["status"] for i in ids]


def events(fleet: Fleet, job_id: str) -> list[dict]:
    """The job's whole log, as a client replaying its stream reads it."""
    r = redis.Redis(port=fleet.redis_port, decode_responses=True)
    return [json.loads(fields["e"]) for _, fields in r.xrange(keys.job_log(job_id))]


def test_batch_fills_the_slots_and_interactive_work_starts_beside_it(fleet: Fleet) -> None:
    with fleet.http() as http:
        assert classes(http)["slots"] == 2 and classes(http)["reserve"] == 1
        # as long as a job can be (they are cancelled at the end): still running when the chat comes
        batch = [submit(http, prompt="bulk", max_tokens=LONG_JOB, ignore_eos=True, service_class="batch")
                 for _ in range(3)]
        eventually(lambda: statuses(http, batch).count("running") == 2, 60, "two batch jobs running")
        eventually(lambda: classes(http)["running"].get("batch"), 10, "the heartbeat to say what it holds",
                   until=lambda held: held == {"anonymous": 2})
        assert statuses(http, batch).count("queued") == 1  # the worker has a free thread, not a batch slot
        chat = submit(http, prompt="hello", max_tokens=8, ignore_eos=True)
        done = wait_status(http, chat, timeout=60)
        ran = [http.get(f"/v1/jobs/{i}").json() for i in batch]
        first_batch_end = min(v["finished_at"] or float("inf") for v in ran)
        assert done["status"] == "succeeded" and done["started_at"] < first_batch_end, (done, ran)
        for job_id in batch:
            http.delete(f"/v1/jobs/{job_id}")
        for job_id in batch:
            wait_status(http, job_id)


def test_waiting_interactive_work_takes_the_youngest_batch_slot(fleet: Fleet) -> None:
    with fleet.http() as http:
        old = submit(http, prompt="bulk one", max_tokens=BATCH_JOB, ignore_eos=True, service_class="batch")
        eventually(lambda: statuses(http, [old]) == ["running"], 60, "the first batch job running")
        young = submit(http, prompt="bulk two", max_tokens=BATCH_JOB, ignore_eos=True, service_class="batch")
        eventually(lambda: statuses(http, [young]) == ["running"], 60, "the second batch job running")
        long = submit(http, prompt="a long chat", max_tokens=BATCH_JOB, ignore_eos=True)  # the reserve
        eventually(lambda: statuses(http, [long]) == ["running"], 60, "the long interactive job running")
        chat = submit(http, prompt="hello", max_tokens=8, ignore_eos=True)  # every slot is held
        done = wait_status(http, chat, timeout=60)
        assert done["status"] == "succeeded"  # the older batch job kept its slot: its log has no restart (below)
        ends = {j: wait_status(http, j, timeout=240) for j in (old, young, long)}
    for view in ends.values():
        assert view["status"] == "succeeded" and view["usage"]["completion_tokens"] == BATCH_JOB, view
    log = events(fleet, young)
    r = redis.Redis(port=fleet.redis_port, decode_responses=True)
    assert (r.hget(keys.job(young), "preemptions"), r.hget(keys.job(young), "attempt")) == ("1", "2"), "paused once"
    assert not [ev for ev in log if ev["type"] == "restart"], "it continued: nothing to discard"
    tokens = [ev for ev in log if ev["type"] == "token"]
    assert "".join(ev["text"] for ev in tokens) == ends[young]["text"]
    assert [ev["type"] for ev in log].count("done") == 1
    assert sum(ev["n_tokens"] for ev in tokens) == BATCH_JOB, "every token streamed once"
    assert [ev["seq"] for ev in log] == list(range(1, len(log) + 1))
    assert not [ev for ev in events(fleet, old) if ev["type"] == "restart"]
