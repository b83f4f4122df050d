"""Child processes: start, wait for, and stop them. ``inferq up``, the benchmark harness (bench/)
and the tests all start redis-server, workers and gateways through this module.

Every process gets a session of its own (so its children die with it) and a log file.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar
from urllib.parse import quote

import redis

from inferq.shared.redis import Where, make_sync_redis


class Proc:
    """A subprocess in a process group of its own (signals reach it and its children, and a
    terminal's Ctrl-C does not), stdout and stderr appended to ``log``.

    The same session as ours, not one of its own: on Linux with ``sched_autogroup`` every session
    is a scheduling group of its own, and a vLLM engine's busy-polling processes (the engine core
    and its CPU worker sched_yield while they wait for each other) then kept every other group
    off the CPU for seconds at a time (the gateway, Redis and the heartbeats too, a ``nice -20``
    process included; measured on a 2-core machine). In one group they share the CPU task by task.
    """

    def __init__(self, name: str, cmd: list[str], env: dict[str, str] | None, log: Path,
                 cwd: Path | None = None) -> None:
        self.name, self.log = name, log
        self.cmd, self.env, self.cwd = cmd, env, cwd  # (what starting it again takes)
        with open(log, "ab") as f:
            self.proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=env, cwd=cwd,
                                         process_group=0)

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def returncode(self) -> int | None:
        return self.proc.returncode

    def poll(self) -> int | None:
        """The exit code, or None while it runs."""
        return self.proc.poll()

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self, sig: int = signal.SIGTERM, grace: float = 20.0) -> None:
        """Signal the process group; SIGKILL it if it has not exited after ``grace`` seconds."""
        if self.proc.poll() is not None:
            return
        try:
            os.killpg(self.proc.pid, sig)
            self.proc.wait(grace)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        except ProcessLookupError:
            pass

    def tail(self, n: int = 40) -> str:
        """The last ``n`` lines of its log."""
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])


P = TypeVar("P", bound=Proc)


class _Polled(Protocol):
    @property
    def returncode(self) -> int | None: ...

    def poll(self) -> int | None: ...


def wait_until(predicate: Callable[[], bool], timeout: float, what: str,
               procs: Iterable[_Polled] = (), interval: float = 0.2) -> None:
    """Return once ``predicate()`` is true. Raise RuntimeError as soon as one of ``procs`` (a
    :class:`Proc` or a ``Popen``) has exited, with the end of its log; TimeoutError after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        if predicate():
            return
        for p in procs:
            if p.poll() is not None:
                who = p.name if isinstance(p, Proc) else getattr(p, "args", p)
                tail = f"; last lines of {p.log}:\n{p.tail()}" if isinstance(p, Proc) else ""
                raise RuntimeError(f"{what}: {who} exited with code {p.returncode}{tail}")
        if time.monotonic() >= deadline:
            raise TimeoutError(f"{what}: not ready after {timeout:g} s")
        time.sleep(interval)


class Procs:
    """A group of processes with their logs in one folder, stopped together, last started first
    (use as a context manager)."""

    def __init__(self, logdir: Path) -> None:
        self.logdir = logdir
        self.procs: list[Proc] = []

    def start(self, name: str, cmd: list[str], env: dict[str, str] | None = None,
              cwd: Path | None = None) -> Proc:
        return self.add(Proc(name, cmd, env, self.logdir / f"{name}.log", cwd))

    def add(self, proc: P) -> P:
        self.procs.append(proc)
        return proc

    def wait(self, ready: Callable[[], bool], timeout: float, what: str) -> None:
        """:func:`wait_until` ``ready``, failing early if any process of the group exits."""
        wait_until(ready, timeout, f"{what} (logs in {self.logdir})", self.procs, interval=0.5)

    def stop(self) -> None:
        """Stop each process (SIGTERM, then SIGKILL after its grace), last started first; one is
        forgotten once it has exited, so an interrupted stop leaves :meth:`kill` what is left."""
        while self.procs:
            p = self.procs[-1]
            p.stop(grace=30.0 if p.name.startswith("worker") else 10.0)
            self.procs.pop()

    def kill(self) -> None:
        """SIGKILL every process left, at once."""
        for p in self.procs:
            p.stop(signal.SIGKILL)
        self.procs.clear()

    def __enter__(self) -> Procs:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def redis_pings(where: Where) -> bool:
    """True if a Redis server answers PING at ``where`` (a URL, or the settings: through the
    Sentinels when they name some)."""
    try:
        with make_sync_redis(where, socket_connect_timeout=1, socket_timeout=1, retry=None) as r:
            return bool(r.ping())
    except redis.RedisError:
        return False


