"""OpenAI streams from job events: the SSE payloads of a streamed chat completion or text
completion, ``[DONE]`` (or an error) last. Several prompts of one text completion stream one after
another; choice ``i`` of prompt ``p`` is OpenAI's choice ``p * n + i``. Every token is a chunk that
differs from the last only in its text: the common one is filled into a template
(api/openai/chunk_template.py) instead of being built and dumped.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from functools import partial
from typing import Literal

from inferq.api.errors import error_body
from inferq.api.frames import PlainToken
from inferq.api.openai import tools
from inferq.api.openai.answers import Choice, add_usage, chat_logprobs, completion_logprobs
from inferq.api.openai.chunk_template import TextTemplate
from inferq.api.openai.messages import NamedToolChoice
from inferq.api.openai.objects import (
    ChatCompletionChunk,
    ChatLogprobs,
    ChunkChoice,
    Delta,
    TextChoice,
    TextCompletion,
    ToolCallDelta,
)
from inferq.api.openai.params import ChatCompletionRequest, CompletionRequest
from inferq.api.openai.sent_events import sent_batches
from inferq.api.sse import Payload
from inferq.api.streams import StreamHub
from inferq.shared.errors import InferqError, Unavailable, error_from
from inferq.shared.schemas import DoneEvent, ErrorEvent, RestartEvent, TokenEvent, Usage

#: The last payload of a stream that ended well.
DONE = Payload("[DONE]", last=True)


async def chat_chunks(hub: StreamHub, job_id: str, model: str,
                      req: ChatCompletionRequest) -> AsyncIterator[Payload]:
    """The SSE payloads of a streamed chat completion, ``[DONE]`` (or an error) last."""
    stream = _ChatStream(job_id, model, req)
    async for events in sent_batches(hub, job_id):
        for ev in events:
            if ev.type == "token":
                for payload in stream.token(ev):
                    yield payload
            elif ev.type == "done":
                for choices, usage in _last_chunks(req, stream.calls, ev, stream.include_usage):
                    yield stream.chunk(choices, usage)
            else:
                yield _stream_end_error(job_id, ev)
                return
    yield DONE


class _ChatStream:
    """The chunks of one chat stream's tokens: the role first (per choice), then the text; a
    plain text chunk is filled into its choice's template."""

    def __init__(self, job_id: str, model: str, req: ChatCompletionRequest) -> None:
        self.job_id, self.model, self.req = job_id, model, req
        self.created, self.k = int(time.time()), req.top_logprobs or 0
        self.include_usage = bool(req.stream_options and req.stream_options.include_usage)
        self.started: set[int] = set()  # choices whose role was sent
        self.plain: dict[int, TextTemplate] = {}  # per choice: a plain text chunk's template
        self.calls = _StreamedCalls(req)

    def chunk_model(self, choices: list[ChunkChoice], usage: Usage | None = None) -> ChatCompletionChunk:
        return ChatCompletionChunk(id=self.job_id, created=self.created, model=self.model, choices=choices,
                                   usage=usage)

    def chunk(self, choices: list[ChunkChoice], usage: Usage | None = None) -> Payload:
        return Payload(self.chunk_model(choices, usage).model_dump_json(exclude_none=True))

    def _text_chunk(self, index: int, text: str) -> ChatCompletionChunk:
        return self.chunk_model([ChunkChoice(index=index, delta=Delta(content=text))])

    def token(self, ev: TokenEvent | PlainToken) -> list[Payload]:
        lps = chat_logprobs(ev.logprobs, self.k) if self.req.logprobs else None
        if self.calls.forced or ev.tool_calls:
            return self._calls(ev, lps)
        if ev.index in self.started and lps is None:  # the common chunk: its text in a template
            if (t := self.plain.get(ev.index)) is None:
                t = self.plain[ev.index] = TextTemplate(partial(self._text_chunk, ev.index))
            return [Payload(t.fill_json(ev.text_json) if isinstance(ev, PlainToken) else t.fill(ev.text))]
        role: Literal["assistant"] | None = None if ev.index in self.started else "assistant"
        self.started.add(ev.index)
        return [self.chunk([ChunkChoice(index=ev.index, delta=Delta(role=role, content=ev.text), logprobs=lps)])]

    def _calls(self, ev: TokenEvent | PlainToken, lps: ChatLogprobs | None) -> list[Payload]:
        """A token of a forced tool call, or one where the worker's parser found calls."""
        out = []
        if ev.index not in self.started:  # the role first, with empty content, as vLLM
            self.started.add(ev.index)
            out.append(self.chunk([ChunkChoice(index=ev.index, delta=Delta(role="assistant", content=""))]))
        delta = self.calls.add(ev.index, ev.text) if self.calls.forced else _parsed_delta(ev)
        if delta is not None:
            out.append(self.chunk([ChunkChoice(index=ev.index, delta=delta, logprobs=lps)]))
        return out


def _last_chunks(req: ChatCompletionRequest, calls: _StreamedCalls, ev: DoneEvent,
                 include_usage: bool) -> list[tuple[list[ChunkChoice], Usage | None]]:
    """The chunks that end a chat stream, as (choices, usage): per choice, the tool calls of a
    forced ``required`` answer and its finish reason; then the usage, when asked for."""
    out: list[tuple[list[ChunkChoice], Usage | None]] = []
    for end in ev.choices:
        if (delta := calls.finish(end.index)) is not None:
            out.append(([ChunkChoice(index=end.index, delta=delta)], None))
        reason = tools.finish_reason(req, end.finish_reason)
        out.append(([ChunkChoice(index=end.index, delta=Delta(), finish_reason=reason, stop_reason=end.stop_reason)],
                    None))
    if include_usage:
        out.append(([], ev.usage))
    return out


