"""EngineHost: one vLLM ``AsyncLLM`` per worker process, on a background asyncio loop.

vLLM is imported only in worker/, always inside functions (importing a module does not load it):
the engine layer (this module, ``args``, ``group``) and the job path's ``sampling``, ``runner``
and ``toolcalls``. Celery's threads pool hands each job to :meth:`EngineHost.submit`, which
schedules the job's coroutine on the engine's loop; every coroutine shares the one engine, so new
requests join the running batch at the next step.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import logging
import multiprocessing
import threading
import time
from collections.abc import Coroutine
from functools import partial
from typing import Any, TypeVar

from typing_extensions import override

from inferq.shared import prompt_probe
from inferq.shared.schemas import EngineStats
from inferq.shared.settings import Settings
from inferq.worker.engine import gpumem
from inferq.worker.engine.adapters import EngineAdapters
from inferq.worker.engine.args import engine_args_for, kv_events_endpoint, uses_sleep_mode
from inferq.worker.engine.encode import encode_request
from inferq.worker.engine.group import Frontend
from inferq.worker.engine.models import resolve_model

log = logging.getLogger(__name__)
T = TypeVar("T")
#: Headroom beyond a model's weights for waking them beside another model (allocator granularity,
#: the other model's activations growing meanwhile).
WEIGHTS_MARGIN_BYTES = 2 * 2**30


def _stats_logger_class(stats: EngineStats) -> type:
    """A vLLM stat logger that copies each step's scheduler stats into ``stats``."""
    from vllm.v1.metrics.loggers import StatLoggerBase

    class InferqStatLogger(StatLoggerBase):  # type: ignore[misc]  # vLLM is not analysed: its classes are Any
        def __init__(self, *_vllm_config_and_index: Any) -> None:
            self.stats = stats

        @override
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
            lora = getattr(scheduler_stats, "running_lora_adapters", None)
            s.lora_running = [name for name, n in lora.items() if n] if lora else []
            if (cache := getattr(scheduler_stats, "prefix_cache_stats", None)) is not None:
                s.prefix_cache_queries += int(cache.queries)
                s.prefix_cache_hits += int(cache.hits)

        def log_engine_initialized(self) -> None:
            pass

    return InferqStatLogger


class EngineHost:
    """Owns the engine, its event loop thread, and the model's tokenizer."""

    def __init__(self, settings: Settings, frontend: Frontend | None = None) -> None:
        self.settings = settings
        self.frontend = frontend  # set: a frontend of an engine group (``group``)
        self.stats = EngineStats()
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="engine-loop", daemon=True)
        self.engine: Any = None
        self.tokenizer: Any = None
        self.model_path = ""
        self.max_model_len = 0
        self.vocab_size = 0  # token ids from 0 to this (excluded) are the model's
        # the LoRA adapters the engine holds; the frontends of a group share its host-memory cache
        self.adapters = EngineAdapters(settings.lora_enabled, (settings.max_cpu_loras or settings.max_loras)
                                       // (frontend.count if frontend is not None else 1))
        self.prompt_probe: dict[str, str] = {}  # shared/prompt_probe.py: what this tokenizer makes of the probes
        self.tasks: list[str] = []  # what the engine serves: "generate", or pooling tasks such as "embed"
        # where the engine publishes its KV-cache events (the group's EngineCore, for a frontend)
        self.kv_events = kv_events_endpoint(settings) if frontend is None else frontend.kv_events
        self.sleep_mode = uses_sleep_mode(settings)  # a multi-model worker's engine sleeps (else it stops)
        self.weights_bytes: int | None = None  # GPU memory its weights took at its last wake (NVML)
        self.weights_up = False  # asleep, its weights already back (wake_weights): the KV cache is next

    def start(self) -> None:
        """Build the engine (blocks until it is ready to serve)."""
        self._thread.start()
        self.run(self._create())
        log.info("engine ready: model=%s max_model_len=%d max_num_seqs=%d", self.model_path,
                 self.max_model_len, self.settings.max_num_seqs)

    def engine_args(self) -> Any:
        return engine_args_for(self.settings, self.model_path, self.kv_events)

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
        self.adapters.engine = self.engine
        tokenizer = self.engine.get_tokenizer()
        self.tokenizer = await tokenizer if inspect.isawaitable(tokenizer) else tokenizer  # async in older vLLM
        self.max_model_len = int(self.engine.model_config.max_model_len)
        # as vLLM bounds prompt ids: the tokenizer's vocabulary or the model's, whichever is larger
        self.vocab_size = max(int(self.tokenizer.max_token_id) + 1,
                              int(self.engine.model_config.get_vocab_size()))
        self.prompt_probe = prompt_probe.digests(partial(encode_request, self.tokenizer))
        self.tasks = sorted(await self.engine.get_supported_tasks())

    async def sleep(self) -> float:
        """Free the engine's memory until :meth:`wake` (a multi-model worker's model going to sleep; no
        request may be running): vLLM's sleep mode, level 1 (weights to host memory, KV cache and
        prefix cache dropped), or, without it, the engine stopped. Returns the seconds it took."""
        t0 = time.monotonic()
        if self.sleep_mode:
            await self.engine.sleep(level=1)
        elif self.engine is not None:
            engine, self.engine = self.engine, None
            engine.shutdown()
            multiprocessing.active_children()  # reap its engine core (a stopped process stays a zombie)
        log.info("engine asleep (%s) in %.2f s", "sleep mode" if self.sleep_mode else "stopped",
                 time.monotonic() - t0)
        return time.monotonic() - t0

    async def wake(self) -> float:
        """Bring the engine back after :meth:`sleep`: vLLM's wake-up (the weights, unless
        :meth:`wake_weights` brought them already, then the KV cache), or a new engine started.
        Returns the seconds it took."""
        t0 = time.monotonic()
        if self.sleep_mode:
            if not self.weights_up:
                before = gpumem.free_bytes()
                await self.engine.wake_up(tags=["weights"])
                after = gpumem.free_bytes()
                if before is not None and after is not None and before > after:
                    self.weights_bytes = before - after
            await self.engine.wake_up(tags=["kv_cache"])
            self.weights_up = False
        elif self.engine is None:
            await self._create()
        log.info("engine awake (%s) in %.2f s", "sleep mode" if self.sleep_mode else "started",
                 time.monotonic() - t0)
        return time.monotonic() - t0

    async def wake_weights(self) -> bool:
        """Asleep in sleep mode: bring the weights back now if the GPU has room for them beside what
        runs there (NVML's free memory against their size at the last wake, and a margin), so that
        the wake that follows only maps the KV cache again. False where it cannot tell or they do
        not fit: the wake brings them as usual."""
        if not self.sleep_mode or self.weights_up or self.weights_bytes is None:
            return False
        free = gpumem.free_bytes()
        if free is None or free < self.weights_bytes + WEIGHTS_MARGIN_BYTES:
            log.info("weights not woken early: %s GiB free, %.1f GiB needed",
                     "?" if free is None else f"{free / 2**30:.1f}",
                     (self.weights_bytes + WEIGHTS_MARGIN_BYTES) / 2**30)
            return False
        t0 = time.monotonic()
        await self.engine.wake_up(tags=["weights"])
        self.weights_up = True
        log.info("weights woken early (%.1f GiB) in %.2f s", self.weights_bytes / 2**30, time.monotonic() - t0)
        return True

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
