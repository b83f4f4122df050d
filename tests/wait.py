"""Waiting in tests: poll until something holds, with a deadline that names what was awaited.

Every wait in the tests goes through :func:`eventually` (or :func:`eventually_async` in a coroutine),
never through a fixed sleep: a wait on the real condition ends as soon as it holds on a fast machine
and still holds on a busy one, where only the deadline, set generously, is longer.

    view = eventually(lambda: http.get(url).json(), 60, "the job to end",
                      until=lambda v: v["status"] in TERMINAL_STATUSES)
    await eventually_async(lambda: store.get(job_id), 10, "the record", until=lambda rec: rec is not None)
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, Protocol, TypeVar

from inferq.cli.procs import Proc

T = TypeVar("T")
__all__ = ["WaitTimeout", "eventually", "eventually_async"]


class WaitTimeout(AssertionError, TimeoutError):
    """What was awaited never held before the deadline: a failed assertion to pytest, and a
    ``TimeoutError`` to code that catches one."""


class Polled(Protocol):
    """A process :func:`eventually` watches: a :class:`inferq.cli.procs.Proc` or a ``Popen``."""

    returncode: int | None

    def poll(self) -> int | None: ...


def _shown(value: object, limit: int = 2000) -> str:
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


class _Waiting:
    """One wait's state and its checks, shared by the sync and async forms."""

    def __init__(self, timeout: float, what: str, until: Callable[[Any], object], procs: Iterable[Polled],
                 ignore: tuple[type[BaseException], ...]) -> None:
        self.timeout, self.what, self.until, self.ignore = timeout, what, until, ignore
        self.procs = list(procs)
        self.deadline = time.monotonic() + timeout
        self.last: object = None
        self.error: BaseException | None = None

    def held(self, value: object) -> bool:
        self.last, self.error = value, None
        return bool(self.until(value))

    def failed(self, error: BaseException) -> None:
        if not isinstance(error, self.ignore):
            raise error
        self.last, self.error = error, error

    def pause(self, interval: float) -> float:
        """Raise if a watched process exited or the deadline passed; else how long to sleep."""
        for p in self.procs:
            if p.poll() is not None:
                who = p.name if isinstance(p, Proc) else getattr(p, "args", p)
                tail = f"; last lines of {p.log}:\n{p.tail()}" if isinstance(p, Proc) else ""
                raise RuntimeError(f"{self.what}: {who} exited with code {p.returncode}{tail}")
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise WaitTimeout(f"timed out after {self.timeout:g} s waiting for: {self.what}; "
                              f"last seen: {_shown(self.last)}") from self.error
        return min(interval, left)


def eventually(probe: Callable[[], T], timeout: float, what: str, *, until: Callable[[T], object] = bool,
               interval: float = 0.05, procs: Iterable[Polled] = (),
               ignore: tuple[type[BaseException], ...] = ()) -> T:
    """Call ``probe()`` every ``interval`` seconds until ``until(value)`` holds (by default: until
    the value is truthy) and return that value.

    After ``timeout`` seconds raise :class:`WaitTimeout` naming ``what`` and the last value seen
    (the probe is always called at least once, and once more at the deadline). ``procs``: fail at
    once (RuntimeError, with the end of its log) if one of these processes exits. ``ignore``:
    exceptions of these types raised by the probe count as "not yet" (the last one is chained to
    the timeout); any other propagates at once."""
    w = _Waiting(timeout, what, until, procs, ignore)
    while True:
        try:
            value = probe()
        except Exception as e:
            w.failed(e)
        else:
            if w.held(value):
                return value
        time.sleep(w.pause(interval))


async def eventually_async(probe: Callable[[], T | Awaitable[T]], timeout: float, what: str, *,
                           until: Callable[[T], object] = bool, interval: float = 0.05,
                           procs: Iterable[Polled] = (), ignore: tuple[type[BaseException], ...] = ()) -> T:
    """:func:`eventually` in a coroutine: the event loop runs while it waits, and ``probe`` may be
    a plain function or return an awaitable (a coroutine function, a lambda calling one), which is
    awaited. Returns the probe's value that satisfied ``until``."""
    w = _Waiting(timeout, what, until, procs, ignore)
    while True:
        try:
            value = probe()
            if inspect.isawaitable(value):
                value = await value
        except Exception as e:
            w.failed(e)
        else:
            if w.held(value):
                return value  # type: ignore[return-value]
        await asyncio.sleep(w.pause(interval))