def _parsed_delta(ev: TokenEvent | PlainToken) -> Delta:
    """A chunk of what the worker's parser found: content not part of a call, and call pieces."""
    return Delta(content=ev.text or None, tool_calls=[
        ToolCallDelta(index=p.index, id=p.id, type="function" if p.id else None,
                      function={k: v for k, v in (("name", p.name), ("arguments", p.arguments)) if v is not None})
        for p in ev.tool_calls or []])


class _StreamedCalls:
    """The tool calls of a forced stream: a named call streams its arguments as they come (the
    first piece with the call's id and name); ``required`` calls are sent whole once the array is
    complete (a partial array is not yet calls)."""

    def __init__(self, req: ChatCompletionRequest) -> None:
        self.req = req
        self.forced = tools.forced(req)
        self.named = isinstance(req.tool_choice, NamedToolChoice)
        self.texts: dict[int, str] = {}

    def add(self, index: int, text: str) -> Delta | None:
        first = index not in self.texts
        self.texts[index] = self.texts.get(index, "") + text
        if not self.named:
            return None
        if first:
            name = self.req.tool_choice.function.name  # type: ignore[union-attr]
            return Delta(tool_calls=[ToolCallDelta(index=0, id=tools.call_id(), type="function",
                                                   function={"name": name, "arguments": text})])
        return Delta(tool_calls=[ToolCallDelta(index=0, function={"arguments": text})])

    def finish(self, index: int) -> Delta | None:
        if not self.forced or self.named:
            return None
        found = tools.tool_calls(self.req, self.texts.get(index, ""))
        if not found:
            return None
        return Delta(tool_calls=[ToolCallDelta(index=i, id=c.id, type="function",
                                               function={"name": c.function.name, "arguments": c.function.arguments})
                                 for i, c in enumerate(found)])


def _stream_end_error(job_id: str, ev: ErrorEvent | RestartEvent) -> Payload:
    """The last SSE payload of a stream that cannot finish: the job failed, or restarted."""
    err = _restarted(job_id) if ev.type == "restart" else error_from(ev.error)
    return Payload(error_body(err).model_dump_json(), last=True, error=err)


def _restarted(job_id: str) -> InferqError:
    """A stream cannot take back text it sent: end it, and say where the new attempt can be read."""
    return Unavailable(f"the worker generating this completion was lost and generation restarted; "
                       f"retry, or read the new attempt at /v1/jobs/{job_id}", code="restarted")


async def completion_chunks(hub: StreamHub, job_ids: list[str], model: str,
                            req: CompletionRequest) -> AsyncIterator[Payload]:
    """SSE payloads of a streamed text completion; several prompts stream one after another."""
    stream = _CompletionStream(job_ids[0], model, req)
    for p, job_id in enumerate(job_ids):
        async for events in sent_batches(hub, job_id):
            for ev in events:
                if ev.type == "token":
                    yield stream.token(p * req.n + ev.index, ev)
                elif ev.type == "done":
                    for payload in stream.done(p, ev):
                        yield payload
                else:
                    yield _stream_end_error(job_id, ev)
                    return
    if stream.include_usage:
        yield Payload(stream.chunk([], stream.total).model_dump_json())
    yield DONE


class _CompletionStream:
    """The chunks of a text completion's stream (its first job's id is the completion's)."""

    def __init__(self, completion_id: str, model: str, req: CompletionRequest) -> None:
        self.id, self.model, self.req = completion_id, model, req
        self.created, self.k = int(time.time()), req.logprobs or 0
        self.include_usage = bool(req.stream_options and req.stream_options.include_usage)
        self.total = Usage()
        self.plain: dict[int, TextTemplate] = {}  # per choice: a plain text chunk's template

    def chunk(self, choices: list[TextChoice], usage: Usage | None = None) -> TextCompletion:
        return TextCompletion(id=self.id, created=self.created, model=self.model, choices=choices, usage=usage)

    def _text_chunk(self, index: int, text: str) -> TextCompletion:
        return self.chunk([TextChoice(index=index, text=text)])

    def token(self, index: int, ev: TokenEvent | PlainToken) -> Payload:
        """The chunk of a token of OpenAI's choice ``index``."""
        if self.req.logprobs is None:  # the common chunk: its text in a template
            if (t := self.plain.get(index)) is None:
                t = self.plain[index] = TextTemplate(partial(self._text_chunk, index))
            return Payload(t.fill_json(ev.text_json) if isinstance(ev, PlainToken) else t.fill(ev.text))
        lp = completion_logprobs(Choice(logprobs=ev.logprobs or []), self.k)
        choice = TextChoice(index=index, text=ev.text, logprobs=lp)
        return Payload(self.chunk([choice]).model_dump_json(exclude_none=True))

    def done(self, prompt: int, ev: DoneEvent) -> list[Payload]:
        """The last chunk of each of prompt ``prompt``'s choices (its finish reason)."""
        self.total = add_usage(self.total, ev.usage)
        n = self.req.n
        return [Payload(self.chunk([TextChoice(index=prompt * n + end.index, text="", finish_reason=end.finish_reason,
                                               stop_reason=end.stop_reason)]).model_dump_json(exclude_none=True))
                for end in ev.choices]
