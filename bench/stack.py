"""Subprocesses the harness owns: redis-server, inferq workers and gateway, naive servers.

Every process gets its own session (so its children die with it) and a log file in the output
folder. :class:`Procs` stops everything it started, in reverse order, on exit and on error.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import httpx

from bench.config import StackSpec, Workload

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Proc:
    """A subprocess in a session of its own (its children die with it), output to ``log``."""

    def __init__(self, name: str, cmd: list[str], env: dict[str, str], log: Path) -> None:
        self.name, self.log = name, log
        with open(log, "ab") as f:
            self.proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=env, cwd=ROOT,
                                      start_new_session=True)

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
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])


class Procs:
    """A group of processes, stopped together (use as a context manager)."""

    def __init__(self, logdir: Path) -> None:
        self.logdir = logdir
        self.procs: list[Proc] = []

    def start(self, name: str, cmd: list[str], env: dict[str, str]) -> Proc:
        p = Proc(name, cmd, env, self.logdir / f"{name}.log")
        self.procs.append(p)
        return p

    def wait(self, ready: Callable[[], bool], timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if ready():
                return
            for p in self.procs:
                if not p.alive():
                    raise RuntimeError(f"{what}: {p.name} exited with code {p.proc.returncode}; "
                                       f"last lines of {p.log}:\n{p.tail()}")
            time.sleep(0.5)
        raise TimeoutError(f"{what}: not ready after {timeout:g} s (logs in {self.logdir})")

    def stop(self) -> None:
        while self.procs:
            p = self.procs.pop()
            p.stop(grace=30.0 if p.name.startswith("worker") else 10.0)

    def __enter__(self) -> Procs:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def base_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("INFERQ_")}
    env.update(PYTHONUNBUFFERED="1", VLLM_NO_USAGE_STATS="1", DO_NOT_TRACK="1", TOKENIZERS_PARALLELISM="false")
    env.update(extra)
    return env


def http_ok(url: str, check: Callable[[httpx.Response], bool] = lambda r: True) -> bool:
    try:
        r = httpx.get(url, timeout=2)
        return r.status_code == 200 and check(r)
    except httpx.HTTPError:
        return False


def start_redis(procs: Procs, name: str) -> tuple[str, Proc]:
    """A throwaway redis-server (no persistence) on a free port: its URL and process."""
    exe = shutil.which("redis-server")
    if exe is None:
        raise RuntimeError("redis-server is not on PATH")
    port = free_port()
    proc = procs.start(name, [exe, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
                       base_env())
    return f"redis://127.0.0.1:{port}/0", proc


def start_inferq(procs: Procs, w: Workload, spec: StackSpec, tag: str) -> str:
    """redis-server + ``spec.workers`` workers + the gateway; returns the gateway's base URL."""
    redis_url, _ = start_redis(procs, f"redis-{tag}")
    gport = free_port()
    inferq = {"INFERQ_REDIS_URL": redis_url, "INFERQ_LOG_LEVEL": "WARNING",
              "INFERQ_MAX_NUM_SEQS": str(spec.max_num_seqs), "INFERQ_CPU_KV_CACHE_GIB": str(spec.kv_cache_gib),
              "INFERQ_GPU_MEMORY_UTILIZATION": str(spec.gpu_memory_utilization),
              "INFERQ_LOAD_FORMAT": w.load_format, "INFERQ_DTYPE": w.dtype, **spec.env}
    if w.model:
        inferq["INFERQ_MODEL"] = w.model
    if w.max_model_len:
        inferq["INFERQ_MAX_MODEL_LEN"] = str(w.max_model_len)
    py = [sys.executable, "-m", "inferq.cli"]
    for i in range(spec.workers):
        extra = spec.worker_env[i] if i < len(spec.worker_env) else {}
        procs.start(f"worker-{tag}-{i}", [*py, "worker"],
                    base_env(**inferq, INFERQ_WORKER_ID=f"bench-{tag}-{i}", **extra))
    procs.start(f"gateway-{tag}", [*py, "api", "--port", str(gport)], base_env(**inferq))
    base = f"http://127.0.0.1:{gport}"
    procs.wait(lambda: http_ok(f"{base}/readyz", lambda r: r.json().get("workers") == spec.workers),
               spec.startup_timeout_s, f"inferq stack {tag!r} ({spec.workers} workers)")
    return base


def start_naive(procs: Procs, w: Workload, model_path: str, mode: str, batch_size: int,
                env: dict[str, str], name: str) -> str:
    """The naive HF server in ``mode`` (serial or static); returns its base URL."""
    port = free_port()
    cmd = [sys.executable, "-m", "bench.naive_server", "--model", model_path, "--port", str(port),
           "--mode", mode, "--batch-size", str(batch_size), "--window-ms", str(w.naive_batch_window_ms),
           "--load-format", w.load_format, "--dtype", w.naive_dtype]
    procs.start(name, cmd, base_env(**env))
    base = f"http://127.0.0.1:{port}"
    procs.wait(lambda: http_ok(f"{base}/health"), 900, f"naive server {name}")
    return base
