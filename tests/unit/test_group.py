"""The engine group's supervisor (worker/engine/group.py) on real child processes standing in for the
frontends and the EngineCore: who stops whom, and the group's exit code."""

from __future__ import annotations

import multiprocessing
import os
import signal
import time
from typing import Any

import pytest

from inferq.shared.settings import Settings
from inferq.worker.engine.group import Frontend, _Stopping, _supervise, frontend_slots

CTX = multiprocessing.get_context("fork")


def _serve(exit_code: int, after_s: float | None, on_term: int, ready: Any) -> None:
    """A frontend stand-in: exit ``exit_code`` after ``after_s`` (None: never), ``on_term`` on SIGTERM."""
    signal.signal(signal.SIGTERM, lambda *_: os._exit(on_term))
    ready.set()
    time.sleep(after_s if after_s is not None else 60)
    os._exit(exit_code)


def start(exit_code: int = 0, after_s: float | None = None, on_term: int = 0) -> multiprocessing.Process:
    """Started, with its SIGTERM handler in place (a signal sent before would kill it outright)."""
    ready = CTX.Event()
    p = CTX.Process(target=_serve, args=(exit_code, after_s, on_term, ready))
    p.start()
    assert ready.wait(30), "the stand-in did not start"
    return p


SETTINGS = Settings(drain_timeout_s=5, worker_ttl_s=2)


def test_a_frontend_that_exits_stops_the_others_and_gives_its_code() -> None:
    frontends = [start(3, after_s=0.2), start(on_term=0)]
    engine = start()
    try:
        code = _supervise(frontends, [engine], _Stopping(frontends), SETTINGS)
    finally:
        engine.kill()
    assert code == 3
    assert [p.exitcode for p in frontends] == [3, 0]  # the other one was sent SIGTERM and drained


def test_engine_death_is_code_4_and_the_frontends_exit_on_their_own() -> None:
    engine = start(9, after_s=0.2)
    frontends = [start(4, after_s=1.0), start(4, after_s=1.5)]
    code = _supervise(frontends, [engine], _Stopping(frontends), SETTINGS)
    assert code == 4
    assert [p.exitcode for p in frontends] == [4, 4]


def test_a_requested_stop_drains_every_frontend_and_is_code_0() -> None:
    frontends = [start(on_term=0), start(on_term=0)]
    engine = start()
    stopping = _Stopping(frontends)
    try:
        stopping.handle(signal.SIGTERM, None)
        code = _supervise(frontends, [engine], stopping, SETTINGS)
    finally:
        engine.kill()
    assert code == 0
    assert [p.exitcode for p in frontends] == [0, 0]


def test_frontends_that_outlive_the_grace_period_are_left_to_the_caller_to_kill() -> None:
    stubborn = [CTX.Process(target=time.sleep, args=(60,))]  # ignores nothing, but gets no signal
    stubborn[0].start()
    stopping = _Stopping([])
    stopping.requested = True
    stopping.since = time.monotonic() - 31  # drain timeout 0 + 30 s: the grace period is over
    try:
        assert _supervise(stubborn, [], stopping, Settings(drain_timeout_s=0)) == 0
        assert stubborn[0].is_alive()
    finally:
        stubborn[0].kill()


@pytest.mark.parametrize(("seqs", "n", "slots"), [(256, 4, 64), (8, 3, 3), (2, 4, 1)])
def test_frontend_slots_cover_the_engine(seqs: int, n: int, slots: int) -> None:
    assert frontend_slots(seqs, n) == slots
    assert frontend_slots(seqs, n) * n >= seqs


def test_engine_gone_when_its_pid_or_the_group_is_gone() -> None:
    alive = start()
    try:
        fe = Frontend(0, 2, "m", None, {}, engine_pids=[alive.pid or 0], group_pid=os.getppid())
        assert not fe.engine_gone()
        alive.kill()
        alive.join()
        assert fe.engine_gone()
        assert Frontend(0, 2, "m", None, {}, engine_pids=[], group_pid=os.getpid()).engine_gone()
    finally:
        alive.kill()
