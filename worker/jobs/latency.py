"""Interactive latency as a worker sees it, and the batch limit that follows its targets
(worker/jobs/classes.py: with ``INFERQ_INTERACTIVE_TTFT_P99_MS`` or ``INFERQ_INTERACTIVE_ITL_P99_MS``
set, each heartbeat a p99 above its target halves how many batch jobs the worker may hold, and one
under every target adds one back)."""

from __future__ import annotations

import threading
import time
from collections import deque

#: Samples of each latency a worker keeps between two adjustments of its batch limit.
SAMPLES = 4096


def p99(xs: list[float]) -> float:
    """The 99th percentile of ``xs`` (nearest rank); 0 for none."""
    if not xs:
        return 0.0
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(0.99 * len(xs)))]


class BatchLimit:
    """How many batch-lane jobs the worker may hold: ``slots`` without targets; with them, halved
    each heartbeat an interactive p99 passes its target, one more each heartbeat under it."""

    def __init__(self, slots: int, ttft_ms: float = 0.0, itl_ms: float = 0.0) -> None:
        self.slots = slots
        self.ttft_s, self.itl_s = ttft_ms / 1000, itl_ms / 1000
        self.value = slots
        self._ttft: deque[float] = deque(maxlen=SAMPLES)
        self._itl: deque[float] = deque(maxlen=SAMPLES)
        self._lock = threading.Lock()
        self.last: tuple[float, float] = (0.0, 0.0)  # the p99s the last adjustment saw (s)

    @property
    def targets(self) -> bool:
        return bool(self.ttft_s or self.itl_s)

    def first_token(self, seconds: float) -> None:
        if self.ttft_s:
            with self._lock:
                self._ttft.append(seconds)

    def gaps(self, seconds: list[float]) -> None:
        if self.itl_s and seconds:
            with self._lock:
                self._itl.extend(seconds)

    def adjust(self) -> int:
        """One step (each heartbeat): the new limit, from the samples since the last step."""
        if not self.targets:
            return self.value
        with self._lock:
            ttft, itl = p99(list(self._ttft)), p99(list(self._itl))
            self._ttft.clear()
            self._itl.clear()
        self.last = (ttft, itl)
        over = (self.ttft_s and ttft > self.ttft_s) or (self.itl_s and itl > self.itl_s)
        self.value = self.value // 2 if over else min(self.slots, self.value + 1)
        return self.value


class Watch:
    """One generation's latencies, as its outputs come, for the batch limit (``limit`` None: not
    watched, a batch job's or with classes off)."""

    FLUSH = 64  # gaps kept before they go to the limit

    def __init__(self, limit: BatchLimit | None, created_at: float) -> None:
        self.limit, self.created_at = limit, created_at
        self._last: float | None = None
        self._gaps: list[float] = []

    def output(self) -> None:
        if self.limit is None:
            return
        now = time.monotonic()
        if self._last is None:
            self.limit.first_token(max(0.0, time.time() - self.created_at))  # since it was queued
        else:
            self._gaps.append(now - self._last)
            if len(self._gaps) >= self.FLUSH:
                self.flush()
        self._last = now

    def flush(self) -> None:
        if self.limit is not None and self._gaps:
            self.limit.gaps(self._gaps)
            self._gaps = []
