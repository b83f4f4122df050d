"""The gateway's tokenizing of a job's prompt: counted against the context window before it is
queued and, where this gateway tokenizes it as the model's workers do (shared/prompt_probe.py),
sent with the job as token ids, so the worker does not tokenize it again.

The gateway reads the model's ``tokenizer.json`` with the ``tokenizers`` library and renders chat
templates itself (api/chat_template.py); it never imports transformers or vLLM.
"""

from __future__ import annotations

import asyncio
import logging
from functools import cached_property, lru_cache
from pathlib import Path

from tokenizers import Tokenizer

from inferq.api.chat_template import render_chat
from inferq.shared import prompt_probe
from inferq.shared.schemas import JobRequest, WorkerInfo

log = logging.getLogger(__name__)

#: A prompt longer than this (characters) is tokenized on a thread, off the gateway's event loop.
INLINE_CHARS = 16_384


class GatewayTokenizer:
    """The tokenizer and chat template of the model in ``folder``."""

    def __init__(self, folder: Path, tokenizer: Tokenizer) -> None:
        self.folder = folder
        self.tokenizer = tokenizer

    def encode(self, req: JobRequest) -> list[int]:
        """``req``'s prompt as token ids (a text prompt with the tokenizer's special tokens; chat
        messages rendered with the chat template, adding none), as the worker's
        ``encode_request`` makes them."""
        if req.messages is None:
            return list(self.tokenizer.encode(req.prompt).ids)
        text = render_chat(self.folder, req.chat_messages(), req.add_generation_prompt, req.tools)
        return list(self.tokenizer.encode(text, add_special_tokens=False).ids)

    @cached_property
    def probe(self) -> dict[str, str]:
        return prompt_probe.digests(self.encode)


@lru_cache(maxsize=8)
def gateway_tokenizer(folder: str) -> GatewayTokenizer | None:
    """The model's tokenizer, when this gateway can read its folder (None otherwise)."""
    file = Path(folder) / "tokenizer.json"
    if not file.is_file():
        return None
    return GatewayTokenizer(Path(folder), Tokenizer.from_file(str(file)))


_disagreed: set[tuple[str, str]] = set()


def _agrees(tok: GatewayTokenizer, info: WorkerInfo, form: str) -> bool:
    mine, theirs = tok.probe.get(form), info.prompt_probe.get(form)
    if mine is not None and mine == theirs:
        return True
    if theirs is not None and (info.tokenizer or "", form) not in _disagreed:
        _disagreed.add((info.tokenizer or "", form))
        log.warning("this gateway tokenizes %s prompts of %s unlike its workers: they tokenize them", form,
                    info.tokenizer)
    return False


async def tokenize(req: JobRequest, info: WorkerInfo) -> tuple[int | None, list[int] | None]:
    """(how many tokens ``req``'s prompt has, where this gateway can tell; its token ids, where the
    model's workers would make the same: only those go with the job). Ids the client gave are
    counted as they are; a text prompt is counted whenever the gateway reads the model's tokenizer,
    chat messages only where its chat template renders them as the workers' does."""
    if req.prompt_token_ids is not None:
        return len(req.prompt_token_ids), None
    form = prompt_probe.form(req)
    tok = gateway_tokenizer(info.tokenizer) if info.tokenizer else None
    if tok is None or form is None:
        return None, None
    agrees = _agrees(tok, info, form)
    if form == prompt_probe.CHAT and not agrees:
        return None, None
    if len(req.prompt or "") + sum(len(m.content) for m in req.messages or ()) > INLINE_CHARS:
        ids = await asyncio.to_thread(tok.encode, req)
    else:
        ids = tok.encode(req)
    return len(ids), ids if agrees else None
