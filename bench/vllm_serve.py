"""The peer: vLLM's own OpenAI server (``python -m vllm.entrypoints.openai.api_server``), started
with the engine arguments an inferq worker would use for the same workload, and driven by the
same SSE client and prompts as ``inferq-sse``.

The arguments come from :func:`bench.inprocess.engine_args` (which builds them exactly as
``worker.engine.EngineHost`` does) and are turned into the server's command-line flags. Not
passed: the structured-output settings (no request of a benchmark uses them).
"""

from __future__ import annotations

import sys
from typing import Any

from bench.config import StackSpec, Workload
from bench.stack import Procs, base_env, free_port, http_ok

#: The engine arguments an inferq worker sets, passed on as flags of the same name.
FLAGS = ("served_model_name", "max_model_len", "gpu_memory_utilization", "kv_cache_memory_bytes",
         "tensor_parallel_size", "max_num_seqs", "max_num_batched_tokens", "dtype", "load_format",
         "enforce_eager", "scheduling_policy")


def settings_for(w: Workload, spec: StackSpec) -> dict[str, Any]:
    """The inferq settings of this workload's stack, as the in-process target takes them."""
    return {"model": w.model, "load_format": w.load_format, "max_num_seqs": spec.max_num_seqs,
            "cpu_kv_cache_gib": spec.kv_cache_gib, "dtype": w.dtype,
            "gpu_memory_utilization": spec.gpu_memory_utilization, "max_model_len": w.max_model_len}


def flags(args: Any) -> list[str]:
    """Command-line flags for the fields of ``AsyncEngineArgs`` listed in :data:`FLAGS`."""
    out = ["--model", str(args.model)]
    for name in FLAGS:
        value = getattr(args, name, None)
        if value is None:
            continue
        flag = "--" + name.replace("_", "-")
        if isinstance(value, bool):
            out.append(flag if value else "--no-" + flag[2:])
        elif isinstance(value, (list, tuple)):
            out += [flag, *map(str, value)]
        else:
            out += [flag, str(value)]
    return out


def start_vllm_serve(procs: Procs, w: Workload, spec: StackSpec, model_path: str, name: str,
                     env: dict[str, str]) -> str:
    """Start the server for this workload; returns its base URL once ``/health`` answers."""
    from bench.inprocess import engine_args

    inferq_env = {k: v for k, v in spec.env.items() if k.startswith("INFERQ_")}
    args = engine_args({"model_path": model_path, "settings": settings_for(w, spec)})
    port = free_port()
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--host", "127.0.0.1",
           "--port", str(port), "--disable-uvicorn-access-log", *flags(args)]
    procs.start(name, cmd, base_env(**inferq_env, **w.inprocess_env, **env))
    base = f"http://127.0.0.1:{port}"
    procs.wait(lambda: http_ok(f"{base}/health"), spec.startup_timeout_s, f"vllm serve {name}")
    return base
