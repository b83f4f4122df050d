"""An engine group (INFERQ_FRONTENDS=2): two workers as clients of one EngineCore. Each holds its
share of the engine's sequences; cancel, engine death and SIGTERM drain (these two under
``make test-faults``) work as for a lone worker."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from collections.abc import Iterator

import httpx
import psutil
import pytest
import redis

from inferq.shared import keys
from tests.conftest import ahead, take
from tests.fleet import Fleet
from tests.helpers import LONG_JOB, submit, wait_status
from tests.wait import eventually

pytestmark = pytest.mark.integration
SEQS = 8  # 4 job slots per frontend


@ahead("group")
def start_group(request: pytest.FixtureRequest) -> Fleet:
    """Redis, a gateway and one worker that is an engine group of 2 (not waited for)."""
    f = Fleet(request.getfixturevalue("logdir"), extra_env={
        "INFERQ_FRONTENDS": "2", "INFERQ_MAX_NUM_SEQS": str(SEQS), "INFERQ_DRAIN_TIMEOUT_S": "60",
        "INFERQ_INTERACTIVE_RESERVE": "0"})  # the engine runs SEQS, interactive work no more
    return f.launch()


@pytest.fixture(scope="module")
def group(request: pytest.FixtureRequest) -> Iterator[Fleet]:
    f = take("group", request)
    try:
        for wid in list(f.workers):
            f.wait_worker(wid)
        yield f
    finally:
        f.stop()


def running(fleet: Fleet, job_ids: list[str]) -> dict[str, str]:
    """Job id -> worker id, for the jobs that are running now (read from Redis)."""
    r = redis.Redis(port=fleet.redis_port, decode_responses=True)
    out = {}
    for job_id in job_ids:
        status, worker = r.hmget(keys.job(job_id), ["status", "worker"])
        if status == '"running"' and worker:
            out[job_id] = json.loads(worker)
    return out


def attempts(fleet: Fleet, job_ids: list[str]) -> list[int]:
    r = redis.Redis(port=fleet.redis_port, decode_responses=True)
    return [int(json.loads(r.hget(keys.job(j), "attempt") or "0")) for j in job_ids]


def long_jobs(http: httpx.Client, n: int, tag: str) -> list[str]:
    return [submit(http, prompt=f"{tag} {i}", max_tokens=LONG_JOB, ignore_eos=True) for i in range(n)]


def test_frontends_register_as_workers_of_one_engine(group: Fleet) -> None:
    with group.http() as http:
        workers = http.get("/v1/workers").json()
    (wid,) = group.live()
    assert sorted(w["id"] for w in workers) == [f"{wid}-0", f"{wid}-1"]
    assert sorted(w["frontend"] for w in workers) == [0, 1]
    assert {w["frontends"] for w in workers} == {2}
    assert {w["max_num_seqs"] for w in workers} == {SEQS}
    assert len({w["pid"] for w in workers}) == 2  # two processes
    group_pid = group.workers[wid].proc.pid
    assert {psutil.Process(w["pid"]).ppid() for w in workers} == {group_pid}


def test_each_frontend_holds_its_share_and_cancel_reaches_the_engine(group: Fleet) -> None:
    with group.http() as http:
        jobs = long_jobs(http, SEQS + 2, "share")
        # the engine runs SEQS at once; a frontend takes SEQS/2: all SEQS running needs both
        eventually(lambda: len(running(group, jobs)) == SEQS, 120, f"{SEQS} jobs running at once", interval=0.2)
        held = running(group, jobs)
        per_worker = {w: sum(1 for v in held.values() if v == w) for w in set(held.values())}
        queued = [j for j in jobs if j not in held]
        assert len(per_worker) == 2 and set(per_worker.values()) == {SEQS // 2}, per_worker
        assert all(http.get(f"/v1/jobs/{j}").json()["status"] == "queued" for j in queued)
        for j in jobs:
            assert http.delete(f"/v1/jobs/{j}").status_code == 202
        views = [wait_status(http, j, timeout=120) for j in jobs]
    assert {v["status"] for v in views} == {"cancelled"}, [v["status"] for v in views]
    assert all(v["usage"]["completion_tokens"] < LONG_JOB for v in views if v["usage"])

    def engine_idle() -> bool:
        with group.http() as http:
            return all(w["stats"]["engine_requests"] == 0 for w in http.get("/v1/workers").json())
    eventually(engine_idle, 30, "the engine's requests aborted", interval=0.2)


@pytest.mark.faults
def test_engine_death_hands_every_job_back_and_the_group_exits_4(group: Fleet) -> None:
    (wid,) = group.live()
    proc = group.workers[wid].proc
    with group.http() as http:
        jobs = long_jobs(http, 4, "death")
        eventually(lambda: len(running(group, jobs)) == 4, 120, "4 jobs running", interval=0.2)
        cores = [c for c in psutil.Process(proc.pid).children(recursive=True)
                 if "EngineCore" in c.name() or "EngineCore" in " ".join(c.cmdline())]
        assert cores, "found the engine core"
        for c in cores:
            c.kill()
        assert proc.wait(120) == 4
        group.workers.pop(wid)
        # nothing lost: a new group takes the jobs back up and runs them to their end
        group.start_worker()
        views = [wait_status(http, j, timeout=300) for j in jobs]
    assert [v["status"] for v in views] == ["succeeded"] * 4
    assert all(v["usage"]["completion_tokens"] == LONG_JOB for v in views)
    assert all(a >= 2 for a in attempts(group, jobs)), attempts(group, jobs)


@pytest.mark.faults
def test_sigterm_drains_every_frontend_then_the_group_exits_0(group: Fleet) -> None:
    (wid,) = group.live()
    proc = group.workers[wid].proc
    with group.http() as http:
        jobs = [submit(http, prompt=f"drain {i}", max_tokens=1000, ignore_eos=True) for i in range(SEQS)]
        # every job held (a job still queued at SIGTERM has nobody to run it here)
        eventually(lambda: len(running(group, jobs)) == SEQS, 120, f"all {SEQS} jobs running", interval=0.2)
        proc.send_signal(signal.SIGTERM)
        draining: set[str] = set()  # every frontend seen draining (while the jobs run, before the exit)

        def both_draining() -> set[str]:
            draining.update(w["id"] for w in http.get("/v1/workers").json() if w["draining"])
            return draining

        eventually(both_draining, 30, "both frontends listed as draining", until=lambda d: len(d) >= 2, interval=0.1)
        assert proc.wait(120) == 0
        group.workers.pop(wid)
        views = [wait_status(http, j, timeout=60) for j in jobs]
    assert draining == {f"{wid}-0", f"{wid}-1"}
    # both frontends finished what they held within the grace period: nothing was handed back
    assert [v["status"] for v in views] == ["succeeded"] * SEQS
    assert attempts(group, jobs) == [1] * SEQS


@pytest.mark.faults  # a fault, and half a minute of CI: with the other faults (make test-faults)
def test_a_group_whose_engine_cannot_start_exits_3(redis_server, tmp_path) -> None:
    """As a lone worker: a supervisor sees the start-up failure, not a hung group."""
    from tests.conftest import inferq_env

    env = inferq_env(redis_server.url, INFERQ_FRONTENDS="2", INFERQ_MODEL=str(tmp_path / "no-such-model"))
    proc = subprocess.run([sys.executable, "-m", "inferq.cli", "worker"], env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 3, proc.stderr[-2000:]
    assert "the engine could not start" in proc.stderr
