"""The load client spread over several processes (a workload's ``client_processes``).

One Python process reads some tens of thousands of streamed chunks a second at most; past that
the client, not the stack under test, sets the pace, and its own event loop's lag shows up as
the stack's time to first token. Here each process runs its share of a level's clients: request
``j`` goes to the process that owns client slot ``j mod clients`` (closed loop), or to process
``j mod N`` at 1/N of the rate (open loop: a split Poisson stream is Poisson). The parent starts
every share at once and merges the results; a level's wall time is the parent's, from the start
to the last share's end.

A process of this module speaks JSON lines: it prints ``{"ready": true}``, then answers each
``{"mode", "value", "seed", "requests"}`` line with ``{"wall", "results"}``; end of input ends it.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict
from types import TracebackType
from typing import Any

from bench import clients
from bench.clients import SendSpec
from bench.config import Level
from bench.load import RequestResult, Send, run_level
from bench.stack import ROOT

LINE_LIMIT = 1 << 30  # a share's results (every request's chunk gaps) in one line


def shares(level: Level, requests: Sequence[tuple[int, Any]], n: int) -> list[tuple[Level, list[tuple[int, Any]]]]:
    """Each process's level and requests (processes with none are left out)."""
    if level.mode == "closed":
        slots = max(1, int(level.value))
        owner = [slot % n for slot in range(slots)]
        out = []
        for p in range(n):
            mine = [req for j, req in enumerate(requests) if owner[j % slots] == p]
            if mine:
                out.append((Level("closed", float(owner.count(p))), mine))
        return out
    out = [(Level("open", level.value / n), [req for j, req in enumerate(requests) if j % n == p])
           for p in range(n)]
    return [s for s in out if s[1]]


async def close_all(procs: Sequence[asyncio.subprocess.Process], timeout: float) -> None:
    """Close the client processes' stdin (their signal to end) and wait for them; kill one that
    is not gone after ``timeout`` seconds."""
    for p in procs:
        if p.stdin is not None and not p.stdin.is_closing():
            p.stdin.close()
    for p in procs:
        try:
            await asyncio.wait_for(p.wait(), timeout)
        except TimeoutError:
            p.kill()
            await p.wait()


class ClientPool:
    """``n`` client processes for one target; :meth:`run_level` runs a level across them."""

    def __init__(self, n: int, spec: SendSpec, timeout_s: float) -> None:
        self.n, self.spec, self.timeout_s = n, spec, timeout_s
        self.procs: list[asyncio.subprocess.Process] = []

    async def __aenter__(self) -> ClientPool:
        arg = json.dumps({"send": asdict(self.spec), "timeout_s": self.timeout_s})
        for _ in range(self.n):
            p = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "bench.clientprocs", arg, cwd=ROOT, limit=LINE_LIMIT,
                stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE)
            self.procs.append(p)
        for p in self.procs:
            await self._read(p)  # {"ready": true}
        return self

    async def __aexit__(self, *exc: type[BaseException] | BaseException | TracebackType | None) -> None:
        await close_all(self.procs, 10)

    async def _read(self, p: asyncio.subprocess.Process) -> dict[str, Any]:
        assert p.stdout is not None
        line = await p.stdout.readline()
        if not line:
            raise RuntimeError(f"a client process ended (code {await p.wait()})")
        return json.loads(line)

    async def run_level(self, level: Level, requests: Sequence[tuple[int, Any]], send: Send,
                        timeout: float, seed: int = 0) -> tuple[list[RequestResult], float]:
        """As :func:`bench.load.run_level` (``send`` is unused: each process has its own)."""
        work = shares(level, requests, self.n)
        t0 = time.perf_counter()
        pipes = []
        for k, (lv, reqs) in enumerate(work):
            line = json.dumps({"mode": lv.mode, "value": lv.value, "seed": seed * self.n + k, "requests": reqs})
            stdin = self.procs[k].stdin
            assert stdin is not None
            stdin.write(line.encode() + b"\n")
            pipes.append(stdin)
        for stdin in pipes:
            await stdin.drain()
        answers = await asyncio.gather(*(self._read(self.procs[k]) for k in range(len(work))))
        wall = time.perf_counter() - t0
        results = [RequestResult(**r) for a in answers for r in a["results"]]
        return sorted(results, key=lambda r: r.index), wall


async def _serve(arg: dict[str, Any]) -> None:
    s = SendSpec(**arg["send"])
    async with clients.http_client(s.base, s.headers) as http:
        send = clients.sender(s, http)
        print(json.dumps({"ready": True}), flush=True)
        while line := await asyncio.to_thread(sys.stdin.readline):
            job = json.loads(line)
            reqs = [(int(i), body) for i, body in job["requests"]]
            res, wall = await run_level(Level(job["mode"], job["value"]), reqs, send, arg["timeout_s"], job["seed"])
            sys.stdout.write(json.dumps({"wall": wall, "results": [r.to_json() for r in res]}) + "\n")
            sys.stdout.flush()


if __name__ == "__main__":
    asyncio.run(_serve(json.loads(sys.argv[1])))
