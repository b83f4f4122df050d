"""Process helpers shared by ``inferq up``, the benchmark harness and the tests."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import pytest

from inferq.cli.procs import Procs, http_ok, redis_pings, start_redis, wait_until
from tests.procs import free_port
from tests.wait import eventually


def test_start_redis_returns_once_it_answers_and_stop_ends_it(tmp_path) -> None:
    server = start_redis(free_port(), tmp_path, name="r")
    try:
        assert redis_pings(server.url) and server.alive()
    finally:
        server.stop(signal.SIGKILL)
    assert not server.alive() and not redis_pings(server.url)


def test_wait_until_fails_early_with_the_log_of_a_process_that_exited(tmp_path) -> None:
    """The CLI's own wait (the tests wait with tests.wait.eventually)."""
    with Procs(tmp_path) as procs:
        p = procs.start("crash", [sys.executable, "-c", "print('boom'); raise SystemExit(3)"])
        with pytest.raises(RuntimeError, match=r"crash exited with code 3(.|\n)*boom"):
            wait_until(lambda: False, 30, "never", procs.procs)
        with pytest.raises(TimeoutError):
            wait_until(lambda: False, 0.1, "nothing to watch")
    assert p.returncode == 3 and not procs.procs


def test_http_ok_is_false_when_nothing_listens() -> None:
    assert not http_ok(f"http://127.0.0.1:{free_port()}/healthz", timeout=0.5)


def test_a_process_gets_its_own_group_in_our_session_and_stop_reaches_its_children(tmp_path) -> None:
    """Our session (one scheduling group under sched_autogroup, cli.procs.Proc), a process group
    of its own (a stop signals the process and what it started)."""
    child_code = ("import subprocess, sys, time; "
                  "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
                  "print('up', flush=True); time.sleep(60)")
    with Procs(tmp_path) as procs:
        p = procs.start("parent", [sys.executable, "-c", child_code])
        eventually(lambda: "up" in p.tail(), 30, "the parent and its child started", procs=[p])
        assert os.getsid(p.pid) == os.getsid(0)
        assert os.getpgid(p.pid) == p.pid != os.getpgid(0)
        members = [int(x) for x in os.popen(f"pgrep -g {p.pid}").read().split()]
        assert len(members) == 2, members
        p.stop()
        # stop() waits for the parent only; the child, signalled with it, is reaped by whoever
        # inherits it: wait until both are gone (or zombies)
        eventually(lambda: all(ended(m) for m in members), 30, f"every process of the group ended: {members}")


def ended(pid: int) -> bool:
    """The process is gone, or a zombie: it has exited, not yet reaped."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] == "Z"  # the state, after the name (which may hold spaces)


def test_an_interrupted_stop_leaves_kill_the_process_it_was_stopping(tmp_path) -> None:
    """``inferq up``: a second Ctrl-C while a worker takes its grace kills what is left at once."""
    stubborn = ("import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('up', flush=True); "
                "time.sleep(60)")
    procs = Procs(tmp_path)
    first = procs.start("first", [sys.executable, "-c", stubborn])
    worker = procs.start("worker", [sys.executable, "-c", stubborn])
    eventually(lambda: "up" in first.tail() and "up" in worker.tail(), 30, "both started", procs=procs.procs)

    def interrupt(*_: object) -> None:
        raise KeyboardInterrupt

    old = signal.signal(signal.SIGALRM, interrupt)
    signal.setitimer(signal.ITIMER_REAL, 0.5)  # the second Ctrl-C, while the worker ignores SIGTERM
    try:
        with pytest.raises(KeyboardInterrupt):
            procs.stop()
    finally:
        signal.signal(signal.SIGALRM, old)
    assert [p.name for p in procs.procs] == ["first", "worker"] and worker.alive()
    started = time.monotonic()
    procs.kill()
    assert not procs.procs and not first.alive() and not worker.alive()
    assert time.monotonic() - started < 5
