"""A multi-model worker's model processes (worker/multi/procs.py) as real spawned processes, around a
stand-in for the model's worker: a process spawned ahead waits, parked, until started; a start says
where its seconds went; a parked process whose supervisor goes away exits."""

from __future__ import annotations

import asyncio
import contextlib
import time

import pytest

from inferq.shared.schemas import WorkerInfo
from inferq.shared.served_models import ModelSpec
from inferq.worker.multi.child import ModelLink, ModelStart
from inferq.worker.multi.procs import ModelProc, start_phases


def stand_in_main(start: ModelStart, loglevel: str) -> None:
    """A model's process as worker.main.model_main runs it, with a worker that starts in 0.2 s."""
    link = ModelLink(start)
    link.mark("imported")
    if start.park and not link.wait_for_start():
        return
    link.mark("engine")
    time.sleep(0.2)
    link.mark("engine_ready")
    link.mark("ready")
    now = time.time()
    info = WorkerInfo(id=start.worker_id, model=start.spec.name, host="h", pid=1, max_model_len=64,
                      max_num_seqs=4, started_at=now, last_seen=now)
    start.conn.send(("ready", info.model_dump_json(), link.marks))
    with contextlib.suppress(EOFError):
        start.conn.recv()


def proc() -> ModelProc:
    return ModelProc(ModelSpec(name="m"), "w.m", "w", 0, stand_in_main, "INFO")


def test_phases_count_from_the_start_and_not_what_came_before_it() -> None:
    marks = {"imported": 95.0, "engine": 101.0, "engine_ready": 110.0, "ready": 111.0}
    assert start_phases(marks, 100.0) == {"process": 0.0, "setup": 1.0, "engine": 9.0, "consumer": 1.0}
    late = start_phases({**marks, "imported": 104.0, "engine": 104.5}, 100.0)
    assert late["process"] == 4.0 and late["setup"] == 0.5, "imports still running at the start are waited for"
    assert sum(start_phases(marks, 100.0).values()) == 11.0


@pytest.mark.timeout(120)
async def test_a_process_spawned_ahead_waits_until_started() -> None:
    m = proc()
    m.spawn(park=True)
    try:
        await asyncio.sleep(1.0)
        assert m.alive() and m.state == "cold" and m.parked
        assert m.slot(None).worker is None, "a parked process is no worker yet"
        taken = await m.start(60)
        assert m.state == "awake" and not m.parked and m.slot(None).worker == "w.m"
        assert set(m.phases) == {"process", "setup", "engine", "consumer"}
        assert m.phases["engine"] >= 0.2 - 0.01
        assert sum(m.phases.values()) <= taken + 0.05
    finally:
        m.terminate()
        m.join(10)


@pytest.mark.timeout(120)
async def test_a_start_without_a_process_spawns_one() -> None:
    m = proc()
    try:
        taken = await m.start(60)
        assert m.alive() and m.state == "awake" and taken >= m.phases["engine"]
    finally:
        m.terminate()
        m.join(10)


@pytest.mark.timeout(120)
def test_a_parked_process_exits_when_its_supervisor_is_gone() -> None:
    m = proc()
    m.spawn(park=True)
    assert m.conn is not None and m.proc is not None
    m.conn.close()
    m.proc.join(60)
    assert m.proc.exitcode == 0
