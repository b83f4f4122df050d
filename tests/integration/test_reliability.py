"""Faults against real processes: killed workers, drained workers, a dead engine, a Redis restart,
overload, deadlines and priorities. The faults run on a fleet of their own, so that breaking it
harms no other test (``make test-faults``); overload, deadlines and priorities run on the session
stack (``make test``)."""

from __future__ import annotations

import asyncio
import json
import signal
import time

import httpx
import psutil
import pytest
import redis

from inferq.shared import keys
from tests.conftest import free_port, http_ok, inferq_env, spawn
from tests.fleet import PY, Fleet
from tests.helpers import LONG_JOB, submit, token_text, wait_status, ws_events
from tests.wait import eventually

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def fleet(redis_server, logdir):  # redis_server: only to share the session's log folder order
    f = Fleet(logdir)
    try:
        yield f.start()
    finally:
        f.stop()


def ensure_two_workers(fleet: Fleet) -> None:
    while len(fleet.live()) < 2:
        fleet.start_worker(wait=False)
    for wid in fleet.live():
        fleet.wait_worker(wid)


def running_on(fleet: Fleet, job_id: str, min_text: int = 1) -> str:
    """The worker running the job once it has logged ``min_text`` token events. Read from Redis
    directly: a gateway slowed by a busy 2-core machine could answer after a short job ended."""
    r = redis.Redis(port=fleet.redis_port, decode_responses=True)

    def running_worker() -> str | None:
        status, worker = r.hmget(keys.job(job_id), ["status", "worker"])
        if status == '"running"' and worker and r.xlen(keys.job_log(job_id)) >= min_text:
            return str(json.loads(worker))
        return None

    return eventually(running_worker, 60, f"job {job_id} running with {min_text} events logged", interval=0.02)


def after_last_restart(events: list[dict]) -> list[dict]:
    idx = max((i for i, e in enumerate(events) if e["type"] == "restart"), default=-1)
    return events[idx + 1:]


@pytest.fixture(scope="module")
def ghost(stack, logdir):
    """A second gateway on the session's Redis whose default model has no worker: its jobs stay
    queued."""
    port = free_port()
    svc = spawn("ghost-gateway", [*PY, "api", "--port", str(port)],
                inferq_env(stack.redis.url, INFERQ_SERVED_MODEL_NAME="ghost", INFERQ_MAX_QUEUE_DEPTH="3"), logdir)
    eventually(lambda: http_ok(f"http://127.0.0.1:{port}/healthz"), 30, "ghost gateway", procs=[svc], interval=0.2)
    yield httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30)
    svc.stop()


def test_full_queue_is_429_with_retry_after(ghost) -> None:
    codes = [ghost.post("/v1/jobs", json={"prompt": "x", "max_tokens": 4}) for _ in range(5)]
    assert [r.status_code for r in codes] == [202, 202, 202, 429, 429]
    assert codes[3].headers["retry-after"] == "1" and codes[3].json()["error"]["type"] == "rate_limit_error"
    for r in codes[:3]:
        assert ghost.delete(f"/v1/jobs/{r.json()['id']}").json()["status"] == "cancelled"


def test_priority_puts_jobs_on_the_priority_lists(ghost, stack) -> None:
    r = stack.redis.client()
    for name in r.keys("inferq.q.ghost*"):
        r.delete(name)
    ids = [ghost.post("/v1/jobs", json={"prompt": "x", "priority": p}).json()["id"] for p in (9, 0, 5)]
    assert (r.llen("inferq.q.ghost"), r.llen("inferq.q.ghost:5"), r.llen("inferq.q.ghost:9")) == (1, 1, 1)
    for job_id in ids:
        ghost.delete(f"/v1/jobs/{job_id}")
    with stack.http() as http:  # the engine's priority scheduler takes it too
        assert wait_status(http, submit(http, prompt="urgent", priority=0, max_tokens=4))["status"] == "succeeded"


def test_deadline_queued_never_starts_running_is_aborted(stack) -> None:
    with stack.http() as http:
        # a deadline 1 ms after submission has passed by the time any worker takes the job
        late = wait_status(http, submit(http, prompt="late", max_tokens=8, timeout=0.001))
        assert late["status"] == "failed" and late["error"]["code"] == "deadline_exceeded", late
        assert "never started" in late["error"]["message"] and late["usage"]["completion_tokens"] == 0
        for _ in range(3):  # a try whose job never started within its 2 s (a busy machine) is run again
            long = wait_status(http, submit(http, prompt="long", max_tokens=LONG_JOB, ignore_eos=True, timeout=2))
            assert long["status"] == "failed" and long["error"]["type"] == "timeout_error", long
            if long["usage"]["completion_tokens"] > 0:
                break
        assert 0 < long["usage"]["completion_tokens"] < LONG_JOB, "in 3 tries, the job never started in its 2 s"


