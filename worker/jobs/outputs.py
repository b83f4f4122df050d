"""One attempt's engine outputs as its stream events: a pure unit (no engine, no Redis).

:class:`OutputEvents` is fed each of vLLM's DELTA ``RequestOutput``s and turns it into ``token``
events, in order, on a :class:`EventSink`: the prompt's log-probs once, in an event of their own;
per completion its text (after the echoed prompt, first time round), its sampled tokens'
log-probs, the content and tool-call pieces a tool-call parser finds, and its finish reason.
:class:`Progress` keeps what the attempt has produced; :meth:`Progress.end` makes its final record
and ``done``/``error`` event.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from inferq.shared.schemas import (
    ChoiceEnd,
    ChoiceView,
    DoneEvent,
    ErrorEvent,
    ErrorInfo,
    JobStatus,
    TokenEvent,
    TokenLogprob,
    Usage,
)
from inferq.worker.jobs.prompt import PromptReturn, sampled_logprobs
from inferq.worker.jobs.toolcalls import ToolCallStream


class EventSink(Protocol):
    """Where an attempt's token events go (the event writer, for one attempt)."""

    def emit(self, event: TokenEvent) -> None:
        """Send ``event`` (its ``seq`` is the next one)."""

    def extend(self, index: int, text: str, n_tokens: int) -> bool:
        """Append plain text to the last event of completion ``index`` if it is not sent yet (the
        writer is behind); False if a new event must carry it."""


@dataclass
class Progress:
    """What a job has produced so far; becomes the final record and ``done`` event."""

    seq: int = 0
    prompt_tokens: int = 0
    texts: dict[int, list[str]] = field(default_factory=dict)  # per completion, its pieces
    tokens: dict[int, int] = field(default_factory=dict)
    finish: dict[int, ChoiceEnd] = field(default_factory=dict)
    embeddings: list[str] | None = None  # an embedding job's packed vectors, in input order
    embedding_tokens: list[int] | None = None  # and each input's prompt tokens
    queue_list: str | None = None  # the list the job was queued on: its fair share's keys (claim, end)
    ids: list[int] | None = None  # a job that may be paused (worker/jobs/resume.py): its completion's token ids

    def usage(self) -> Usage:
        done = sum(self.tokens.values())
        return Usage(prompt_tokens=self.prompt_tokens, completion_tokens=done,
                     total_tokens=self.prompt_tokens + done)

    def end(self, status: JobStatus, error: ErrorInfo | None) -> tuple[dict[str, Any], DoneEvent | ErrorEvent]:
        """The job record's final fields and the final event (the next ``seq``) for ``status``."""
        n = max([*self.texts, *self.finish, 0]) + 1
        ends = [self.finish.get(i) or ChoiceEnd(index=i, finish_reason=None) for i in range(n)]
        if status is JobStatus.cancelled:
            ends = [e.model_copy(update={"finish_reason": e.finish_reason or "cancelled"}) for e in ends]
        choices = [ChoiceView(**ends[i].model_dump(), text="".join(self.texts.get(i, ()))) for i in range(n)]
        usage = self.usage()
        fields: dict[str, Any] = {"status": status, "finished_at": time.time(), "usage": usage,
                                  "choices": [c.model_dump() for c in choices], "finish_reason": ends[0].finish_reason}
        if error is not None:
            fields["error"] = error
            return fields, ErrorEvent(seq=self.seq + 1, error=error)
        if status is not JobStatus.succeeded and status is not JobStatus.cancelled:
            raise ValueError(f"a job ends {status.value} only with an error")
        return fields, DoneEvent(seq=self.seq + 1, status=status, finish_reason=ends[0].finish_reason,
                                 choices=ends, usage=usage,
                                 embeddings=self.embeddings if status is JobStatus.succeeded else None,
                                 embedding_tokens=self.embedding_tokens if status is JobStatus.succeeded else None)


