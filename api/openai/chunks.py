"""Translate OpenAI requests into inferq jobs, and job events into OpenAI responses and chunks.

The completion id is the job id, so every completion can also be polled and streamed through
``/v1/jobs``. Several prompts in one ``/v1/completions`` request become one job each; choice
``i`` of prompt ``p`` is OpenAI's choice ``p * n + i``. A prompt of token ids goes to the worker
as ids; an echoed prompt comes back from the worker as the start of each choice's text. The
prompt's log-probs come in an event of their own: a response has them, a stream never does (as
vLLM's server, which streams none).
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import NamedTuple

from inferq.api import openai_tools as tools
from inferq.api.chunk_template import TextTemplate
from inferq.api.errors import error_body
from inferq.api.openai_schemas import (
    AssistantMessage,
    ChatChoice,
    ChatCompletion,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatLogprobs,
    ChatTokenLogprob,
    ChunkChoice,
    CompletionLogprobs,
    CompletionRequest,
    Delta,
    NamedToolChoice,
    TextChoice,
    TextCompletion,
    ToolCallDelta,
    TopLogprobOut,
)
from inferq.api.streams import PlainToken, StreamHub, merged
from inferq.shared.errors import InferqError, Unavailable, error_from
from inferq.shared.request_limits import check_json
from inferq.shared.schemas import (
    DoneEvent,
    ErrorEvent,
    JobRequest,
    PromptLogprobs,
    RestartEvent,
    TokenEvent,
    TokenLogprob,
    ToolCallPiece,
    Usage,
)
from inferq.shared.settings import Settings


class Payload(NamedTuple):
    """One SSE ``data`` payload; ``last`` marks the end of the stream: ``[DONE]``, or the error
    body of a stream that cannot finish (``error``: that error)."""

    data: str
    last: bool = False
    error: InferqError | None = None
    event: str | None = None  # the SSE event name (the Responses API names each event)


DONE = Payload("[DONE]", last=True)


def check_chat(req: ChatCompletionRequest, settings: Settings) -> None:
    """The limits on a chat request's free-form JSON, named as the client sent it (the job's own
    check would name ``json_schema``)."""
    if (rf := req.response_format) is not None and rf.json_schema is not None:
        check_json(rf.json_schema.schema_, "response_format.json_schema.schema", settings)


def chat_job(req: ChatCompletionRequest) -> JobRequest:
    fields = req.sampling_fields()
    if req.max_completion_tokens is not None:
        fields["max_tokens"] = req.max_completion_tokens
    if req.logprobs:
        fields["logprobs"] = req.top_logprobs or 0
    if (rf := req.response_format) is not None and rf.type == "json_object":
        fields["json_object"] = True
    elif rf is not None and rf.type == "json_schema" and rf.json_schema is not None:
        fields["json_schema"] = rf.json_schema.schema_
    if (schema := tools.tool_schema(req)) is not None:
        fields["json_schema"] = schema
    if req.tools:
        fields["tools"] = [t.model_dump(exclude_none=True) for t in req.tools]
        fields["parse_tool_calls"] = tools.parsed(req)
    return JobRequest(messages=[m.to_chat() for m in req.messages], model=req.model, user=req.user,
                      add_generation_prompt=req.add_generation_prompt,
                      continue_final_message=req.continue_final_message, **fields)


#: ``max_tokens`` of a text completion that sets none: 16, as OpenAI's and vLLM's completions API.
COMPLETION_MAX_TOKENS = 16


def completion_jobs(req: CompletionRequest) -> list[JobRequest]:
    fields = {"max_tokens": COMPLETION_MAX_TOKENS, **req.sampling_fields(), "echo": req.echo}
    if req.logprobs is not None:
        fields["logprobs"] = req.logprobs
    return [JobRequest(**({"prompt": p} if isinstance(p, str) else {"prompt_token_ids": p}),
                       model=req.model, user=req.user, **fields) for p in req.prompts()]


def add_usage(a: Usage, b: Usage) -> Usage:
    return Usage(prompt_tokens=a.prompt_tokens + b.prompt_tokens,
                 completion_tokens=a.completion_tokens + b.completion_tokens,
                 total_tokens=a.total_tokens + b.total_tokens)


def _chat_logprobs(lps: list[TokenLogprob] | None, k: int) -> ChatLogprobs | None:
    if lps is None:
        return None
    return ChatLogprobs(content=[
        ChatTokenLogprob(token=lp.token, logprob=lp.logprob, bytes=list(lp.token.encode()),
                         top_logprobs=[TopLogprobOut(token=t.token, logprob=t.logprob, bytes=list(t.token.encode()))
                                       for t in lp.top_logprobs[:k]])
        for lp in lps
    ])


@dataclass
class Choice:
    text: str = ""
    logprobs: list[TokenLogprob] = field(default_factory=list)
    finish_reason: str | None = None
    calls: list[ToolCallPiece] = field(default_factory=list)  # pieces the worker's parser found


@dataclass
class Collected:
    """Everything one job produced, gathered from its events."""

    choices: dict[int, Choice] = field(default_factory=dict)
    usage: Usage = field(default_factory=Usage)
    prompt_logprobs: PromptLogprobs | None = None

    def add(self, ev: TokenEvent | PlainToken) -> None:
        if ev.prompt_logprobs is not None:  # an event of their own
            self.prompt_logprobs = ev.prompt_logprobs
            return
        c = self.choices.setdefault(ev.index, Choice())
        c.text += ev.text
        c.logprobs.extend(ev.logprobs or [])
        c.calls.extend(ev.tool_calls or [])


class Collector:
    """Folds one job's events into what it produced; an ``error`` event raises its error."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.out = Collected(choices={i: Choice() for i in range(n)})

    def feed(self, ev: TokenEvent | PlainToken | DoneEvent | ErrorEvent | RestartEvent) -> None:
        if ev.type == "token":
            self.out.add(ev)
        elif ev.type == "restart":  # a lost attempt: start over
            self.out = Collected(choices={i: Choice() for i in range(self.n)})
        elif ev.type == "done":
            for end in ev.choices:
                self.out.choices.setdefault(end.index, Choice()).finish_reason = end.finish_reason
            self.out.usage = ev.usage
        else:
            raise error_from(ev.error)