@pytest.mark.faults
def test_sigkill_mid_generation_reruns_the_job_elsewhere(fleet) -> None:
    ensure_two_workers(fleet)
    with fleet.http() as http:
        job_id = submit(http, prompt="survive", max_tokens=1500, ignore_eos=True, temperature=0)
        follower = asyncio.run_coroutine_threadsafe(ws_events(f"{fleet.ws}/v1/jobs/{job_id}/stream"), LOOP)
        victim = running_on(fleet, job_id, min_text=0)  # claimed: the engine has it or will at once
        killed_at = time.time()
        fleet.kill_worker(victim, signal.SIGKILL)
        view = wait_status(http, job_id, timeout=120)
    events = follower.result(timeout=60)
    assert view["status"] == "succeeded" and view["worker"] != victim, view
    assert view["usage"]["completion_tokens"] == 1500
    restarts = [e for e in events if e["type"] == "restart"]
    assert restarts and restarts[0]["reason"] == "worker_lost"
    assert [e["seq"] for e in events] == list(range(1, len(events) + 1))
    assert token_text(after_last_restart(events)) == view["text"]
    assert view["started_at"] - killed_at < 15, "redelivered within seconds of the worker's death"


@pytest.mark.faults
def test_engine_failure_hands_jobs_back_and_exits_nonzero(fleet) -> None:
    ensure_two_workers(fleet)
    with fleet.http() as http:
        job_id = submit(http, prompt="engine", max_tokens=1500, ignore_eos=True, n=4, temperature=1.0)
        victim = running_on(fleet, job_id, min_text=0)
        proc = fleet.workers[victim].proc
        cores = [c for c in psutil.Process(proc.pid).children(recursive=True) if "EngineCore" in " ".join(c.cmdline())
                 or "EngineCore" in c.name()]
        assert cores, "found the engine core process"
        for c in cores:
            c.kill()
        assert proc.wait(60) == 4  # noticed by the job in flight, or by the heartbeat's engine check
        view = wait_status(http, job_id, timeout=180)
        log = asyncio.run_coroutine_threadsafe(ws_events(f"{fleet.ws}/v1/jobs/{job_id}/stream"), LOOP).result(60)
    fleet.workers.pop(victim)
    assert view["status"] == "succeeded"
    if view["worker"] != victim:  # the usual case: the job was mid-generation when the engine died
        assert any(e["type"] == "restart" and e["reason"] == "engine_failure" for e in log)


@pytest.mark.faults
def test_sigterm_drains_then_hands_back_what_is_left(fleet) -> None:
    ensure_two_workers(fleet)
    with fleet.http() as http:
        job_id = submit(http, prompt="drain", max_tokens=1500, ignore_eos=True)
        victim = running_on(fleet, job_id, min_text=0)
        proc = fleet.workers[victim].proc
        proc.send_signal(signal.SIGTERM)
        # the worker announces it is draining (while it finishes the job or hands it back)
        eventually(lambda: any(w["id"] == victim and w["draining"] for w in http.get("/v1/workers").json()), 30,
                   f"{victim} listed as draining", interval=0.1)
        assert proc.wait(60) == 0
        view = wait_status(http, job_id, timeout=180)
        events = asyncio.run_coroutine_threadsafe(ws_events(f"{fleet.ws}/v1/jobs/{job_id}/stream"), LOOP).result(60)
    fleet.workers.pop(victim)
    assert view["status"] == "succeeded" and view["usage"]["completion_tokens"] == 1500
    # finished within the grace period on the draining worker, or paused and continued elsewhere
    # (worker/jobs/resume.py): either way no restart, and every token streamed once
    assert not [e for e in events if e["type"] == "restart"]
    assert sum(e["n_tokens"] for e in events if e["type"] == "token") == 1500


