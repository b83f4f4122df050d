"""Deterministic prompts of exactly ``prompt_len`` tokens, as the worker will count them.

A prompt is a sequence of words, each one token of the model's vocabulary with a leading space,
drawn with a seeded RNG per prompt index (so every request's prompt is distinct). Its length is
checked with the model's own tokenizer the way the worker tokenizes (``tok.encode(prompt)``;
chat: the chat template, then ``encode(add_special_tokens=False)``) and trimmed until it is exact.

Every target sends the same prompts, except that the first word is replaced by a per-target
"salt" word: two targets served by one long-lived engine (inferq-ws then inferq-sse) would
otherwise hit each other's prefix cache, which the in-process and naive targets never do.
"""

from __future__ import annotations

import random
from functools import lru_cache
from typing import Any

POOL_SIZE = 2000


def resolve_model_path(model: str | None) -> str:
    """The model folder or id: ``model``, or the built-in tiny model (built on first use)."""
    if model:
        return model
    from inferq.shared.settings import Settings
    from inferq.worker.engine.models import tiny_model_dir

    return str(tiny_model_dir(Settings()))


@lru_cache(maxsize=4)
def load_tokenizer(model_path: str) -> Any:
    """The model's Hugging Face tokenizer (vLLM's workers load the same one)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_path)


def word_pool(tok: Any, size: int = POOL_SIZE) -> list[str]:
    """Alphabetic words that are a single token when preceded by a space, in vocabulary order."""
    vocab = min(int(len(tok)), 60_000)
    cands: list[str] = []
    for i in range(vocab):
        w = tok.decode([i]).strip()
        if w.isascii() and w.isalpha() and 2 <= len(w) <= 12:
            cands.append(w)
    cands = sorted(set(cands))
    ids = tok([" " + w for w in cands], add_special_tokens=False)["input_ids"]
    pool = [w for w, t in zip(cands, ids, strict=False) if len(t) == 1]
    if len(pool) < 64:
        pool = cands  # unusual tokenizer: lengths are still fitted exactly below
    if len(pool) < 16:
        raise RuntimeError("could not find enough single-token words in the tokenizer's vocabulary")
    return pool[:size]


class PromptBuilder:
    """Builds prompt ``i`` for target ``salt``: plain text, or chat content for OpenAI chat routes."""

    def __init__(self, tok: Any, prompt_len: int, seed: int = 0) -> None:
        self.tok = tok
        self.prompt_len = prompt_len
        self.seed = seed
        self.pool = word_pool(tok)
        self.salts = self.pool[::-1]

    def words(self, i: int, salt: int) -> list[str]:
        rng = random.Random(self.seed * 1_000_003 + i)
        ws = [rng.choice(self.pool) for _ in range(self.prompt_len + 8)]
        ws[0] = self.salts[salt % len(self.salts)]
        return ws

    def count_plain(self, text: str) -> int:
        return len(self.tok.encode(text))

    def count_chat(self, text: str) -> int:
        rendered = self.tok.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                                add_generation_prompt=True)
        return len(self.tok.encode(rendered, add_special_tokens=False))

    def _fit(self, words: list[str], chat: bool) -> str:
        count = self.count_chat if chat else self.count_plain
        n, k = self.prompt_len, min(self.prompt_len, len(words))
        tried: set[int] = set()
        for _ in range(32):
            text = "".join(" " + w for w in words[:k])
            c = count(text)
            if c == n:
                return text
            tried.add(k)
            k = max(1, min(len(words), k + (n - c)))
            if k in tried:  # oscillating: walk down one word at a time
                k = min(tried) - 1 if c > n else max(tried) + 1
                if k < 1 or k > len(words):
                    break
        raise RuntimeError(f"cannot build a prompt of exactly {n} tokens (chat={chat})")

    def text(self, i: int, salt: int) -> str:
        """Prompt ``i`` as plain text: ``tok.encode(text)`` has exactly ``prompt_len`` ids."""
        return self._fit(self.words(i, salt), chat=False)

    def chat_content(self, i: int, salt: int) -> str:
        """User message content whose chat-templated prompt has exactly ``prompt_len`` tokens."""
        return self._fit(self.words(i, salt), chat=True)

    def ids(self, text: str) -> list[int]:
        return list(self.tok.encode(text))
