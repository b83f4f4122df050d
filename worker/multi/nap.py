"""A model's sleep and wake, in the process that serves it (one model of a multi-model worker).

Sleep keeps the queue's promises: the process stops taking the model's jobs (Celery stops consuming
its queue and lane; a message popped meanwhile goes back unclaimed), its lane goes back to the queue,
the jobs it runs finish for up to the grace and the rest are handed back (``restart`` event, reason
``model_swap``, a new message each: nothing lost, nothing run twice), it leaves the model's live set,
and only then is the engine put to sleep (or stopped). Wake is the reverse: engine, registration,
then the queue; its weights may come back first, while the other model goes to sleep.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any, Protocol

from inferq.worker.liveness.lanes import return_lane
from inferq.worker.runtime import WorkerRuntime

log = logging.getLogger(__name__)
REASON = "model_swap"  # the restart events' reason (not counted against a job's attempts)


class Consumption(Protocol):
    """The worker's consumption of its model's queues (Celery's consumer)."""

    def pause(self) -> None: ...

    def resume(self) -> None: ...


class CeleryConsumption:
    """Celery's own remote control, addressed to this worker's node: its consumer thread stops and
    starts consuming the queues (between two pops: a message in flight is delivered, and rejected
    back to the queue while the worker is closed)."""

    def __init__(self, app: Any, nodename: str, queues: list[str], timeout_s: float = 30.0) -> None:
        self.app, self.nodename, self.queues, self.timeout_s = app, nodename, queues, timeout_s

    def _ask(self, command: str) -> None:
        for q in self.queues:
            replies = getattr(self.app.control, command)(q, destination=[self.nodename], reply=True,
                                                         timeout=self.timeout_s)
            if not replies:
                raise RuntimeError(f"{command} {q}: no answer from {self.nodename} in {self.timeout_s:g} s")

    def pause(self) -> None:
        self._ask("cancel_consumer")

    def resume(self) -> None:
        self._ask("add_consumer")


@dataclass
class Napped:
    drain_s: float
    sleep_s: float
    handed_back: int


def put_to_sleep(rt: WorkerRuntime, consumption: Consumption, grace_s: float) -> Napped:
    """Stop taking jobs, let those held end for up to ``grace_s`` and hand the rest back, leave the
    live set, and put the engine to sleep. From a thread other than the engine loop's."""
    t0 = time.monotonic()
    rt.admission.close()
    consumption.pause()
    if rt.affinity is not None and rt.redis is not None:
        rt.host.run(return_lane(rt.redis, rt.settings.model_name, rt.id, "its model goes to sleep"))
    handed = 0
    if not rt.admission.wait_empty(grace_s):
        while not rt.admission.wait_empty(1.0):  # a job let in may claim after a hand-back: again
            n = len(rt.runner.attempts) if rt.runner is not None else 0
            if n and rt.handback is not None:
                log.info("handing %d jobs back: the model goes to sleep", n)
                rt.host.run(rt.handback.all(REASON))
                handed += n
    drain_s = time.monotonic() - t0
    rt.heartbeat.set_asleep(True)
    sleep_s = rt.host.run(rt.host.sleep())
    return Napped(drain_s=drain_s, sleep_s=sleep_s, handed_back=handed)


def wake_weights(rt: WorkerRuntime) -> bool:
    """Asleep: bring the weights back while the other model still goes to sleep, where they fit
    (EngineHost.wake_weights); the queue stays closed until :func:`wake`."""
    return rt.host.run(rt.host.wake_weights())


def wake(rt: WorkerRuntime, consumption: Consumption) -> float:
    """Wake the engine (or start it again), register, take jobs again; the seconds the engine took."""
    wake_s = rt.host.run(rt.host.wake())
    rt.renew_engine()
    rt.heartbeat.set_asleep(False)
    rt.admission.reopen()
    consumption.resume()
    return wake_s
