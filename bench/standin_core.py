"""A stand-in for vLLM's EngineCore: the serving layer's ceiling with no model in the way.

vLLM's API server and an inferq worker both drive an ``AsyncLLM``, whose EngineCore client sends
requests to the engine's process and reads its outputs back. This module replaces that client
(``EngineCoreClient.make_async_mp_client``) with one that runs no engine: every ``step_ms`` (0: as
fast as the frontend reads) it gives every running request one new token, real token ids of the
model's own vocabulary, until the request's ``max_tokens``. Everything above the engine is vLLM's
and the server's own code, unchanged: the input processor, the output processor and its
detokenizer, and then vLLM's OpenAI server or inferq's worker, Redis and gateway. vLLM's Rust
frontend work uses the same idea (a mock engine behind the real frontend) for its frontend ceiling.

A process takes the stand-in when ``BENCH_STANDIN_CORE`` (the step in milliseconds) is set and
``bench/standin_core_site`` is on its ``PYTHONPATH`` (its ``sitecustomize`` calls :func:`install`);
:func:`standin_env` gives both. The harness sets them for ``vllm serve`` and inferq's workers when a
workload names ``standin_core_step_ms``.
"""

from __future__ import annotations

import asyncio
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SITE = Path(__file__).resolve().parent / "standin_core_site"
ENV = "BENCH_STANDIN_CORE"


def standin_env(step_ms: float, env: dict[str, str] | None = None) -> dict[str, str]:
    """What a process's environment needs for the stand-in (over ``env``, whose PYTHONPATH it keeps)."""
    path = (env or os.environ).get("PYTHONPATH", "")
    root = str(SITE.parent.parent)
    return {ENV: f"{step_ms:g}", "PYTHONPATH": os.pathsep.join(p for p in (str(SITE), root, path) if p)}


@dataclass
class _Running:
    left: int  # tokens still to give
    at: int  # where in the token cycle its next token is


class StandinCoreClient:
    """The async EngineCore client AsyncLLM uses, answering from a paced loop instead of an engine."""

    engine_ranks_managed = [0]

    def __init__(self, vllm_config: Any, *args: Any, renderer: Any = None, **kwargs: Any) -> None:
        from types import SimpleNamespace

        self.step_s = float(os.environ.get(ENV) or 0) / 1000
        self.resources = SimpleNamespace(engine_dead=False)
        self.running: dict[str, _Running] = {}
        self._wake: asyncio.Event | None = None
        self._next = 0.0
        self.tokens = _plain_tokens(renderer.tokenizer if renderer is not None else None)

    def _event(self) -> asyncio.Event:
        if self._wake is None:
            self._wake = asyncio.Event()
        return self._wake

    async def add_request_async(self, request: Any) -> None:
        sp = request.sampling_params
        n = sp.max_tokens if sp is not None and sp.max_tokens else 16
        self.running[request.request_id] = _Running(n, len(self.running) % len(self.tokens))
        self._event().set()

    async def abort_requests_async(self, request_ids: list[str]) -> None:
        for rid in request_ids:
            self.running.pop(rid, None)

    async def get_output_async(self) -> Any:
        from vllm.v1.engine import EngineCoreOutput, EngineCoreOutputs, FinishReason

        while not self.running:
            wake = self._event()
            wake.clear()
            await wake.wait()
        now = time.monotonic()
        if self.step_s and now < self._next:
            await asyncio.sleep(self._next - now)
        else:
            await asyncio.sleep(0)  # let the frontend run between steps, as an engine's round trip does
        self._next = time.monotonic() + self.step_s
        outs = []
        for rid, r in list(self.running.items()):
            r.left -= 1
            token = self.tokens[r.at % len(self.tokens)]
            r.at += 1
            done = r.left <= 0
            outs.append(EngineCoreOutput(request_id=rid, new_token_ids=[token],
                                         finish_reason=FinishReason.LENGTH if done else None))
            if done:
                del self.running[rid]
        return EngineCoreOutputs(outputs=outs)

    async def get_supported_tasks_async(self) -> tuple[str, ...]:
        return ("generate",)

    def dp_engines_running(self) -> bool:
        return False

    def get_kv_event_sources(self) -> list[Any]:
        return []

    def shutdown(self, timeout: float | None = None) -> None:
        self.running.clear()

    def __getattr__(self, name: str) -> Any:
        """Every other utility the frontend may call (caches, LoRA, sleep, profiling): answered at
        once, with nothing done."""
        if name.startswith("_"):
            raise AttributeError(name)
        if name.endswith("_async"):
            async def answer(*_args: Any, **_kwargs: Any) -> Any:
                return False if name.startswith("is_") else None
            return answer
        return lambda *_args, **_kwargs: None


def _plain_tokens(tokenizer: Any, n: int = 256) -> list[int]:
    """Ids of ``n`` plain word tokens of the vocabulary (letters only, no special tokens), so that
    detokenizing them is what it is for text."""
    if tokenizer is None:
        return list(range(100, 100 + n))
    special = set(getattr(tokenizer, "all_special_ids", []) or [])
    vocab = sorted(tokenizer.get_vocab().items(), key=lambda kv: kv[1])
    words = [i for t, i in vocab if i not in special and t.lstrip("Ġ▁").isalpha() and len(t) >= 3]
    return words[:n] or list(range(100, 100 + n))


def install() -> None:
    """Make every AsyncLLM of this process use the stand-in."""
    from vllm.v1.engine import core_client

    core_client.EngineCoreClient.make_async_mp_client = staticmethod(
        lambda *args, **kwargs: StandinCoreClient(*args, **kwargs))
