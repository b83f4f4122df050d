"""Stand-ins for vLLM where the worker's own code is what is measured or tested: the shape of
``AsyncLLM``'s DELTA outputs, a tokenizer, and ``EngineHost``'s interface around any scripted
engine with its loop in a thread of its own (as the real one has). The worker-alone benchmark
(``bench/worker.py``) and the worker's unit tests share them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from inferq.shared.schemas import EngineStats
from inferq.worker.engine.adapters import EngineAdapters
from inferq.worker.loopthread import LoopThread


@dataclass
class Out:
    """One choice of a ``RequestOutput``: what a step added to it."""

    index: int
    text: str
    token_ids: list[int]
    finish_reason: str | None = None
    stop_reason: str | int | None = None  # a stop string, or a stop token id
    logprobs: None = None


@dataclass
class Step:
    """One ``RequestOutput``."""

    outputs: list[Out]
    finished: bool = False
    prompt_logprobs: list[Any] | None = None


class ScriptedTokenizer:
    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return list(range(len(text.split())))

    def apply_chat_template(self, messages: Any, tokenize: bool = False, add_generation_prompt: bool = True,
                            tools: Any = None) -> str:
        return " ".join(m["content"] for m in messages)

    def decode(self, ids: list[int]) -> str:
        return "?"


class LoopHost:
    """``EngineHost``'s interface around a scripted engine, its loop in a thread of its own."""

    def __init__(self, engine: Any, max_model_len: int = 64, thread_name: str = "scripted-engine-loop") -> None:
        self.engine = engine
        self.tokenizer = ScriptedTokenizer()
        self.max_model_len = max_model_len
        self.vocab_size = 0  # unknown: prompts of token ids are not checked against it
        self.prompt_probe: dict[str, str] = {}  # no gateway tokenizes as the scripted tokenizer does
        self.model_path = "scripted"
        self.frontend = None  # a lone worker, not a frontend of an engine group
        self.stats = EngineStats()
        self.adapters = EngineAdapters(enabled=False)  # no LoRA on a scripted engine
        self.tasks = ["generate"]  # a scripted engine generates text
        self.kv_events: str | None = None  # it publishes no KV-cache events
        self._thread = LoopThread(thread_name)
        self.loop = self._thread.loop

    def start(self) -> None:
        self._thread.start()

    def run(self, coro: Any) -> Any:
        return self._thread.run(coro)

    def submit(self, coro: Any) -> Any:
        """Schedule ``coro`` on the loop; returns its concurrent future."""
        return self._thread.submit(coro)

    def unfinished_requests(self) -> int:
        return 0

    async def sleep(self) -> float:
        """A multi-model worker's model goes to sleep: the scripted engine's ``sleep(level=1)``."""
        await self.engine.sleep(level=1)
        return 0.0

    async def wake(self) -> float:
        await self.engine.wake_up()
        return 0.0

    async def wake_weights(self) -> bool:
        return False  # no GPU memory to share: the wake brings everything

    def stop(self) -> None:
        self._thread.stop()