@dataclass(frozen=True)
class RedisTls:
    """TLS for a local redis-server or Sentinel: its certificate and key (PEM) and the CA that
    signed them, which its clients check it against. ``client_certificates``: clients must show a
    certificate that CA signed (Redis' default; :attr:`RedisProc.url` shows the server's own, so
    it must be good for client authentication too); else they need none. ``names_address``: the
    certificate names 127.0.0.1 (else :attr:`RedisProc.url` does not check the name)."""

    cert: Path
    key: Path
    ca: Path
    client_certificates: bool = False
    names_address: bool = True

    def query(self) -> str:
        """A rediss:// URL's options for a client of these servers."""
        o = {"ssl_ca_certs": str(self.ca)}
        if self.client_certificates:
            o.update(ssl_certfile=str(self.cert), ssl_keyfile=str(self.key))
        if not self.names_address:
            o["ssl_check_hostname"] = "false"
        return "&".join(f"{k}={quote(v, safe='')}" for k, v in o.items())

    def options(self, port: int) -> list[tuple[str, str]]:
        """redis-server's options (command line or config file) for TLS alone on ``port``, and TLS
        to the servers it connects to (a replica's master, the servers a Sentinel watches), where
        it shows its own certificate."""
        return [("port", "0"), ("tls-port", str(port)), ("tls-cert-file", str(self.cert)),
                ("tls-key-file", str(self.key)), ("tls-ca-cert-file", str(self.ca)),
                ("tls-auth-clients", "yes" if self.client_certificates else "no"), ("tls-replication", "yes")]


class RedisProc(Proc):
    """A redis-server that :func:`start_redis` started, on 127.0.0.1:``port`` (over TLS alone
    when ``tls`` is given, with ``password`` when it has one)."""

    def __init__(self, name: str, cmd: list[str], env: dict[str, str] | None, log: Path, port: int,
                 tls: RedisTls | None = None, password: str = "") -> None:
        super().__init__(name, cmd, env, log)
        self.port, self.tls, self.password = port, tls, password

    @property
    def url(self) -> str:
        auth = f":{quote(self.password, safe='')}@" if self.password else ""
        if self.tls is None:
            return f"redis://{auth}127.0.0.1:{self.port}/0"
        return f"rediss://{auth}127.0.0.1:{self.port}/0?{self.tls.query()}"


def redis_server() -> str:
    """The redis-server executable (Debian's package)."""
    exe = shutil.which("redis-server")
    if exe is None:
        raise RuntimeError("redis-server is not on PATH (Debian package redis-server)")
    return exe


def start_redis(port: int, logdir: Path, appendonly: bool = False, *, name: str = "redis",
                env: dict[str, str] | None = None, timeout: float = 10.0,
                replica_of: int | None = None, tls: RedisTls | None = None, password: str = "") -> RedisProc:
    """A local redis-server on ``port`` (log ``logdir/NAME.log``), returned once it answers PING.

    No snapshots. ``appendonly``: an append-only file in ``logdir/NAME-data``, fsynced on every
    write, so a restart on the same port, name and folder finds every job and queue as it was.
    ``replica_of``: a replica of the local Redis on that port (its copy of the master's data goes
    to the same folder, as would a server's made a replica later). ``tls``: TLS alone on ``port``,
    to its master too. ``password``: its own, and the one it gives its master (every server of a
    replicated set has the same)."""
    data = logdir / f"{name}-data"  # its files: the append-only file; what a replica loads from its master
    data.mkdir(exist_ok=True)
    listen = [("port", str(port))] if tls is None else tls.options(port)
    cmd = [redis_server(), *(a for k, v in listen for a in (f"--{k}", v)), "--bind", "127.0.0.1", "--save", "",
           "--dir", str(data)]
    if replica_of is not None:
        cmd += ["--replicaof", "127.0.0.1", str(replica_of)]
    if appendonly:
        cmd += ["--appendonly", "yes", "--appendfsync", "always"]
    else:
        cmd += ["--appendonly", "no"]
    if password:
        cmd += ["--requirepass", password, "--masterauth", password]
    proc = RedisProc(name, cmd, env, logdir / f"{name}.log", port, tls, password)
    try:
        wait_until(lambda: redis_pings(proc.url), timeout, f"redis-server on port {port}", [proc],
                   interval=0.05)
    except BaseException:
        proc.stop(signal.SIGKILL)
        raise
    return proc


def http_ok(url: str, check: Callable[[Any], bool] | None = None, timeout: float = 2.0) -> bool:
    """True if GET ``url`` answers 200 (and ``check`` accepts its JSON body, when given)."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status == 200 and (check is None or bool(check(json.loads(r.read()))))
    except (OSError, ValueError, KeyError, TypeError):  # URLError and HTTPError are OSErrors
        return False
