"""Processes the tests and the benchmarks start that a deployment never does: a free port to put
a server on, a Redis Sentinel (failover tests). The processes a deployment starts (``inferq up``,
Redis) are cli/procs.py's."""

from __future__ import annotations

import signal
import socket
from pathlib import Path

from inferq.cli.procs import RedisProc, RedisTls, redis_pings, redis_server, wait_until


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _quoted(value: str) -> str:
    """``value`` as one argument of a line of a Redis config file."""
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def start_sentinel(port: int, logdir: Path, master_port: int, *, master: str = "inferq", quorum: int = 2,
                   down_after_ms: int = 1000, name: str = "sentinel", env: dict[str, str] | None = None,
                   timeout: float = 10.0, tls: RedisTls | None = None, password: str = "",
                   master_password: str = "") -> RedisProc:
    """A local Redis Sentinel on ``port`` watching the master on 127.0.0.1:``master_port`` as
    ``master``: down after ``down_after_ms`` without an answer, failed over when ``quorum``
    Sentinels agree. Returned once it answers PING (its config file, which it rewrites, is
    ``logdir/NAME.conf``). ``tls``: TLS alone, its clients' and its own to the servers it watches;
    ``password``: its own (``requirepass``); ``master_password``: the watched servers'."""
    conf = logdir / f"{name}.conf"
    listen = [("port", str(port))] if tls is None else tls.options(port)
    lines = [f"{k} {v}" for k, v in listen] + ["bind 127.0.0.1", f"dir {logdir}"]
    if password:
        lines.append(f"requirepass {_quoted(password)}")
    lines += [f"sentinel monitor {master} 127.0.0.1 {master_port} {quorum}",
              f"sentinel down-after-milliseconds {master} {down_after_ms}",
              f"sentinel failover-timeout {master} {max(3 * down_after_ms, 3000)}",
              f"sentinel parallel-syncs {master} 1"]
    if master_password:
        lines.append(f"sentinel auth-pass {master} {_quoted(master_password)}")
    conf.write_text("\n".join(lines) + "\n")
    proc = RedisProc(name, [redis_server(), str(conf), "--sentinel"], env, logdir / f"{name}.log", port,
                     tls, password)
    try:
        wait_until(lambda: redis_pings(proc.url), timeout, f"redis-sentinel on port {port}", [proc], interval=0.05)
    except BaseException:
        proc.stop(signal.SIGKILL)
        raise
    return proc
