"""The stacks the harness runs: inferq (redis-server, workers, gateway) and the naive servers.

Processes are started with :mod:`inferq.cli.procs` (``Proc``, ``Procs``, ``free_port``, re-exported
here): each in a session of its own with a log file in the output folder; :class:`Procs` stops
everything it started, in reverse order, on exit and on error.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

from bench.config import StackSpec, Workload
from bench.standin_core import standin_env
from inferq.cli.procs import Proc, Procs, http_ok, start_redis
from tests.procs import free_port

ROOT = Path(__file__).resolve().parent.parent
__all__ = ["ROOT", "Proc", "Procs", "free_port", "http_ok", "start_redis", "base_env", "start_inferq",
           "start_naive"]


def base_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("INFERQ_")}
    env.update(PYTHONUNBUFFERED="1", VLLM_NO_USAGE_STATS="1", DO_NOT_TRACK="1", TOKENIZERS_PARALLELISM="false")
    env.update(extra)
    return env


def start_inferq(procs: Procs, w: Workload, spec: StackSpec, tag: str, redis_url: str | None = None) -> str:
    """redis-server (unless ``redis_url`` names one) + ``spec.workers`` workers + the gateway; returns
    the gateway's base URL."""
    if redis_url is None:
        redis_url = procs.add(start_redis(free_port(), procs.logdir, name=f"redis-{tag}", env=base_env())).url
    gport = free_port()
    inferq = {"INFERQ_REDIS_URL": redis_url, "INFERQ_LOG_LEVEL": "WARNING",
              "INFERQ_MAX_NUM_SEQS": str(spec.max_num_seqs), "INFERQ_CPU_KV_CACHE_GIB": str(spec.kv_cache_gib),
              "INFERQ_GPU_MEMORY_UTILIZATION": str(spec.gpu_memory_utilization),
              "INFERQ_LOAD_FORMAT": w.load_format, "INFERQ_DTYPE": w.dtype,
              "INFERQ_FRONTENDS": str(spec.frontends), **spec.env}
    if w.model:
        inferq["INFERQ_MODEL"] = w.model
    if w.max_model_len:
        inferq["INFERQ_MAX_MODEL_LEN"] = str(w.max_model_len)
    py = [sys.executable, "-m", "inferq.cli"]
    procs.start(f"gateway-{tag}", [*py, "api", "--port", str(gport)], base_env(**inferq))
    base = f"http://127.0.0.1:{gport}"
    for i in range(spec.workers):
        extra = spec.worker_env[i] if i < len(spec.worker_env) else {}
        if w.standin_core_step_ms is not None:
            extra = {**standin_env(w.standin_core_step_ms), **extra}
        procs.start(f"worker-{tag}-{i}", [*py, "worker"],
                    base_env(**inferq, INFERQ_WORKER_ID=f"bench-{tag}-{i}", **extra))
        if spec.staggered:  # each engine sizes its KV cache once the one before holds its memory
            _wait_workers(procs, base, (i + 1) * spec.frontends, spec, tag)
    _wait_workers(procs, base, spec.workers * spec.frontends, spec, tag)
    return base


def _wait_workers(procs: Procs, base: str, live: int, spec: StackSpec, tag: str) -> None:
    """Until the gateway sees ``live`` workers (each frontend of an engine group is one)."""
    procs.wait(lambda: http_ok(f"{base}/readyz", lambda body: body.get("workers") == live),
               spec.startup_timeout_s, f"inferq stack {tag!r} ({spec.workers} workers x {spec.frontends} frontends)")


def start_naive(procs: Procs, w: Workload, model_path: str, mode: str, batch_size: int,
                env: dict[str, str], name: str) -> str:
    """The naive HF server in ``mode`` (serial or static); returns its base URL."""
    port = free_port()
    cmd = [sys.executable, "-m", "bench.naive_server", "--model", model_path, "--port", str(port),
           "--mode", mode, "--batch-size", str(batch_size), "--window-ms", str(w.naive_batch_window_ms),
           "--load-format", w.load_format, "--dtype", w.naive_dtype]
    procs.start(name, cmd, base_env(**env), cwd=ROOT)  # `-m bench...` needs the checkout
    base = f"http://127.0.0.1:{port}"
    procs.wait(lambda: http_ok(f"{base}/health"), 900, f"naive server {name}")
    return base


def py_spy() -> str | None:
    """py-spy's executable: on PATH, or next to this interpreter (a venv not activated)."""
    exe = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    return exe if os.path.exists(exe) else None
