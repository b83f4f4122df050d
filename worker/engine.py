"""EngineHost: one vLLM ``AsyncLLM`` per worker process, on a background asyncio loop.

vLLM is imported in four modules of inferq, all in worker/ and always inside functions (importing
them does not load vLLM): here (the engine, its arguments, the stat logger), worker/group.py (an
EngineCore shared by several frontend processes), worker/runner.py (sampling and
structured-output parameters, ``TokensPrompt``, ``EngineDeadError``) and worker/toolcalls.py
(vLLM's tool-call parsers).
Celery's threads pool hands each job to :meth:`EngineHost.run`, which schedules the job's coroutine
on the engine's loop; every coroutine shares the one engine, so new requests join the running
batch at the next step.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import logging
import threading
import time
from collections.abc import Coroutine
from functools import partial
from typing import Any, TypeVar

from inferq.shared import prompt_probe
from inferq.shared.schemas import EngineStats
from inferq.shared.settings import Settings
from inferq.worker.group import Frontend
from inferq.worker.models import resolve_model
from inferq.worker.prompt import encode_request

log = logging.getLogger(__name__)
T = TypeVar("T")


def _stats_logger_class(stats: EngineStats) -> type:
    """A vLLM stat logger that copies each step's scheduler stats into ``stats``."""
    from vllm.v1.metrics.loggers import StatLoggerBase

    class InferqStatLogger(StatLoggerBase):
        def __init__(self, vllm_config: Any, engine_index: int = 0) -> None:
            self.stats = stats

        def record(self, scheduler_stats: Any, iteration_stats: Any, mm_cache_stats: Any = None,
                   engine_idx: int = 0) -> None:
            if scheduler_stats is None:
                return
            s = self.stats
            s.steps += 1
            s.last_step_at = time.time()
            s.running = scheduler_stats.num_running_reqs
            s.waiting = scheduler_stats.num_waiting_reqs
            s.kv_cache_usage = float(getattr(scheduler_stats, "kv_cache_usage", 0.0))
            s.peak_running = max(s.peak_running, s.running)

        def log_engine_initialized(self) -> None:
            pass

    return InferqStatLogger


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


class EngineHost:
    """Owns the engine, its event loop thread, and the model's tokenizer."""

    def __init__(self, settings: Settings, frontend: Frontend | None = None) -> None:
        self.settings = settings
        self.frontend = frontend  # set: a frontend of an engine group (worker/group.py)
        self.stats = EngineStats()
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="engine-loop", daemon=True)
        self.engine: Any = None
        self.tokenizer: Any = None
        self.model_path = ""
        self.max_model_len = 0
        self.vocab_size = 0  # token ids from 0 to this (excluded) are the model's
        self.prompt_probe: dict[str, str] = {}  # shared/prompt_probe.py: what this tokenizer makes of the probes

    def start(self) -> None:
        """Build the engine (blocks until it is ready to serve)."""
        self._thread.start()
        self.run(self._create())
        log.info("engine ready: model=%s max_model_len=%d max_num_seqs=%d", self.model_path,
                 self.max_model_len, self.settings.max_num_seqs)

    @staticmethod
    def engine_args_for(settings: Settings, model_path: str) -> Any:
        """vLLM's ``AsyncEngineArgs`` for ``settings``, serving ``model_path``."""
        from vllm.config import StructuredOutputsConfig
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.platforms import current_platform

        s = settings
        cpu = current_platform.is_cpu()
        kv_bytes = int(s.cpu_kv_cache_gib * (1 << 30)) if cpu else None
        return AsyncEngineArgs(
            model=model_path,
            served_model_name=[s.model_name],
            max_model_len=s.max_model_len,
            gpu_memory_utilization=s.gpu_memory_utilization,
            kv_cache_memory_bytes=kv_bytes,
            tensor_parallel_size=s.tensor_parallel_size,
            max_num_seqs=s.max_num_seqs,
            max_num_batched_tokens=s.max_num_batched_tokens,
            dtype=engine_dtype(s, cpu),
            load_format=s.load_format,
            enforce_eager=cpu if s.enforce_eager is None else s.enforce_eager,
            disable_log_stats=False,
            scheduling_policy=s.scheduling_policy,
            # JSON modes emit compact JSON: a model is never steered into endless whitespace
            structured_outputs_config=StructuredOutputsConfig(backend="xgrammar", disable_any_whitespace=True),
        )

    def engine_args(self) -> Any:
        return self.engine_args_for(self.settings, self.model_path)

    async def _create(self) -> None:
        from vllm.v1.engine.async_llm import AsyncLLM

        stat_loggers = [_stats_logger_class(self.stats)]
        fe = self.frontend
        if fe is None:
            self.model_path = resolve_model(self.settings)
            self.engine = AsyncLLM.from_engine_args(self.engine_args(), stat_loggers=stat_loggers)
        else:  # a client of the group's EngineCore (vLLM gives scheduler stats to one client a step)
            self.model_path = fe.model_path
            self.engine = AsyncLLM.from_vllm_config(
                fe.vllm_config, stat_loggers=stat_loggers, client_addresses=dict(fe.addresses),
                client_count=fe.count, client_index=fe.index)
        # vLLM reads its settings from the environment on every access (os.getenv behind a module
        # __getattr__), several times per request and step on this loop; its EngineCore and
        # workers cache them once started, as this process may now: nothing here changes them
        from vllm import envs

        envs.enable_envs_cache()
        tokenizer = self.engine.get_tokenizer()
        self.tokenizer = await tokenizer if inspect.isawaitable(tokenizer) else tokenizer  # async in older vLLM
        self.max_model_len = int(self.engine.model_config.max_model_len)
        # as vLLM bounds prompt ids: the tokenizer's vocabulary or the model's, whichever is larger
        self.vocab_size = max(int(self.tokenizer.max_token_id) + 1,
                              int(self.engine.model_config.get_vocab_size()))
        self.prompt_probe = prompt_probe.digests(partial(encode_request, self.tokenizer))

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on the engine loop from another thread and wait for its result."""
        return self.submit(coro).result()

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        """Schedule ``coro`` on the engine loop from another thread; its result comes later."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def unfinished_requests(self) -> int:
        if self.engine is None:
            return 0
        return int(self.engine.output_processor.get_num_unfinished_requests())  # all vLLM versions

    def stop(self) -> None:
        if self.engine is not None:
            self.engine.shutdown()
            self.engine = None
        if self.loop.is_running():
            self.loop.call_soon_threadsafe(self.loop.stop)
