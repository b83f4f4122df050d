"""The gateway's tokenizing of a job's prompt: counted against the context window before it is
queued and, where this gateway tokenizes it as the model's workers do (shared/prompt_probe.py),
sent with the job as token ids, so the worker does not tokenize it again.

The gateway reads the model's tokenizer with the ``tokenizers`` library and renders chat templates
itself (api/chat_template.py); it never imports transformers or vLLM. It has the tokenizer from the
model's folder where it can read it, or from what the workers published in Redis
(worker/engine/tokenizer_files.py: a gateway on another host).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Callable
from functools import cached_property, partial
from pathlib import Path
from typing import Any

from redis.asyncio import Redis
from tokenizers import Tokenizer

from inferq.api import chat_template
from inferq.api.chat_template import ChatTemplate
from inferq.shared import prompt_probe
from inferq.shared.errors import Unavailable
from inferq.shared.redis import text_map
from inferq.shared.schemas import JobRequest, WorkerInfo

log = logging.getLogger(__name__)

#: A prompt longer than this (characters) is tokenized on a thread, off the gateway's event loop.
INLINE_CHARS = 16_384


class GatewayTokenizer:
    """A model's tokenizer and chat template as this gateway has them (``name``: where from)."""

    def __init__(self, name: str, tokenizer: Tokenizer, template: Callable[[], ChatTemplate]) -> None:
        self.name = name
        self.tokenizer = tokenizer
        self._template = template

    def encode(self, req: JobRequest) -> list[int]:
        """``req``'s prompt as token ids (a text prompt with the tokenizer's special tokens; chat
        messages rendered with the chat template, adding none), as the worker's
        ``encode_request`` makes them."""
        if req.messages is None:
            return list(self.tokenizer.encode(req.prompt).ids)
        text = self.render_chat(req.chat_messages(), req.add_generation_prompt, req.tools, req.continue_final_message)
        return list(self.tokenizer.encode(text, add_special_tokens=False).ids)

    def render_chat(self, messages: list[dict[str, Any]], add_generation_prompt: bool,
                    tools: list[dict[str, Any]] | None, continue_final_message: bool = False) -> str:
        """The messages rendered with the model's chat template (Unavailable: it has none)."""
        return self._template().render(messages, add_generation_prompt, tools, continue_final_message)

    @cached_property
    def probe(self) -> dict[str, str]:
        return prompt_probe.digests(self.encode)


_loaded: dict[str, GatewayTokenizer] = {}


def gateway_tokenizer(folder: str) -> GatewayTokenizer | None:
    """The tokenizer of the model in ``folder``, when this gateway can read it (None otherwise:
    looked for again next time, as a worker may still be building it)."""
    tok = _loaded.get(folder)
    if tok is None:
        file = Path(folder) / "tokenizer.json"
        if not file.is_file():
            return None
        if len(_loaded) >= 8:  # a few models per gateway
            _loaded.clear()
        tok = _loaded[folder] = GatewayTokenizer(folder, Tokenizer.from_file(str(file)),
                                                 partial(chat_template.load, Path(folder)))
    return tok


def from_files(name: str, files: dict[str, str]) -> GatewayTokenizer:
    """A tokenizer from what a worker published (worker/engine/tokenizer_files.py)."""
    source = files.get("chat_template")
    template = ChatTemplate(source, json.loads(files.get("config") or "{}")) if source else None

    def chat() -> ChatTemplate:
        if template is None:
            raise Unavailable("the model has no chat template", code="tokenizer_unavailable")
        return template

    return GatewayTokenizer(name, Tokenizer.from_str(files["tokenizer"]), chat)


