"""The fleet benchmark's restart case: while vLLM's client runs, one worker is SIGKILLed (its process
group: the engine dies with it, as on a lost host) and started again at once with the same worker
id; every :data:`STEP_S` the fleet's prefix-cache counters are read, so the run says how the hit
rate fell and how soon after the new engine was up it was back.

Its engine comes back as a new instance holding nothing, and the fleet's index ignores what the old
instance held (docs/design.md, "cache-affine pull"): the figure to watch is how long the hit rate
takes to return, and that the client saw no request fail (the killed worker's jobs are sent again).
"""

from __future__ import annotations

import signal
import threading
import time
from typing import Any

import httpx

from bench.sessions import metric_sum
from inferq.cli.procs import Proc, Procs, http_ok

#: How often the fleet's counters are read (seconds).
STEP_S = 2.0
#: The share of the steady hit rate that counts as recovered.
RECOVERED = 0.9


def counters(port: int) -> tuple[float, float] | None:
    """A worker's prefix-cache hits and queries (tokens), or None while it does not answer."""
    try:
        text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=2).text
    except httpx.HTTPError:
        return None
    return metric_sum(text, "vllm:prefix_cache_hits_total"), metric_sum(text, "vllm:prefix_cache_queries_total")


class Restarter(threading.Thread):
    """Samples the fleet's counters; at ``kill_at_s`` kills worker ``index`` and starts it again."""

    def __init__(self, procs: Procs, ports: list[int], index: int, kill_at_s: float, base: str, tag: str) -> None:
        super().__init__(name="restarter", daemon=True)
        self.procs, self.ports, self.index, self.kill_at_s, self.base = procs, ports, index, kill_at_s, base
        self.name_of = f"worker-{tag}-{index}"
        self.done = threading.Event()
        self.samples: list[tuple[float, list[tuple[float, float] | None]]] = []
        self.killed_at: float | None = None
        self.killed_wall = 0.0
        self.ready_at: float | None = None
        self.error: str | None = None

    def run(self) -> None:
        t0 = time.monotonic()
        try:
            while not self.done.wait(STEP_S):
                now = time.monotonic() - t0
                self.samples.append((now, [counters(p) for p in self.ports]))
                if self.killed_at is None and now >= self.kill_at_s:
                    self._restart()
                    self.killed_at = now
                elif self.killed_at is not None and self.ready_at is None and self._ready():
                    self.ready_at = time.monotonic() - t0
        except Exception as e:  # noqa: BLE001 (reported with the run, not raised on a thread)
            self.error = repr(e)

    def _restart(self) -> None:
        old = next(p for p in self.procs.procs if p.name == self.name_of)
        self.killed_wall = time.time()
        old.stop(signal.SIGKILL, grace=0)
        self.procs.procs.remove(old)
        self.procs.add(Proc(old.name, old.cmd, old.env, old.log, old.cwd))

    def _ready(self) -> bool:
        """The gateway lists a worker that started after the kill (the new process, engine up)."""
        return http_ok(f"{self.base}/v1/workers",
                       lambda body: any(w.get("started_at", 0) > self.killed_wall for w in body))

    def report(self) -> dict[str, Any]:
        """The hit rate window by window and :func:`recovery`'s figures."""
        windows: list[tuple[float, float | None]] = []
        for (_, before), (t, after) in zip(self.samples, self.samples[1:], strict=False):
            hits = queries = 0.0
            for b, a in zip(before, after, strict=True):
                if a is None:
                    continue
                db, dq = (a[0] - b[0], a[1] - b[1]) if b is not None and a[1] >= b[1] else a  # a restart: from 0
                hits, queries = hits + db, queries + dq
            windows.append((round(t, 1), hits / queries if queries > 0 else None))
        out: dict[str, Any] = {"kill_at_s": self.killed_at, "ready_at_s": self.ready_at, "error": self.error,
                               "windows": windows}
        return {**out, **recovery(windows, self.killed_at, self.ready_at)}


def recovery(windows: list[tuple[float, float | None]], killed_at: float | None,
             ready_at: float | None) -> dict[str, Any]:
    """From the windows' hit rates: the steady rate (the windows of the second half of the time
    before the kill: the first fills the caches), the lowest after the kill, and the seconds after
    the new engine was up (and after the kill) until a window's rate was back to
    :data:`RECOVERED` of the steady one."""
    if killed_at is None:
        return {}
    steady_rows = [r for t, r in windows if killed_at / 2 <= t <= killed_at and r is not None]
    steady = sum(steady_rows) / len(steady_rows) if steady_rows else None
    after = [(t, r) for t, r in windows if t > killed_at and r is not None]
    out: dict[str, Any] = {"steady": steady, "lowest_after_kill": min((r for _, r in after), default=None)}
    if steady is not None and ready_at is not None:
        back = next((t for t, r in after if t > ready_at and r >= RECOVERED * steady), None)
        out.update(recovered_after_ready_s=None if back is None else round(back - ready_at, 1),
                   recovered_after_kill_s=None if back is None else round(back - killed_at, 1))
    return out
