"""One model's process of a multi-model worker: a complete worker of that model (Celery consumer,
runner, heartbeat, reaper), which its supervisor (``swapper``) puts to sleep and wakes over a pipe.

A process the supervisor spawns ahead (``INFERQ_SWAP_PRESPAWN``) imports vLLM and the worker's modules,
then waits for ``("start",)`` before it starts its engine: a model's first start then skips its
process's start and imports, where they are done by then.

Messages from the supervisor: ``("start",)`` (a process spawned ahead), ``("sleep", grace_s)``,
``("wake_weights",)`` and ``("wake",)``; answers:
``("ready", info, marks)`` once the worker consumes its queue (``marks``: when it reached each step
of its start, Unix time), ``("asleep", napped, info)``,
``("weights", woken)``, ``("awake", wake_s, info)`` or
``("error", text)`` (the process then takes the engine-death path: every job back, exit 4). A pipe
that closes (the supervisor is gone) drains the process as SIGTERM does.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import signal
import threading
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

from inferq.shared import keys, logs
from inferq.shared.served_models import ModelSpec
from inferq.shared.settings import Settings, get_settings
from inferq.worker.multi.nap import CeleryConsumption, put_to_sleep, wake, wake_weights
from inferq.worker.runtime import WorkerRuntime

log = logging.getLogger(__name__)
#: Settings of the worker that its models' processes do not inherit (each model sets its own).
NOT_INHERITED = ("INFERQ_MODEL", "INFERQ_SERVED_MODEL_NAME", "INFERQ_WORKER_ID", "INFERQ_METRICS_PORT")


@dataclass
class ModelStart:
    """What a model's process needs (picklable, sent at spawn)."""

    spec: ModelSpec
    worker_id: str
    swapper_id: str
    metrics_port: int
    conn: Connection
    park: bool = False  # spawned ahead: import, then wait for ("start",)


class ModelLink:
    """The process's end of its supervisor's pipe, and the thread that serves it."""

    def __init__(self, start: ModelStart) -> None:
        self.start = start
        self.conn = start.conn
        self.runtime: WorkerRuntime | None = None
        self.consumption: CeleryConsumption | None = None
        self.marks: dict[str, float] = {}  # step -> Unix time (procs.start_phases)

    def mark(self, step: str) -> None:
        self.marks[step] = time.time()

    def wait_for_start(self) -> bool:
        """A process spawned ahead: block until the supervisor starts it (False: the supervisor is gone)."""
        try:
            msg = self.conn.recv()
        except (EOFError, OSError):
            return False
        if msg != ("start",):
            raise ValueError(f"expected ('start',), got {msg!r}")
        return True

    def ready(self, runtime: WorkerRuntime, app: Any, nodename: str) -> None:
        """The worker consumes its queue (Celery's worker_ready): tell the supervisor, then serve it."""
        runtime.swapper = self.start.swapper_id
        model = runtime.settings.model_name
        queues = [keys.queue(model)] + ([keys.lane(model, runtime.id)] if runtime.affinity is not None else [])
        self.runtime, self.consumption = runtime, CeleryConsumption(app, nodename, queues)
        self.mark("ready")
        self.conn.send(("ready", runtime.describe().model_dump_json(), self.marks))
        threading.Thread(target=self._serve, name="model-link", daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                msg = self.conn.recv()
            except (EOFError, OSError):
                log.warning("the multi-model worker's supervisor is gone: draining")
                os.kill(os.getpid(), signal.SIGTERM)
                return
            try:
                self.conn.send(self._answer(msg))
            except Exception as e:
                log.exception("%s failed: taking the engine-death path", msg[0])
                self.conn.send(("error", f"{msg[0]}: {type(e).__name__}: {e}"))
                if self.runtime is not None:
                    self.runtime.on_engine_dead()
                return

    def _answer(self, msg: tuple[Any, ...]) -> tuple[Any, ...]:
        rt, consumption = self.runtime, self.consumption
        assert rt is not None and consumption is not None
        if msg[0] == "sleep":
            napped = put_to_sleep(rt, consumption, float(msg[1]))
            return "asleep", dataclasses.asdict(napped), rt.describe().model_dump_json()
        if msg[0] == "wake_weights":
            return "weights", wake_weights(rt)
        if msg[0] == "wake":
            wake_s = wake(rt, consumption)
            return "awake", wake_s, rt.describe().model_dump_json()
        raise ValueError(f"unknown message {msg[0]!r}")


#: Set in a model's process before its worker starts; None in any other worker.
LINK: ModelLink | None = None



def become_model(start: ModelStart) -> Settings:
    """Make this (spawned) process the worker of ``start.spec``: its settings, logs and link."""
    global LINK
    for name in NOT_INHERITED:
        os.environ.pop(name, None)
    os.environ.update(start.spec.env())
    os.environ["INFERQ_WORKER_ID"] = start.worker_id
    os.environ["INFERQ_METRICS_PORT"] = str(start.metrics_port)
    get_settings.cache_clear()
    settings = get_settings()
    logs.setup(settings, "worker", prefix=f"{start.spec.name} ")
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the supervisor, which sends SIGTERM
    LINK = ModelLink(start)
    return settings
