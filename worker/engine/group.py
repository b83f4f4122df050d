"""An engine group: one vLLM EngineCore fed by several frontend processes (``INFERQ_FRONTENDS``).

One worker process forwards every token of its engine on one Python thread: the AsyncLLM output
handler (detokenizing, per-request output), the job runner and the event writer share the
engine's event loop. A fast engine (a small model, hundreds of sequences, an H200) produces tokens
faster than that thread can forward them. ``vllm serve --api-server-count N`` answers the same
limit with N API-server processes, each an AsyncLLM client of one EngineCore; an engine group does
the same with N **frontends**, each a complete inferq worker (Celery consumer, job runner, event
writer, heartbeat, reaper) holding an AsyncLLM client of the group's EngineCore.

- The group process builds the engine configuration, binds the engine's ZMQ listeners, starts the
  EngineCore (and its GPU workers) and spawns the frontends, each with its own listeners
  (``client_index``), as vLLM's own multi-API-server launcher does.
- Each frontend takes ``ceil(max_num_seqs / N)`` jobs at a time, so that the group never claims
  more jobs than the engine runs at once: a job waits in the queue, where any worker can take it,
  not in one engine's waiting list.
- Queue semantics are unchanged: each frontend is a worker of its own to the queue (its id, its
  heartbeat, its job set, acks late, fencing, drain, hand-back).
- SIGTERM to the group is passed to every frontend (each drains as a lone worker does); then the
  engine stops. A frontend that exits on its own stops the group (its supervisor restarts it). A
  frontend finds the engine dead when the EngineCore process or the group process is gone, and
  takes the engine-death path (hand every job back, exit 4).
"""

from __future__ import annotations

import contextlib
import logging
import math
import multiprocessing
import multiprocessing.connection
import os
import secrets
import signal
import socket
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from multiprocessing.process import BaseProcess
from typing import Any

from inferq.shared import logs
from inferq.shared.settings import Settings

log = logging.getLogger(__name__)


@dataclass
class Frontend:
    """What a frontend process needs to reach its group's engine (picklable, sent at spawn)."""

    index: int
    count: int
    model_path: str
    vllm_config: Any  # vllm.config.VllmConfig
    addresses: dict[str, Any]  # AsyncLLM's client_addresses: the listeners bound for this index
    engine_pids: list[int] = field(default_factory=list)
    group_pid: int = 0
    engine_id: str = ""  # the engine instance its frontends feed (cache-affine pull's index names it)
    kv_events: str | None = None  # where the EngineCore publishes its KV-cache events (frontend 0 listens)

    def engine_gone(self) -> bool:
        """True once the EngineCore or the group process has exited."""
        import psutil

        if os.getppid() != self.group_pid:
            return True
        for pid in self.engine_pids:
            try:
                if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                    return True
            except psutil.NoSuchProcess:
                return True
        return False


def engine_instance(base: str) -> str:
    """A new id for an engine started now: a restarted engine holds nothing of the one before."""
    return f"{base}~{secrets.token_hex(3)}"


def frontend_slots(max_num_seqs: int, frontends: int) -> int:
    """Jobs one frontend holds at once: its share of the engine's sequences."""
    return max(1, math.ceil(max_num_seqs / frontends))


#: Set in a frontend process before its worker starts; None in a lone worker.
FRONTEND: Frontend | None = None


def become_frontend(frontend: Frontend, settings: Settings) -> int:
    """Make this (spawned) process frontend ``frontend`` of its group; returns its job slots."""
    global FRONTEND
    FRONTEND = frontend
    frontend.vllm_config.parallel_config._api_process_rank = frontend.index  # as vLLM's API servers
    logs.setup(settings, "worker", prefix=f"frontend-{frontend.index} ")
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the group, which sends SIGTERM
    return frontend_slots(settings.max_num_seqs, frontend.count)


FrontendMain = Callable[[Frontend, str], None]  # a frontend process's entry point: (frontend, loglevel)


def run_group(settings: Settings, loglevel: str, frontend_main: FrontendMain) -> int:
    """Start the EngineCore and ``settings.frontends`` frontends, each spawned to run
    ``frontend_main`` (a module-level function: it is pickled by name); return when all have exited."""
    from vllm.usage.usage_lib import UsageContext

    from inferq.worker.engine.args import engine_args_for, kv_events_endpoint
    from inferq.worker.engine.models import resolve_model

    n = settings.frontends
    spawn = multiprocessing.get_context("spawn")
    frontends: list[BaseProcess] = []
    stopping = _Stopping(frontends)
    signal.signal(signal.SIGTERM, stopping.handle)
    signal.signal(signal.SIGINT, stopping.handle)
    try:
        model_path = resolve_model(settings)
        kv_events = kv_events_endpoint(settings)
        args = engine_args_for(settings, model_path, kv_events)
        engine_id = engine_instance(settings.worker_id or f"{socket.gethostname()}-{os.getpid()}")
        args._api_process_count, args._api_process_rank = n, -1  # as vLLM's multi-API-server launcher
        config = args.create_engine_config(usage_context=UsageContext.OPENAI_API_SERVER)
        with _core_engine(config, n) as core:  # the engine's start-up handshake runs as the block ends
            engine_pids = [pid for p in core.processes if (pid := p.pid) is not None]  # all started
            for i in range(n):
                fe = Frontend(i, n, model_path, config, core.addresses(i), engine_pids, os.getpid(), engine_id,
                              kv_events)
                proc = spawn.Process(target=frontend_main, args=(fe, loglevel), name=f"inferq-frontend-{i}")
                proc.start()
                frontends.append(proc)
                core.started(i)
            core.watch(frontends)  # one exiting during the engine's start-up aborts it
    except BaseException as e:
        stopping.stop(reason="the engine did not start")
        _reap(frontends, 30)
        if not isinstance(e, Exception):
            raise
        log.critical("the engine could not start; exiting", exc_info=True)
        return 3  # as a lone worker whose engine cannot start
    try:
        log.info("engine group: %d frontends (pids %s) on one EngineCore (pids %s), %d jobs each",
                 n, [p.pid for p in frontends], engine_pids, frontend_slots(settings.max_num_seqs, n))
        return _supervise(frontends, core.processes, stopping, settings)
    finally:
        stopping.stop(reason="the group is ending")
        _reap(frontends, settings.drain_timeout_s + 30)
        core.shutdown()