@pytest.mark.faults
def test_redis_restart_everyone_reconnects(fleet) -> None:
    """Redis dies while both workers hold jobs (unacked Celery messages): nobody exits, the
    jobs in flight finish, and new ones run."""
    ensure_two_workers(fleet)
    with fleet.http() as http:
        busy = [submit(http, prompt=f"in flight {i}", max_tokens=1500, ignore_eos=True) for i in range(4)]
        running_on(fleet, busy[-1], min_text=1)  # the last one generating: all four are in flight
    fleet.redis.stop(signal.SIGKILL)
    try:
        assert httpx.get(f"{fleet.base}/readyz", timeout=10).status_code == 503
        time.sleep(1.0)
    finally:
        fleet.start_redis()
    eventually(lambda: http_ok(f"{fleet.base}/readyz"), 30, "readyz after restart", interval=0.2)
    with fleet.http() as http:
        assert wait_status(http, submit(http, prompt="after", max_tokens=8))["status"] == "succeeded"
        views = [wait_status(http, job_id, timeout=180) for job_id in busy]
    assert [v["status"] for v in views] == ["succeeded"] * 4, [(v["status"], v["error"]) for v in views]
    assert fleet.gateway.proc.poll() is None and all(fleet.workers[w].proc.poll() is None for w in fleet.live())
    assert len(fleet.live()) == 2


def chaos(fleet: Fleet, jobs: int, **kw) -> dict:
    from tests.chaos import run_chaos

    ensure_two_workers(fleet)
    report = asyncio.run_coroutine_threadsafe(run_chaos(fleet, jobs=jobs, **kw), LOOP).result(600)
    assert report["lost"] == 0 and report["corrupted"] == 0, report
    assert report["succeeded"] + sum(report["failed"].values()) == report["submitted"] == jobs
    return report


@pytest.mark.faults
def test_chaos_smoke(fleet) -> None:
    """A few jobs and one worker killed a second after they were submitted, most likely while it
    runs some (not replaced: the other one takes them over). The Redis restart is left to the heavy
    run (test_chaos_short)."""
    report = chaos(fleet, 6, kills=1, redis_restarts=0, max_tokens=600, gap_s=1.0, replace=False)
    assert report["kills"] == 1, report
    assert len(fleet.live()) == 1, {wid: w.proc.returncode for wid, w in fleet.workers.items()}


@pytest.mark.heavy
def test_chaos_short(fleet) -> None:
    chaos(fleet, 30, kills=1, redis_restarts=1, max_tokens=120)


# One event loop in a thread for the websocket followers, so that tests can block meanwhile.
LOOP = asyncio.new_event_loop()
__import__("threading").Thread(target=LOOP.run_forever, daemon=True).start()


@pytest.mark.faults
def test_a_batch_survives_a_worker_kill_a_gateway_restart_and_a_redis_restart(fleet) -> None:
    """Every line of a batch is answered exactly once through all three faults in a row."""
    ensure_two_workers(fleet)
    rows = [{"custom_id": f"r{i}", "method": "POST", "url": "/v1/completions",
             "body": {"prompt": f"line {i}", "max_tokens": 200, "ignore_eos": True}} for i in range(80)]
    body = "".join(json.dumps(r) + "\n" for r in rows).encode()
    with fleet.http() as http:
        up = http.post("/v1/files", files={"file": ("in.jsonl", body)}, data={"purpose": "batch"}).json()
        batch = http.post("/v1/batches", json={"input_file_id": up["id"], "endpoint": "/v1/completions",
                                               "completion_window": "24h"}).json()

        def counts() -> dict:
            return http.get(f"/v1/batches/{batch['id']}").json()["request_counts"]

        eventually(lambda: counts()["total"] == 80, 60, "the batch in progress", interval=0.2)
        fleet.kill_worker(fleet.live()[0], signal.SIGKILL)
        fleet.start_worker(wait=False)
        assert fleet.gateway is not None
        fleet.gateway.stop(signal.SIGKILL)
        fleet.start_gateway()
        fleet.restart_redis()
        eventually(lambda: http_ok(f"{fleet.base}/readyz"), 120, "the fleet back after the Redis restart", interval=0.2)

        def ended() -> bool:
            return http.get(f"/v1/batches/{batch['id']}").json()["status"] in ("completed", "failed", "cancelled")

        eventually(ended, 600, "the batch to end", interval=0.2)
        done = http.get(f"/v1/batches/{batch['id']}").json()
        assert done["status"] == "completed" and done["request_counts"] == {"total": 80, "completed": 80, "failed": 0}
        out = [json.loads(x) for x in http.get(f"/v1/files/{done['output_file_id']}/content").text.splitlines()]
    assert sorted(x["custom_id"] for x in out) == sorted(f"r{i}" for i in range(80))
    assert all(x["response"]["body"]["usage"]["completion_tokens"] == 200 for x in out)
