"""The processes of a multi-model worker's models, as its supervisor (``swapper``) drives them: one
spawned per model at its first wake, or as the worker starts (INFERQ_SWAP_PRESPAWN), a complete
worker of that model (worker/multi/child.py), then put to sleep and woken over a pipe. A model's
process lives from its first wake on: with sleep mode its engine sleeps in it; without, its engine
is stopped and started again, in the same process."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import multiprocessing
import os
import signal
import statistics
import time
from collections import deque
from collections.abc import Callable
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import Any

from inferq.shared.schemas import ModelSlot, ModelState, WorkerInfo
from inferq.shared.served_models import ModelSpec
from inferq.worker.multi.child import ModelStart

log = logging.getLogger(__name__)
ModelMain = Callable[[ModelStart, str], None]  # a model process's entry point: (start, loglevel)


class ModelProcessDied(RuntimeError):
    def __init__(self, name: str, code: int | None) -> None:
        super().__init__(f"the process of model {name!r} exited with code {code}")
        self.model, self.code = name, code


def start_phases(marks: dict[str, float], at: float) -> dict[str, float]:
    """Where a model's start from ``at`` (Unix time) went, from its process's marks (Unix times):
    ``process``: waiting for its process to start and import vLLM (none when it was spawned ahead in
    time); ``setup``: its settings and Celery app; ``engine``: vLLM's engine (its EngineCore's start,
    weights, compilation, CUDA graphs, KV cache), the job path and the worker's registration;
    ``consumer``: Celery's consumer, until it takes jobs."""
    imported = max(marks.get("imported", at), at)
    engine, engine_ready = marks.get("engine", imported), marks.get("engine_ready", imported)
    return {"process": imported - at, "setup": max(engine - imported, 0.0), "engine": engine_ready - engine,
            "consumer": marks.get("ready", engine_ready) - engine_ready}


class ModelProc:
    """One model of the worker: its process (None while cold), its state and its wakes' durations."""

    def __init__(self, spec: ModelSpec, worker_id: str, swapper_id: str, metrics_port: int, main: ModelMain,
                 loglevel: str) -> None:
        self.spec, self.worker_id, self.swapper_id = spec, worker_id, swapper_id
        self.metrics_port, self.main, self.loglevel = metrics_port, main, loglevel
        self.proc: BaseProcess | None = None
        self.conn: Connection | None = None
        self.state: ModelState = "cold"
        self.info: WorkerInfo | None = None  # as of its last wake
        self.wakes: deque[float] = deque(maxlen=8)  # seconds its last wakes took (its start counts while cold)
        self.started_s: float | None = None
        self.parked = False  # its process spawned ahead, waiting to start (INFERQ_SWAP_PRESPAWN)
        self.phases: dict[str, float] = {}  # where its start's seconds went (start_phases)

    @property
    def name(self) -> str:
        return self.spec.name

    def alive(self) -> bool:
        return self.proc is not None and self.proc.is_alive()

    @property
    def exitcode(self) -> int | None:
        return self.proc.exitcode if self.proc is not None else None

    def died(self) -> bool:
        """Started, and exited since."""
        return self.proc is not None and not self.proc.is_alive()

    def wake_estimate(self) -> float | None:
        """What waking it takes: the median of its last wakes (its start, until it has slept once)."""
        if self.wakes:
            return statistics.median(self.wakes)
        return self.started_s

    def slot(self, eta_s: float | None) -> ModelSlot:
        worker = self.worker_id if self.alive() and not self.parked else None
        return ModelSlot(name=self.name, state=self.state, worker=worker,
                         info=self.info, wake_s=self.wake_estimate(), eta_s=eta_s)

    def spawn(self, park: bool) -> None:
        """Start its process; ``park``: it imports, then waits for :meth:`start` (spawned ahead)."""
        parent, child = multiprocessing.get_context("spawn").Pipe()
        start = ModelStart(self.spec, self.worker_id, self.swapper_id, self.metrics_port, child, park=park)
        self.proc = multiprocessing.get_context("spawn").Process(
            target=self.main, args=(start, self.loglevel), name=f"inferq-model-{self.name}")
        self.proc.start()
        child.close()
        self.conn, self.parked = parent, park

    async def start(self, timeout_s: float) -> float:
        """Start its worker (its process first, unless spawned ahead); return once it consumes the
        queue (the seconds it took; ``phases`` says where they went)."""
        t0, at = time.monotonic(), time.time()
        self.state = "waking"
        if self.proc is None:
            self.spawn(park=False)
        elif self.parked:
            assert self.conn is not None
            self.conn.send(("start",))
        self.parked = False
        _, info, marks = await self._receive("ready", timeout_s)
        self.info = WorkerInfo.model_validate_json(info)
        self.state = "awake"
        self.started_s = time.monotonic() - t0
        self.phases = start_phases(marks, at)
        return self.started_s

    async def sleep(self, grace_s: float, timeout_s: float) -> dict[str, Any]:
        """Put it to sleep: its jobs end or go back within ``grace_s``, then its engine sleeps."""
        self.state = "sleeping"
        _, napped, info = await self._call(("sleep", grace_s), grace_s + timeout_s)
        self.info = WorkerInfo.model_validate_json(info)
        self.state = "asleep"
        return dict(napped)

    async def wake_weights(self, timeout_s: float) -> bool:
        """Asleep: its weights back now if they fit beside the awake model (the KV cache at the wake)."""
        _, woken = await self._call(("wake_weights",), timeout_s)
        return bool(woken)

    async def wake(self, timeout_s: float) -> float:
        self.state = "waking"
        _, wake_s, info = await self._call(("wake",), timeout_s)
        self.info = WorkerInfo.model_validate_json(info)
        self.state = "awake"
        self.wakes.append(float(wake_s))
        return float(wake_s)

    async def _call(self, msg: tuple[Any, ...], timeout_s: float) -> tuple[Any, ...]:
        assert self.conn is not None
        self.conn.send(msg)
        return await self._receive({"sleep": "asleep", "wake": "awake", "wake_weights": "weights"}[msg[0]], timeout_s)

    async def _receive(self, expected: str, timeout_s: float) -> tuple[Any, ...]:
        reply: tuple[Any, ...] = await asyncio.to_thread(self._wait, timeout_s)
        if reply[0] != expected:
            raise RuntimeError(f"model {self.name!r}: {reply[0]}: {reply[1:]}")
        return reply

    def _wait(self, timeout_s: float) -> tuple[Any, ...]:
        assert self.conn is not None and self.proc is not None
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                if self.conn.poll(0.2):
                    reply: tuple[Any, ...] = self.conn.recv()
                    return reply
            except (EOFError, OSError):
                pass  # the process is exiting: its exit code says why
            if not self.proc.is_alive():
                raise ModelProcessDied(self.name, self.proc.exitcode)
            if time.monotonic() > deadline:
                raise TimeoutError(f"model {self.name!r}: no answer in {timeout_s:g} s")

    def terminate(self) -> None:
        """SIGTERM: its worker drains (its jobs end, or go back after INFERQ_DRAIN_TIMEOUT_S)."""
        if self.alive() and self.proc is not None and self.proc.pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.proc.pid, signal.SIGTERM)

    def join(self, timeout_s: float) -> None:
        if self.proc is None:
            return
        self.proc.join(timeout_s)
        if self.proc.is_alive():
            log.error("the process of model %r did not stop in time: killing it", self.name)
            self.proc.kill()
            self.proc.join(5)