class OutputEvents:
    """Turns one attempt's engine outputs into its token events.

    ``logprobs``: the job's ``logprobs`` (None: no log-probs, and plain text may be coalesced into
    an unsent event); ``make_calls``: with tool_choice "auto", a maker of one tool-call parser
    stream per completion; ``hold_s``: plain text is held and goes out at most this often, in one
    event a completion (batch work, which nobody reads token by token: fewer events, less CPU a
    token); :meth:`flush` sends what is held (the runner calls it when the generation stops)."""

    def __init__(self, progress: Progress, prompt: PromptReturn, tokenizer: Any, logprobs: int | None,
                 sink: EventSink, make_calls: Callable[[], ToolCallStream] | None = None,
                 hold_s: float = 0.0) -> None:
        self.p = progress
        self.prompt = prompt
        self.tokenizer = tokenizer
        self.logprobs = logprobs
        self.sink = sink
        self.make_calls = make_calls
        self._calls: dict[int, ToolCallStream] = {}
        self.hold_s = hold_s
        self._held: dict[int, tuple[list[str], int]] = {}  # per completion: text pieces and tokens not sent
        self._sent_at = time.monotonic()

    def feed(self, out: Any) -> None:
        """One ``RequestOutput`` (DELTA): its events, in order."""
        if (plp := self.prompt.take(out)) is not None:  # in an event of their own, once
            self._emit(text="", prompt_logprobs=plp)
        for c in out.outputs:
            calls = self._parser(c.index)
            if c.text or c.token_ids:
                self._delta(c, calls)
            if c.finish_reason is not None:
                self._finish(c, calls)
        if self._held and time.monotonic() - self._sent_at >= self.hold_s:  # the step's text, together
            self.flush()

    def _parser(self, index: int) -> ToolCallStream | None:
        calls = self._calls.get(index)
        if calls is None and self.make_calls is not None:  # one parser stream per completion
            calls = self._calls[index] = self.make_calls()
        return calls

    def _delta(self, c: Any, calls: ToolCallStream | None) -> None:
        text, n = c.text, len(c.token_ids)
        lps: list[TokenLogprob] | None = sampled_logprobs(c, self.tokenizer, self.logprobs or 0)
        if (echoed := self.prompt.echo(c.index)) is not None:  # the prompt first
            text = echoed[0] + text
            lps = None if echoed[1] is None else [*echoed[1], *(lps or [])]
        self.p.texts.setdefault(c.index, []).append(text)  # joined once, at the end
        self.p.tokens[c.index] = self.p.tokens.get(c.index, 0) + n
        if self.p.ids is not None:
            self.p.ids.extend(c.token_ids)
        if calls is not None:  # what the parser says is content, and the calls
            content, pieces = calls.feed(c.text, list(c.token_ids))
            if content or pieces:
                self._emit(index=c.index, text=content, n_tokens=n, logprobs=lps, tool_calls=pieces or None)
        elif self.hold_s and self.logprobs is None:
            held, count = self._held.get(c.index) or ([], 0)
            held.append(text)
            self._held[c.index] = (held, count + n)
        elif self.logprobs is not None or not self.sink.extend(c.index, text, n):
            self._emit(index=c.index, text=text, n_tokens=n, logprobs=lps)

    def flush(self) -> None:
        """Send the held text: one event a completion, in completion order."""
        held, self._held = self._held, {}
        for index in sorted(held):
            pieces, tokens = held[index]
            self._emit(index=index, text="".join(pieces), n_tokens=tokens)
        self._sent_at = time.monotonic()

    def _finish(self, c: Any, calls: ToolCallStream | None) -> None:
        if self._held:  # a completion's text goes out before the turn's end is recorded
            self.flush()
        reason = c.finish_reason
        if calls is not None and calls.called:  # as vLLM: a parsed call ends the turn
            if rest := calls.finish():
                self._emit(index=c.index, text="", tool_calls=rest)
            if reason == "stop":  # cut by max_tokens (or the context): "length", the call may be partial
                reason = "tool_calls"
        self.p.finish[c.index] = ChoiceEnd(index=c.index, finish_reason=reason, stop_reason=c.stop_reason)

    def _emit(self, **fields: Any) -> None:
        self.p.seq += 1
        self.sink.emit(TokenEvent(seq=self.p.seq, **fields))
