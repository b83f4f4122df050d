"""tests.wait: the one way the tests wait for something (no engine, no Redis)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from inferq.cli.procs import Procs
from tests.wait import WaitTimeout, eventually, eventually_async


def test_it_returns_the_first_value_that_holds() -> None:
    values = iter([0, None, "", 3, 4])
    assert eventually(lambda: next(values), 10, "a truthy value", interval=0) == 3
    counts = iter(range(100))
    assert eventually(lambda: next(counts), 10, "five", until=lambda n: n >= 5, interval=0) == 5


def test_a_timeout_names_what_was_awaited_and_the_last_value_seen() -> None:
    with pytest.raises(WaitTimeout, match=r"after 0.1 s waiting for: the answer; last seen: \{'answer': 41\}"):
        eventually(lambda: {"answer": 41}, 0.1, "the answer", until=lambda v: v["answer"] == 42)
    assert issubclass(WaitTimeout, AssertionError) and issubclass(WaitTimeout, TimeoutError)


def test_it_checks_once_more_at_the_deadline() -> None:
    calls: list[int] = []
    with pytest.raises(WaitTimeout):
        eventually(lambda: calls.append(1), 0, "nothing")
    assert calls == [1]
    # a pause is cut to what is left of the timeout, and the probe runs again at the deadline: a
    # condition that came true meanwhile is seen there (not after the 60 s interval, not missed)
    answers = iter([False, True])
    assert eventually(lambda: next(answers), 0.2, "the second answer", interval=60)


def test_errors_of_the_probe_propagate_unless_ignored() -> None:
    with pytest.raises(KeyError):
        eventually(lambda: {}["x"], 10, "a key")
    answers = iter([ConnectionError("down"), ConnectionError("down"), "up"])

    def probe() -> str:
        a = next(answers)
        if isinstance(a, Exception):
            raise a
        return a

    assert eventually(probe, 10, "the server", ignore=(ConnectionError,), interval=0) == "up"
    with pytest.raises(WaitTimeout, match="ConnectionError") as e:
        eventually(lambda: (_ for _ in ()).throw(ConnectionError("still down")), 0.1, "the server",
                   ignore=(ConnectionError,))
    assert isinstance(e.value.__cause__, ConnectionError)


def test_a_watched_process_that_exits_fails_the_wait_at_once(tmp_path) -> None:
    with Procs(tmp_path) as procs:
        procs.start("crash", [sys.executable, "-c", "print('boom'); raise SystemExit(3)"])
        with pytest.raises(RuntimeError, match=r"the service: crash exited with code 3(.|\n)*boom"):
            eventually(lambda: False, 60, "the service", procs=procs.procs)
    popen = subprocess.Popen([sys.executable, "-c", "raise SystemExit(5)"])
    with pytest.raises(RuntimeError, match="exited with code 5"):
        eventually(lambda: False, 60, "a Popen", procs=[popen])


async def test_the_async_form_awaits_coroutines_and_takes_plain_functions() -> None:
    seen: list[int] = []

    async def grows() -> list[int]:
        seen.append(len(seen))
        return seen

    assert await eventually_async(grows, 10, "three", until=lambda s: len(s) >= 3, interval=0) == [0, 1, 2]
    assert await eventually_async(lambda: grows(), 10, "four", until=lambda s: len(s) >= 4, interval=0) == [0, 1, 2, 3]
    assert await eventually_async(lambda: len(seen), 10, "a count") == 4
    with pytest.raises(WaitTimeout, match="waiting for: never; last seen: False"):
        await eventually_async(lambda: False, 0.05, "never")
