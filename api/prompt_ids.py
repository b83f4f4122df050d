"""The gateway's tokenizing of a job's prompt: counted against the context window before it is
queued and, where this gateway tokenizes it as the model's workers do (shared/prompt_probe.py),
sent with the job as token ids, so the worker does not tokenize it again.

The gateway reads the model's ``tokenizer.json`` with the ``tokenizers`` library and renders chat
templates itself (api/chat_template.py); it never imports transformers or vLLM.
"""

from __future__ import annotations

import asyncio
import logging
from functools import cached_property
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


_loaded: dict[str, GatewayTokenizer] = {}


def gateway_tokenizer(folder: str) -> GatewayTokenizer | None:
    """The model's tokenizer, when this gateway can read its folder (None otherwise: looked for
    again next time, as a worker may still be building it)."""
    tok = _loaded.get(folder)
    if tok is None:
        file = Path(folder) / "tokenizer.json"
        if not file.is_file():
            return None
        if len(_loaded) >= 8:  # a few models per gateway
            _loaded.clear()
        tok = _loaded[folder] = GatewayTokenizer(Path(folder), Tokenizer.from_file(str(file)))
    return tok


_disagreed: set[tuple[str, str]] = set()


def _agreeing(folders: list[str], info: WorkerInfo, form: str) -> GatewayTokenizer | None:
    """The first tokenizer in ``folders`` that tokenizes ``form`` as ``info``'s worker does."""
    theirs = info.prompt_probe.get(form)
    readable = [t for f in dict.fromkeys(folders) if (t := gateway_tokenizer(f)) is not None]
    for tok in readable:
        if theirs is not None and tok.probe.get(form) == theirs:
            return tok
    if theirs is not None and readable and (info.tokenizer or "", form) not in _disagreed:
        _disagreed.add((info.tokenizer or "", form))
        log.warning("this gateway does not tokenize %s prompts of model %r as its workers do (%s): the "
                    "workers tokenize them", form, info.model, ", ".join(str(t.folder) for t in readable))
    return None


async def tokenize(req: JobRequest, info: WorkerInfo, tokenizer_dir: str | None = None
                   ) -> tuple[int | None, list[int] | None]:
    """(how many tokens ``req``'s prompt has, where this gateway can tell; its token ids, where
    they are the ones the model's workers would make: only those go with the job). The gateway
    reads the worker's model folder (``info.tokenizer``) if it can, else ``tokenizer_dir``
    (``INFERQ_TOKENIZER_PATH``, for the default model). Ids the client gave are counted as they
    are; chat messages are counted only where the gateway renders them as the workers do; a text
    prompt is also counted, without sending ids, with the worker's folder when the workers
    announce no probe."""
    if req.prompt_token_ids is not None:
        return len(req.prompt_token_ids), None
    form = prompt_probe.form(req)
    if form is None:
        return None, None
    tok = _agreeing([f for f in (info.tokenizer, tokenizer_dir) if f], info, form)
    send = tok is not None
    if tok is None and form == prompt_probe.PROMPT and info.tokenizer:
        tok = gateway_tokenizer(info.tokenizer)
    if tok is None:
        return None, None
    if len(req.prompt or "") + sum(len(m.content) for m in req.messages or ()) > INLINE_CHARS:
        ids = await asyncio.to_thread(tok.encode, req)
    else:
        ids = tok.encode(req)
    return len(ids), ids if send else None