class _CoreEngine:
    """The group's EngineCore as vLLM's launcher starts it, across the vLLM versions inferq runs
    on: 0.32 binds each frontend's ZMQ sockets in the launcher and hands them over at spawn; 0.26
    fixes their addresses up front and each frontend binds its own."""

    def __init__(self, manager: Any, addresses: list[dict[str, Any]], listeners: Any = None,
                 launch: Any = None) -> None:
        self.manager = manager
        self._addresses = addresses
        self._listeners = listeners
        self._launch = launch

    @property
    def processes(self) -> list[BaseProcess]:
        return list(getattr(self.manager, "processes", None) or [])

    def addresses(self, index: int) -> dict[str, Any]:
        return self._addresses[index]

    def started(self, index: int) -> None:
        """Frontend ``index`` has its sockets (spawned): the launcher closes its copies."""
        if self._listeners is not None:
            self._listeners.inputs[index].close()
            self._listeners.outputs[index].close()

    def watch(self, frontends: list[BaseProcess]) -> None:
        if self._launch is not None:
            self._launch.watched_frontend_processes = frontends

    def shutdown(self) -> None:
        if self.manager is not None:
            self.manager.shutdown(timeout=10)
        if self._listeners is not None:
            self._listeners.cleanup()
            self._listeners = None  # now, not at interpreter exit (its __del__ needs modules gone by then)


@contextlib.contextmanager
def _core_engine(config: Any, n: int) -> Iterator[_CoreEngine]:
    """Start the EngineCore for ``n`` clients; the engine's start-up handshake runs when the
    block ends (the frontends are spawned inside it)."""
    from vllm.v1.engine import utils
    from vllm.v1.executor import Executor

    executor = Executor.get_class(config)
    if hasattr(utils, "bind_engine_zmq_listeners"):  # vLLM 0.32
        listeners = utils.bind_engine_zmq_listeners(config, n)
        addresses = [{"input_address": i.address, "output_address": o.address,
                      "input_listener": i.socket, "output_listener": o.socket}
                     for i, o in zip(listeners.inputs, listeners.outputs, strict=True)]
        try:
            with utils.launch_core_engines(config, executor, True, listeners.addresses) as launch:
                core = _CoreEngine(launch.engine_manager, addresses, listeners, launch)
                yield core
        except BaseException:
            listeners.cleanup()
            raise
    else:  # vLLM 0.26
        zmq = utils.get_engine_zmq_addresses(config, n, defer_api_server_ports=False)
        with utils.launch_core_engines(config, executor, True, zmq, n) as (manager, _coord, zmq, _queue):
            yield _CoreEngine(manager, [{"input_address": i, "output_address": o}
                                        for i, o in zip(zmq.inputs, zmq.outputs, strict=True)])


class _Stopping:
    """The group's stop: SIGTERM every frontend once (each drains)."""

    def __init__(self, frontends: list[BaseProcess]) -> None:
        self.frontends = frontends
        self.requested = False
        self.since: float | None = None

    def handle(self, signum: int, _frame: object) -> None:
        self.requested = True
        self.stop(reason=f"signal {signal.Signals(signum).name}")

    def stop(self, reason: str) -> None:
        if self.since is not None:
            return
        self.since = time.monotonic()
        log.info("engine group stopping (%s): draining %d frontends", reason, len(self.frontends))
        for p in self.frontends:
            if p.is_alive() and p.pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(p.pid, signal.SIGTERM)


def _supervise(frontends: list[BaseProcess], engines: list[BaseProcess], stopping: _Stopping,
               settings: Settings) -> int:
    """Wait for the frontends; stop the group when one exits or the engine dies. The exit code:
    0 after a requested stop, 4 when the engine died, else the first frontend's code (or 1)."""
    code = 0
    deadline: float | None = None  # past it, the frontends still running are killed
    while any(p.is_alive() for p in frontends):
        if deadline is not None and time.monotonic() > deadline:
            break
        sentinels = [p.sentinel for p in frontends if p.is_alive()]
        if code != 4:
            sentinels += [p.sentinel for p in engines]
        multiprocessing.connection.wait(sentinels, timeout=1.0)
        if code != 4 and any(not p.is_alive() for p in engines):
            # every frontend sees it on its next heartbeat, hands its jobs back and exits 4
            code = 4
            deadline = time.monotonic() + 2 * settings.worker_ttl_s + 30
            log.critical("the engine core died: the frontends hand their jobs back and exit")
            continue
        exited = [(p.name, p.exitcode) for p in frontends if not p.is_alive()]
        if exited and code != 4 and not stopping.requested and stopping.since is None:
            code = next((c for _, c in exited if c), 1)
            stopping.stop(reason=f"a frontend exited: {exited}")
        if stopping.since is not None and deadline is None:
            deadline = stopping.since + settings.drain_timeout_s + 30
    return code


def _reap(frontends: list[BaseProcess], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    for p in frontends:
        p.join(max(0.0, deadline - time.monotonic()))
        if p.is_alive():
            log.error("frontend %s did not stop in time: killing it", p.name)
            p.kill()
            p.join(5)