async def collect(hub: StreamHub, job_id: str, n: int) -> Collected:
    c = Collector(n)
    async for ev in hub.events(job_id, merge=True):
        c.feed(ev)
    return c.out


def chat_response(job_id: str, model: str, req: ChatCompletionRequest, got: Collected) -> ChatCompletion:
    k = req.top_logprobs or 0

    def message(c: Choice) -> AssistantMessage:
        if tools.forced(req):  # the constrained text is the call, not content
            return AssistantMessage(content="", tool_calls=tools.tool_calls(req, c.text) or None)
        if c.calls:  # the parser's calls; content only what was not a call (vLLM: null when none)
            return AssistantMessage(content=c.text or None, tool_calls=tools.assembled(c.calls))
        return AssistantMessage(content=c.text)

    return ChatCompletion(
        id=job_id, created=int(time.time()), model=model, usage=got.usage, prompt_logprobs=got.prompt_logprobs,
        choices=[ChatChoice(index=i, message=message(c), finish_reason=tools.finish_reason(req, c.finish_reason),
                            logprobs=_chat_logprobs(c.logprobs, k) if req.logprobs else None)
                 for i, c in sorted(got.choices.items())],
    )


def _completion_logprobs(c: Choice, k: int) -> CompletionLogprobs:
    offsets, pos = [], 0
    for lp in c.logprobs:
        offsets.append(pos)
        pos += len(lp.token)
    return CompletionLogprobs(
        tokens=[lp.token for lp in c.logprobs], token_logprobs=[lp.logprob for lp in c.logprobs],
        # the k most likely tokens and, as vLLM gives it, the sampled one (so logprobs: 0 has it alone);
        # none for an echoed prompt's first token
        top_logprobs=[None if lp.logprob is None else
                      {t.token: t.logprob for t in lp.top_logprobs[:k]} | {lp.token: lp.logprob}
                      for lp in c.logprobs],
        text_offset=offsets,
    )


def completion_response(job_id: str, model: str, req: CompletionRequest, parts: list[Collected]) -> TextCompletion:
    choices, usage = [], Usage()
    for p, got in enumerate(parts):
        for i, c in sorted(got.choices.items()):
            choices.append(TextChoice(index=p * req.n + i, text=c.text, finish_reason=c.finish_reason,
                                      logprobs=_completion_logprobs(c, req.logprobs or 0)
                                      if req.logprobs is not None else None, prompt_logprobs=got.prompt_logprobs))
        usage = add_usage(usage, got.usage)
    return TextCompletion(id=job_id, created=int(time.time()), model=model, choices=choices, usage=usage)


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
        for ev in merged(batch):
            if ev.type == "restart" and not started:  # nothing sent yet: the next attempt just streams
                continue
            if ev.type == "token" and ev.prompt_logprobs is not None:  # never streamed
                continue
            if ev.type == "token":
                lps = _chat_logprobs(ev.logprobs, k) if req.logprobs else None
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
                for end in ev.choices:
                    if (delta := calls.finish(end.index)) is not None:
                        yield chunk([ChunkChoice(index=end.index, delta=delta)])
                    yield chunk([ChunkChoice(index=end.index, delta=Delta(),
                                             finish_reason=tools.finish_reason(req, end.finish_reason))])
                if include_usage:
                    yield chunk([], ev.usage)
            else:
                yield _stream_end_error(job_id, ev)
                return
    yield DONE


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
        async for ev in hub.events(job_id, merge=True, kind="sse"):
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
                lp = _completion_logprobs(Choice(logprobs=ev.logprobs or []), k)
                choice = TextChoice(index=index, text=ev.text, logprobs=lp)
            elif ev.type == "done":
                total = add_usage(total, ev.usage)
                for end in ev.choices:
                    last = TextChoice(index=p * req.n + end.index, text="", finish_reason=end.finish_reason)
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
