"""vLLM's engine arguments for a worker's settings, and the dtype its engine runs in.

Shared by a lone worker's engine (``host``) and an engine group's EngineCore (``group``)."""

from __future__ import annotations

import os
import tempfile
import uuid
from pathlib import Path
from typing import Any

from inferq.shared.settings import Settings


def engine_dtype(settings: Settings, cpu: bool) -> str:
    """The dtype the engine runs in: ``INFERQ_DTYPE``, except that the built-in demo model runs in
    float32 on a CPU without native bfloat16 (AVX-512 BF16 or AMX). There, vLLM's CPU build runs a
    bfloat16 model on emulated kernels, ~4x slower at a batch of 64 on the demo model, and float32
    costs the 2-layer model nothing in memory. A model of the user's own keeps vLLM's choice."""
    if settings.dtype != "auto" or settings.model or not cpu:
        return settings.dtype
    import torch

    native = any(getattr(torch.cpu, f"_is_{isa}_supported", lambda: False)() for isa in ("avx512_bf16", "amx_tile"))
    return "auto" if native else "float32"

def uses_sleep_mode(settings: Settings) -> bool:
    """Whether a multi-model worker's engines sleep in vLLM's sleep mode (level 1) rather than stop:
    INFERQ_SLEEP_MODE, where 'auto' is the platform's answer (GPUs have it, vLLM's CPU build not)."""
    if not settings.models or settings.sleep_mode == "off":
        return False
    if settings.sleep_mode == "on":
        return True
    from vllm.platforms import current_platform

    return bool(current_platform.is_sleep_mode_available())


def kv_events_endpoint(settings: Settings) -> str | None:
    """Where the engine publishes its KV-cache events for cache-affine pull's index (an ``ipc://``
    socket private to this worker, named after its process), or None where the index is not fed by
    events. The sockets of processes that are gone (killed before they could remove theirs) go first."""
    if settings.affinity == "off" or settings.affinity_index != "events" or settings.runner == "pooling":
        return None
    folder = Path(tempfile.gettempdir())
    for old in folder.glob("inferq-kv-*-*"):
        pid = old.name.split("-")[2]
        if pid.isdigit() and not Path(f"/proc/{pid}").exists():
            old.unlink(missing_ok=True)
    return f"ipc://{folder}/inferq-kv-{os.getpid()}-{uuid.uuid4().hex[:8]}"


def engine_args_for(settings: Settings, model_path: str, kv_events: str | None = None) -> Any:
    """vLLM's ``AsyncEngineArgs`` for ``settings``, serving ``model_path``; ``kv_events``: the
    endpoint its KV-cache events go to (:func:`kv_events_endpoint`)."""
    from vllm.config import KVEventsConfig, StructuredOutputsConfig
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.platforms import current_platform

    s = settings
    cpu = current_platform.is_cpu()
    kv_gib = s.cpu_kv_cache_gib if cpu else s.kv_cache_gib
    kv_bytes = int(kv_gib * (1 << 30)) if kv_gib else None
    return AsyncEngineArgs(
        model=model_path,
        served_model_name=[s.model_name],
        max_model_len=s.max_model_len,
        gpu_memory_utilization=s.gpu_memory_utilization,
        kv_cache_memory_bytes=kv_bytes,
        tensor_parallel_size=s.tensor_parallel_size,
        max_num_seqs=s.engine_max_num_seqs,  # the interactive reserve on top (service classes)
        max_num_batched_tokens=s.max_num_batched_tokens,
        dtype=engine_dtype(s, cpu),
        load_format=s.load_format,
        runner=s.runner,
        # the built-in embedding model is the tiny causal model, pooled
        convert="embed" if s.runner == "pooling" and s.model is None else s.convert,
        enforce_eager=cpu if s.enforce_eager is None else s.enforce_eager,
        disable_log_stats=False,
        scheduling_policy=s.scheduling_policy,
        enable_lora=s.lora_enabled,
        max_loras=s.max_loras,
        max_lora_rank=s.max_lora_rank,
        max_cpu_loras=s.max_cpu_loras,
        # JSON modes emit compact JSON: a model is never steered into endless whitespace
        structured_outputs_config=StructuredOutputsConfig(backend="xgrammar", disable_any_whitespace=True),
        kv_events_config=KVEventsConfig(enable_kv_cache_events=True, publisher="zmq", endpoint=kv_events)
        if kv_events else None,
        enable_sleep_mode=uses_sleep_mode(s),
        # vLLM's pooling outputs have no detokenizer, which a stream interval above 1 needs
        **({"stream_interval": s.stream_interval} if s.stream_interval > 1 and s.runner != "pooling" else {}),
    )

