"""LoopThread: an asyncio event loop of its own, in a daemon thread.

The heartbeat and the reaper each run on one, with their own Redis client, so that neither waits
for the engine's loop (which the token path can keep busy for seconds) nor for each other.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import threading
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


class LoopThread:
    def __init__(self, name: str) -> None:
        self.name = name
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._serve, name=name, daemon=True)

    def _serve(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def start(self) -> None:
        self._thread.start()

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        """Schedule ``coro`` on this loop (from any thread)."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def run(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        """Run ``coro`` on this loop and wait for its result (from another thread)."""
        return self.submit(coro).result(timeout)

    def stop(self, timeout: float = 5.0, close: Callable[[], Awaitable[None]] | None = None) -> None:
        """Cancel what still runs on the loop, then await ``close()`` there (e.g. close a Redis
        client of this loop), stop the loop and wait for the thread."""
        if not self._thread.is_alive():
            return
        with contextlib.suppress(concurrent.futures.TimeoutError, RuntimeError):
            self.run(_cancel_others(close), timeout)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout)
        if not self._thread.is_alive():
            self.loop.close()


async def _cancel_others(close: Callable[[], Awaitable[None]] | None) -> None:
    me = asyncio.current_task()
    tasks = [t for t in asyncio.all_tasks() if t is not me]
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    if close is not None:
        await close()
