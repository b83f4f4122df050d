"""OpenAI streams from job events: the SSE payloads of a streamed chat completion or text
completion, ``[DONE]`` (or an error) last. Several prompts of one text completion stream one after
another; choice ``i`` of prompt ``p`` is OpenAI's choice ``p * n + i``. Every token is a chunk that
differs from the last only in its text: the common one is filled into a template
(api/openai/chunk_template.py) instead of being built and dumped.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

from inferq.api.errors import error_body
from inferq.api.openai import tools
from inferq.api.openai.answers import Choice, add_usage, chat_logprobs, completion_logprobs
from inferq.api.openai.chunk_template import TextTemplate
from inferq.api.openai.messages import NamedToolChoice
from inferq.api.openai.objects import ChatCompletionChunk, ChunkChoice, Delta, TextChoice, TextCompletion, ToolCallDelta
from inferq.api.openai.params import ChatCompletionRequest, CompletionRequest
from inferq.api.sse import Payload
from inferq.api.streams import PlainToken, StreamHub, from_last_restart, merged
from inferq.shared.errors import InferqError, Unavailable, error_from
from inferq.shared.schemas import DoneEvent, ErrorEvent, RestartEvent, TokenEvent, Usage

#: The last payload of a stream that ended well.
DONE = Payload("[DONE]", last=True)


async def chat_chunks(hub: StreamHub, job_id: str, model: str,
                      req: ChatCompletionRequest) -> AsyncIterator[Payload]:
    """The SSE payloads of a streamed chat completion, ``[DONE]`` (or an error) last."""
    created, k = int(time.time()), req.top_logprobs or 0
    include_usage = bool(req.stream_options and req.stream_options.include_usage)
    started: set[int] = set()

    def chunk_model(choices: list[ChunkChoice], usage: Usage | None = None) -> ChatCompletionChunk:
        return ChatCompletionChunk(id=job_id, created=created, model=model, choices=choices, usage=usage)

    def chunk(choices: list[ChunkChoice], usage: Usage | None = None) -> Payload:
        return Payload(chunk_model(choices, usage).model_dump_json(exclude_none=True))

    plain: dict[int, TextTemplate] = {}  # per completion: a plain text chunk's template

    calls = _StreamedCalls(req)
    async for batch in hub.batches(job_id, kind="sse"):  # not hub.events: one async hop less per token
        for ev in merged(from_last_restart(batch)):
            if ev.type == "restart" and not started:  # nothing sent yet: the next attempt just streams
                continue
            if ev.type == "token" and ev.prompt_logprobs is not None:  # never streamed
                continue
            if ev.type == "token":
                lps = chat_logprobs(ev.logprobs, k) if req.logprobs else None
                if calls.forced or ev.tool_calls:
                    if ev.index not in started:  # the role first, with empty content, as vLLM
                        started.add(ev.index)
                        yield chunk([ChunkChoice(index=ev.index, delta=Delta(role="assistant", content=""))])
                    delta = calls.add(ev.index, ev.text) if calls.forced else _parsed_delta(ev)
                    if delta is not None:
                        yield chunk([ChunkChoice(index=ev.index, delta=delta, logprobs=lps)])
                    continue
                if ev.index in started and lps is None:  # the common chunk: its text in a template
                    if (t := plain.get(ev.index)) is None:
                        t = plain[ev.index] = TextTemplate(
                            lambda text, i=ev.index: chunk_model([ChunkChoice(index=i, delta=Delta(content=text))]))
                    yield Payload(t.fill_json(ev.text_json) if isinstance(ev, PlainToken) else t.fill(ev.text))
                    continue
                role = None if ev.index in started else "assistant"
                started.add(ev.index)
                yield chunk([ChunkChoice(index=ev.index, delta=Delta(role=role, content=ev.text), logprobs=lps)])
            elif ev.type == "done":
                for choices, usage in _last_chunks(req, calls, ev, include_usage):
                    yield chunk(choices, usage)
            else:
                yield _stream_end_error(job_id, ev)
                return
    yield DONE


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


def _parsed_delta(ev: TokenEvent) -> Delta:
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
    created, k = int(time.time()), req.logprobs or 0
    include_usage = bool(req.stream_options and req.stream_options.include_usage)
    total = Usage()
    plain: dict[int, TextTemplate] = {}  # per choice: a plain text chunk's template
    for p, job_id in enumerate(job_ids):
        sent = False  # any of this job's text: a restart after it cannot be taken back
        async for ev in hub.events(job_id, merge=True, kind="sse", last_attempt=True):
            if ev.type == "restart" and not sent:  # nothing of it sent yet: the next attempt just streams
                continue
            if ev.type == "token" and ev.prompt_logprobs is not None:  # never streamed
                continue
            if ev.type == "token":
                sent = True
                index = p * req.n + ev.index
                if req.logprobs is None:  # the common chunk: its text in a template
                    if (t := plain.get(index)) is None:
                        t = plain[index] = TextTemplate(lambda text, i=index: TextCompletion(
                            id=job_ids[0], created=created, model=model, choices=[TextChoice(index=i, text=text)]))
                    yield Payload(t.fill_json(ev.text_json) if isinstance(ev, PlainToken) else t.fill(ev.text))
                    continue
                lp = completion_logprobs(Choice(logprobs=ev.logprobs or []), k)
                choice = TextChoice(index=index, text=ev.text, logprobs=lp)
            elif ev.type == "done":
                total = add_usage(total, ev.usage)
                for end in ev.choices:
                    last = TextChoice(index=p * req.n + end.index, text="", finish_reason=end.finish_reason,
                                      stop_reason=end.stop_reason)
                    yield Payload(TextCompletion(id=job_ids[0], created=created, model=model,
                                                 choices=[last]).model_dump_json(exclude_none=True))
                continue
            else:
                yield _stream_end_error(job_id, ev)
                return
            yield Payload(TextCompletion(id=job_ids[0], created=created, model=model,
                                         choices=[choice]).model_dump_json(exclude_none=True))
    if include_usage:
        yield Payload(TextCompletion(id=job_ids[0], created=created, model=model, choices=[],
                                     usage=total).model_dump_json())
    yield DONE
