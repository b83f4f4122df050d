"""The engine died: hand every active job back, then exit with code 4 for a supervisor to restart.

Either a job sees ``EngineDeadError`` or the heartbeat sees ``engine.errored``; both call
:meth:`EngineDeath.trigger`. A thread of its own runs the hand-back on the engine loop, waits for
it (bounded: a wedged loop must not keep a dead worker alive) and only then exits.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import os
import threading
from collections.abc import Callable, Coroutine
from typing import Any

log = logging.getLogger(__name__)
EXIT_CODE = 4


def kill_children() -> None:
    """Kill this process's children (the engine core and its workers) before a hard exit."""
    import psutil

    for child in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.Error):
            child.kill()


def hard_exit(code: int) -> None:
    log.critical("the engine died: exiting with code %s so that a supervisor restarts the worker", code)
    kill_children()
    logging.shutdown()
    os._exit(code)


class EngineDeath:
    def __init__(self, loop: asyncio.AbstractEventLoop, hand_back_all: Callable[[], Coroutine[Any, Any, None]],
                 timeout_s: float, exit: Callable[[int], None] = hard_exit) -> None:
        self.loop = loop
        self.hand_back_all = hand_back_all
        self.timeout_s = timeout_s
        self.exit = exit
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    @property
    def triggered(self) -> bool:
        return self._thread is not None

    def trigger(self) -> None:
        """Start the exit path (once; from any thread, without blocking)."""
        with self._lock:
            if self._thread is not None:
                return
            self._thread = threading.Thread(target=self._run, name="engine-death", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        log.critical("the engine is dead: handing every job back to the queue")
        try:
            asyncio.run_coroutine_threadsafe(self.hand_back_all(), self.loop).result(self.timeout_s)
        except concurrent.futures.TimeoutError:
            log.error("jobs not all handed back after %g s; exiting anyway (the reaper takes the rest)",
                      self.timeout_s)
        except Exception:
            log.exception("handing the jobs back failed; exiting anyway (the reaper takes the rest)")
        self.exit(EXIT_CODE)
