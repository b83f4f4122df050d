"""A job's prompt as the engine takes it: token ids (as the gateway tokenized it, as the client
gave them, or tokenized here), and with ``echo`` its text. CPU work for a thread, never the loop."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from dataclasses import dataclass
from typing import Any, Protocol

from inferq.shared.request_limits import check_token_ids, check_vocabulary
from inferq.shared.schemas import JobMessage
from inferq.worker.engine.encode import encode_request


class TokenizerHost(Protocol):
    """What preparing reads of the engine host (set once its engine has started)."""

    tokenizer: Any
    vocab_size: int  # token ids from 0 to this (excluded) are the model's; 0: unknown


@dataclass
class Prepared:
    """A job's prompt as the engine takes it: its token ids and, with ``echo``, its text; an
    embedding job's inputs as token ids instead (``inputs``, ``ids`` empty)."""

    ids: list[int]
    echo: str | None = None
    inputs: list[list[int]] | None = None


def cut_texts(texts: list[str], limits: list[int] | None, tokenizer: Any) -> list[str]:
    """Each text cut to its first N tokens (its limit; 0: whole), as vLLM cuts rerank and score
    inputs (``max_tokens_per_doc``): at the character where the N-th token ends, so that the
    text, tokenized again, is the model's own tokens."""
    if not limits:
        return texts
    from vllm.entrypoints.pooling.scoring.utils import truncate_text_to_tokens

    return [truncate_text_to_tokens(t, tokenizer, n) if n else t for t, n in zip(texts, limits, strict=True)]


class Preparer:
    """Tokenizes jobs' prompts with the engine's tokenizer, one at a time (it is not thread-safe)."""

    def __init__(self, host: TokenizerHost) -> None:
        self.host = host
        self._lock = threading.Lock()

    def prepare(self, msg: JobMessage) -> Prepared:
        """The job's token ids and, with ``echo``, its prompt's text. Token ids the request names
        outside the model's vocabulary are refused here, naming the field (vLLM would not)."""
        if self.host.vocab_size:
            check_vocabulary(msg.request, self.host.vocab_size)
        if (embed := msg.request.embed) is not None:
            if embed.token_ids is not None:
                return Prepared([], inputs=[self._checked(ids, "input") for ids in embed.token_ids])
            special = embed.add_special_tokens
            with self._lock:
                texts = cut_texts(embed.texts or [], embed.text_max_tokens, self.host.tokenizer)
                return Prepared([], inputs=[list(self.host.tokenizer.encode(t, add_special_tokens=special))
                                            for t in texts])
        ids = self.prompt_ids(msg)
        return Prepared(ids, self.echo_text(msg, ids) if msg.request.echo else None)

    async def prepared(self, msg: JobMessage, fut: concurrent.futures.Future[Prepared] | None) -> Prepared:
        """The job's prompt: from the caller's thread if it made it (usually done when the claim is
        back), else tokenized on a thread now. Raises what :meth:`prepare` raised (e.g. a bad template)."""
        if fut is None:
            return await asyncio.to_thread(self.prepare, msg)
        if not fut.done():
            await asyncio.wrap_future(fut)
        return fut.result()

    def prompt_ids(self, msg: JobMessage) -> list[int]:
        """The job's prompt as token ids: as the gateway tokenized it, as given, or tokenized here."""
        req = msg.request
        if msg.prompt_ids is not None:
            return self._checked(msg.prompt_ids)
        if req.prompt_token_ids is not None:
            return self._checked(req.prompt_token_ids)
        with self._lock:
            return encode_request(self.host.tokenizer, req)

    def _checked(self, ids: list[int], param: str = "prompt") -> list[int]:
        """A prompt given as token ids, each in the model's vocabulary (vLLM refuses others too,
        without naming the field)."""
        if self.host.vocab_size:  # 0: unknown (the engine still checks, naming no field)
            check_token_ids(ids, self.host.vocab_size, param)
        return list(ids)

    def echo_text(self, msg: JobMessage, ids: list[int]) -> str | None:
        """With ``echo``, the prompt's text: as given, or its token ids decoded (as vLLM does)."""
        req = msg.request
        if not req.echo:
            return None
        if req.prompt is not None:
            return req.prompt
        with self._lock:
            return str(self.host.tokenizer.decode(ids))
