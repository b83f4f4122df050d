"""CPU used during a level by the harness's own process tree and by everything else (Linux /proc).

On a shared machine other processes steal cycles from the stack under test; the share of the
machine they used during a level is recorded next to its numbers so that a reader can tell.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

ROOT_ENV = "BENCH_ROOT_PID"  # the harness's pid, inherited by the in-process subprocess


def _tick() -> float:
    return float(os.sysconf("SC_CLK_TCK")) if hasattr(os, "sysconf") else 100.0


def _busy_s() -> float:
    """CPU time the whole machine spent busy since boot (all cores, seconds)."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    idle = v[3] + (v[4] if len(v) > 4 else 0)
    return (sum(v[:8]) - idle) / _tick()


def _stat(path: str) -> list[str]:
    """The fields of ``path/stat`` from the state on (field 3 of proc(5)): the command name, which
    may hold spaces, cut off."""
    with open(f"{path}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()


def _cpu_s(fields: list[str]) -> float:
    """User + system CPU seconds from :func:`_stat`'s fields."""
    return (int(fields[11]) + int(fields[12])) / _tick()


def _processes() -> dict[int, tuple[int, float]]:
    """Every live process: pid -> (parent pid, CPU seconds used, user + system)."""
    out: dict[int, tuple[int, float]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            fields = _stat(f"/proc/{name}")
            out[int(name)] = (int(fields[1]), _cpu_s(fields))
        except (OSError, IndexError, ValueError):  # exited meanwhile
            continue
    return out


def _descendants(root: int, procs: dict[int, tuple[int, float]]) -> list[int]:
    """The live descendants of ``root`` (not ``root`` itself)."""
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in procs.items():
        children.setdefault(ppid, []).append(pid)
    out, stack = [], list(children.get(root, []))
    while stack:
        pid = stack.pop()
        out.append(pid)
        stack.extend(children.get(pid, []))
    return out


def _tree_s(root: int) -> float:
    """CPU time (user + system) of ``root`` and all its live descendants."""
    procs = _processes()
    return sum(procs[pid][1] for pid in [root, *_descendants(root, procs)] if pid in procs)


@dataclass
class CpuSample:
    busy: float
    own: float


def sample() -> CpuSample | None:
    """A snapshot, or None where /proc is not available."""
    try:
        root = int(os.environ.get(ROOT_ENV, os.getpid()))
        return CpuSample(_busy_s(), _tree_s(root))
    except (OSError, ValueError, IndexError):
        return None


def cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def shares(before: CpuSample | None, after: CpuSample | None, wall_s: float) -> dict[str, float | None]:
    """Share of the whole machine (0..1) used by the harness's processes and by all others."""
    if before is None or after is None or wall_s <= 0:
        return {"cpu_own": None, "cpu_others": None}
    cap = wall_s * cores()
    own = max(0.0, after.own - before.own)
    others = max(0.0, (after.busy - before.busy) - own)
    return {"cpu_own": min(1.0, own / cap), "cpu_others": min(1.0, others / cap)}


#: Processes whose CPU is the engine's own (vLLM's EngineCore and its GPU workers): left out of
#: the busiest-thread figure, which is about what a serving stack adds around the engine.
ENGINE_PROCESS_PREFIXES = ("VLLM::", "EngineCore")
#: ``vllm serve --api-server-count N``'s API server processes take vLLM's process-name prefix too
#: (``VLLM::APIServer_0``, as their command line and, cut to 15 characters, their name): they
#: are the server's, not the engine's.
API_SERVER_TITLE = "VLLM::APIServer"


def _is_engine(comm: str) -> bool:
    return comm.startswith(ENGINE_PROCESS_PREFIXES) and not comm.startswith(API_SERVER_TITLE)


def _comm(path: str) -> str:
    with open(f"{path}/comm") as f:
        return f.read().strip()


#: The load client: the harness itself and its client processes (bench/clientprocs.py).
CLIENT_ROLE = "load client"
#: (what a process's command line holds, the role it is named by), first match wins.
ROLES = (("bench.clientprocs", CLIENT_ROLE), ("bench.vllm_bench", CLIENT_ROLE), ("redis-server", "redis"),
         ("vllm.entrypoints", "vllm-serve"), ("bench.vllm_serve", "vllm-serve"), (API_SERVER_TITLE, "vllm-serve"),
         ("inferq.cli api", "gateway"), ("inferq.cli worker", "worker"), ("celeryd", "worker"),
         ("bench.naive_server", "naive server"))
SPAWNED = "multiprocessing.spawn"  # a child started by multiprocessing: named after its parent


def _role(pid: int, comm: str, procs: dict[int, tuple[int, float]]) -> str:
    """What a process of a stack is (its command line read against :data:`ROLES`). A process that
    multiprocessing spawned is one of the gateway's (uvicorn's workers) if its parent is the
    gateway, vllm serve's (its API servers) under vllm serve, else a frontend of an engine group
    (worker/engine/group.py)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return comm
    if SPAWNED in cmd:
        parent = procs.get(pid, (0, 0.0))[0]
        role = _role(parent, "", procs) if parent else ""
        return role if role in ("gateway", "vllm-serve") else "worker frontend"
    return next((role for marker, role in ROLES if marker in cmd), comm)


ThreadKey = tuple[int, int]  # (pid, tid)


def thread_times() -> dict[ThreadKey, tuple[str, float]] | None:
    """CPU seconds of every thread of the harness's descendants outside the engine, named
    ``process-comm/thread-comm`` (the load client, the harness's own process and any client
    processes of it, vLLM's benchmark client included, is left out)."""
    try:
        root = int(os.environ.get(ROOT_ENV, os.getpid()))
        out: dict[ThreadKey, tuple[str, float]] = {}
        procs = _processes()
        for pid in _descendants(root, procs):
            try:
                pname = _comm(f"/proc/{pid}")
                if _is_engine(pname) or pid == os.getpid():
                    continue
                role = _role(pid, pname, procs)
                if role == CLIENT_ROLE:  # a process of the load client (bench/clientprocs.py)
                    continue
                for tid in os.listdir(f"/proc/{pid}/task"):
                    path = f"/proc/{pid}/task/{tid}"
                    thread = "main thread" if int(tid) == pid else f"thread {_comm(path)}"
                    out[(pid, int(tid))] = (f"{role} {thread}", _cpu_s(_stat(path)))
            except (OSError, IndexError, ValueError):
                continue  # exited meanwhile
        return out
    except OSError:
        return None


def busiest_thread(before: dict[ThreadKey, tuple[str, float]] | None,
                   after: dict[ThreadKey, tuple[str, float]] | None) -> tuple[str | None, float | None]:
    """The thread outside the engine that used the most CPU between two :func:`thread_times`
    snapshots: its name and CPU seconds."""
    if before is None or after is None:
        return None, None
    used = {k: (name, cpu - before.get(k, (name, 0.0))[1]) for k, (name, cpu) in after.items()}
    if not used:
        return None, None
    name, cpu = max(used.values(), key=lambda v: v[1])
    return name, cpu


#: The roles a stack's CPU is split into besides :data:`ROLES`: the engine's own processes and
#: the in-process target's engine client.
ENGINE_ROLE = "engine"
ProcKey = tuple[int, float]  # (pid, start time): a pid reused within a level is another process


def process_times() -> dict[ProcKey, tuple[str, float]] | None:
    """CPU seconds of the harness and every live descendant, each named by its role: the load
    client (the harness), ``engine`` (vLLM's EngineCore and its workers), or :func:`_role`'s."""
    try:
        root = int(os.environ.get(ROOT_ENV, os.getpid()))
        out: dict[ProcKey, tuple[str, float]] = {}
        procs = _processes()
        for pid in [root, *_descendants(root, procs)]:
            try:
                fields, pname = _stat(f"/proc/{pid}"), _comm(f"/proc/{pid}")
                role = (CLIENT_ROLE if pid == root else ENGINE_ROLE if _is_engine(pname)
                        else "in-process client" if pid == os.getpid() else _role(pid, pname, procs))
                out[(pid, float(fields[19]))] = (role, _cpu_s(fields))
            except (OSError, IndexError, ValueError):
                continue  # exited meanwhile
        return out
    except OSError:
        return None


def by_role(before: dict[ProcKey, tuple[str, float]] | None,
            after: dict[ProcKey, tuple[str, float]] | None) -> dict[str, float] | None:
    """CPU seconds each role used between two :func:`process_times` snapshots (a process that
    exited in between is not counted: a stack's processes live through a level)."""
    if before is None or after is None:
        return None
    out: dict[str, float] = {}
    for k, (role, cpu) in after.items():
        out[role] = out.get(role, 0.0) + max(0.0, cpu - before.get(k, (role, 0.0))[1])
    return out


def per_1k_tokens(run: dict[str, Any], tokens: float) -> dict[str, Any]:
    """A repeat's CPU per 1,000 streamed tokens: of the whole stack (``cpu_s_per_1k_tokens``:
    every process the harness started, load client included) and of its busiest thread outside
    the engine (``busiest_thread_cpu_s_per_1k_tokens``)."""
    k = 1000 / tokens if tokens else None
    own, busiest = run.get("cpu_own"), run.get("busiest_thread_cpu_s")
    roles = run.get("cpu_by_role")
    return {"cpu_s_per_1k_tokens": own * cores() * run["wall_s"] * k if own is not None and k else None,
            "busiest_thread_cpu_s_per_1k_tokens": busiest * k if busiest is not None and k else None,
            "cpu_by_role_per_1k_tokens": {r: v * k for r, v in roles.items()} if roles and k else None}
