"""CPU used during a level by the harness's own process tree and by everything else (Linux /proc).

On a shared machine other processes steal cycles from the stack under test; the share of the
machine they used during a level is recorded next to its numbers so that a reader can tell.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

ROOT_ENV = "BENCH_ROOT_PID"  # the harness's pid, inherited by the in-process subprocess


def _tick() -> float:
    return float(os.sysconf("SC_CLK_TCK")) if hasattr(os, "sysconf") else 100.0


def _busy_s() -> float:
    """CPU time the whole machine spent busy since boot (all cores, seconds)."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    idle = v[3] + (v[4] if len(v) > 4 else 0)
    return (sum(v[:8]) - idle) / _tick()


def _tree_s(root: int) -> float:
    """CPU time (user + system) of ``root`` and all its live descendants."""
    parent: dict[int, int] = {}
    used: dict[int, float] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        pid = int(name)
        parent[pid] = int(fields[1])
        used[pid] = (int(fields[11]) + int(fields[12])) / _tick()
    children: dict[int, list[int]] = {}
    for pid, ppid in parent.items():
        children.setdefault(ppid, []).append(pid)
    total, stack = 0.0, [root]
    while stack:
        pid = stack.pop()
        total += used.get(pid, 0.0)
        stack.extend(children.get(pid, []))
    return total


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


def shares(before: CpuSample | None, after: CpuSample | None, wall_s: float) -> dict[str, float | None]:
    """Share of the whole machine (0..1) used by the harness's processes and by all others."""
    if before is None or after is None or wall_s <= 0:
        return {"cpu_own": None, "cpu_others": None}
    cap = wall_s * (len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1)
    own = max(0.0, after.own - before.own)
    others = max(0.0, (after.busy - before.busy) - own)
    return {"cpu_own": min(1.0, own / cap), "cpu_others": min(1.0, others / cap)}