class Published:
    """Tokenizers workers published in Redis, loaded once per key in the background: a request
    never waits for one (until it is loaded, prompts go as they did without it)."""

    RETRY_S = 30.0  # a key found missing or unreadable is looked for again after this

    def __init__(self, redis: Redis) -> None:
        self.redis = redis
        self._got: dict[str, GatewayTokenizer] = {}
        self._failed: dict[str, float] = {}
        self._loading: dict[str, asyncio.Task[None]] = {}

    def get(self, key: str | None) -> GatewayTokenizer | None:
        if key is None:
            return None
        tok = self._got.get(key)
        if tok is None and key not in self._loading and time.monotonic() >= self._failed.get(key, 0.0):
            task = asyncio.get_running_loop().create_task(self._load(key))
            self._loading[key] = task
            task.add_done_callback(lambda _t: self._loading.pop(key, None))
        return tok

    async def wait(self, key: str | None, timeout_s: float = 10.0) -> GatewayTokenizer | None:
        """:meth:`get`, waiting for a load it starts or finds under way (for a client that asked
        for the tokenizer itself: ``/tokenize``)."""
        tok = self.get(key)
        if tok is None and key is not None and (task := self._loading.get(key)) is not None:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout_s):
                    await asyncio.shield(task)
            tok = self._got.get(key)
        return tok

    async def _load(self, key: str) -> None:
        try:
            files = text_map(await self.redis.hgetall(key))
            if "tokenizer" not in files:
                raise LookupError("nothing published under this key")
            tok = await asyncio.to_thread(from_files, key, files)
            await asyncio.to_thread(lambda: tok.probe)  # computed off the loop too
        except Exception as e:
            log.warning("could not load the tokenizer a worker published as %s (looked for again in %.0f s): %s",
                        key, self.RETRY_S, e)
            self._failed[key] = time.monotonic() + self.RETRY_S
            return
        if len(self._got) >= 8:
            self._got.clear()
        self._got[key] = tok


_disagreed: set[tuple[str, str]] = set()


def _agreeing(candidates: list[GatewayTokenizer], info: WorkerInfo, form: str) -> GatewayTokenizer | None:
    """The first of ``candidates`` that tokenizes ``form`` as ``info``'s worker does."""
    theirs = info.prompt_probe.get(form)
    for tok in candidates:
        if theirs is not None and tok.probe.get(form) == theirs:
            return tok
    if theirs is not None and candidates and (info.model, form) not in _disagreed:
        _disagreed.add((info.model, form))
        log.warning("this gateway does not tokenize %s prompts of model %r as its workers do (%s): the "
                    "workers tokenize them", form, info.model, ", ".join(t.name for t in candidates))
    return None


async def tokenize(req: JobRequest, info: WorkerInfo, tokenizer_dir: str | None = None,
                   published: GatewayTokenizer | None = None) -> tuple[int | None, list[int] | None]:
    """(how many tokens ``req``'s prompt has, where this gateway can tell; its token ids, where
    they are the ones the model's workers would make: only those go with the job). The gateway
    tries the worker's model folder (``info.tokenizer``) if it can read it, the tokenizer the
    worker ``published``, then ``tokenizer_dir`` (``INFERQ_TOKENIZER_PATH``, for the default
    model). Ids the client gave are counted as they are; chat messages are counted only where the
    gateway renders them as the workers do; a text prompt is also counted, without sending ids,
    with the worker's folder when the workers announce no probe."""
    if req.prompt_token_ids is not None:
        return len(req.prompt_token_ids), None
    form = prompt_probe.form(req)
    if form is None:
        return None, None
    own = gateway_tokenizer(info.tokenizer) if info.tokenizer else None
    dir_tok = gateway_tokenizer(tokenizer_dir) if tokenizer_dir else None
    candidates = [t for t in (own, published, dir_tok) if t is not None]
    tok = _agreeing(list({id(t): t for t in candidates}.values()), info, form)
    send = tok is not None
    if tok is None and form == prompt_probe.PROMPT:
        tok = own
    if tok is None:
        return None, None
    if len(req.prompt or "") + sum(len(m.content) for m in req.messages or ()) > INLINE_CHARS:
        ids = await asyncio.to_thread(tok.encode, req)
    else:
        ids = tok.encode(req)
    return len(ids), ids if send else None
