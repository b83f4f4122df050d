"""Whole OpenAI answers from job events: a job's events folded into what it produced (text,
log-probs, tool-call pieces, usage), and the chat completion or text completion made of it. Choice
``i`` of prompt ``p`` is OpenAI's choice ``p * n + i``. The prompt's log-probs come in an event of
their own: an answer has them (a stream never does, as vLLM's server, which streams none).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from inferq.api.frames import PlainToken
from inferq.api.openai import tools
from inferq.api.openai.objects import (
    AssistantMessage,
    ChatChoice,
    ChatCompletion,
    ChatLogprobs,
    ChatTokenLogprob,
    CompletionLogprobs,
    TextChoice,
    TextCompletion,
    TopLogprobOut,
)
from inferq.api.openai.params import ChatCompletionRequest, CompletionRequest
from inferq.api.streams import StreamHub
from inferq.shared.errors import error_from
from inferq.shared.schemas import (
    DoneEvent,
    ErrorEvent,
    LoadingEvent,
    PromptLogprobs,
    RestartEvent,
    TokenEvent,
    TokenLogprob,
    ToolCallPiece,
    Usage,
)


def add_usage(a: Usage, b: Usage) -> Usage:
    """The usage of two jobs together (the prompts of one text completion)."""
    return Usage(prompt_tokens=a.prompt_tokens + b.prompt_tokens,
                 completion_tokens=a.completion_tokens + b.completion_tokens,
                 total_tokens=a.total_tokens + b.total_tokens)


def chat_logprobs(lps: list[TokenLogprob] | None, k: int) -> ChatLogprobs | None:
    """A chat choice's ``logprobs``: each token with its ``k`` most likely alternatives."""
    if lps is None:
        return None
    return ChatLogprobs(content=[
        # chat echoes no prompt, so every token has its log-prob (vLLM's floor stands in for none)
        ChatTokenLogprob(token=lp.token, logprob=-9999.0 if lp.logprob is None else lp.logprob,
                         bytes=list(lp.token.encode()),
                         top_logprobs=[TopLogprobOut(token=t.token, logprob=t.logprob, bytes=list(t.token.encode()))
                                       for t in lp.top_logprobs[:k]])
        for lp in lps
    ])


@dataclass
class Choice:
    """What one choice of a job produced so far."""

    text: str = ""
    logprobs: list[TokenLogprob] = field(default_factory=list)
    finish_reason: str | None = None
    stop_reason: str | int | None = None  # the stop string or stop token id that ended it
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

    def feed(self, ev: TokenEvent | PlainToken | DoneEvent | ErrorEvent | RestartEvent | LoadingEvent) -> None:
        if ev.type == "token":
            self.out.add(ev)
        elif ev.type == "loading":  # waiting for a worker to wake the model: nothing produced
            return
        elif ev.type == "restart":  # a lost attempt: start over
            self.out = Collected(choices={i: Choice() for i in range(self.n)})
        elif ev.type == "done":
            for end in ev.choices:
                c = self.out.choices.setdefault(end.index, Choice())
                c.finish_reason, c.stop_reason = end.finish_reason, end.stop_reason
            self.out.usage = ev.usage
        else:
            raise error_from(ev.error)


async def collect(hub: StreamHub, job_id: str, n: int) -> Collected:
    """Everything the job produces (its ``n`` choices), once it ends; its error raised if it fails."""
    c = Collector(n)
    async for ev in hub.events(job_id, merge=True):
        c.feed(ev)
    return c.out


def chat_response(job_id: str, model: str, req: ChatCompletionRequest, got: Collected) -> ChatCompletion:
    """The chat completion of a job: forced tool calls from its text, parsed ones from its pieces."""
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
                            stop_reason=c.stop_reason, logprobs=chat_logprobs(c.logprobs, k) if req.logprobs else None)
                 for i, c in sorted(got.choices.items())],
    )


def completion_logprobs(c: Choice, k: int) -> CompletionLogprobs:
    """A text choice's ``logprobs``: tokens, their log-probs, ``k`` alternatives and text offsets."""
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
    """The text completion of a request's jobs (``parts``: one per prompt, in order)."""
    choices, usage = [], Usage()
    for p, got in enumerate(parts):
        for i, c in sorted(got.choices.items()):
            choices.append(TextChoice(index=p * req.n + i, text=c.text, finish_reason=c.finish_reason,
                                      stop_reason=c.stop_reason,
                                      logprobs=completion_logprobs(c, req.logprobs or 0)
                                      if req.logprobs is not None else None, prompt_logprobs=got.prompt_logprobs))
        usage = add_usage(usage, got.usage)
    return TextCompletion(id=job_id, created=int(time.time()), model=model, choices=choices, usage=usage)

