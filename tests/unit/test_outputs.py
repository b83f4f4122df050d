"""Engine outputs -> stream events (worker/jobs/outputs.py), on outputs shaped as vLLM's DELTA
``RequestOutput``s: no engine, no Redis."""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

from bench.standin import Out, ScriptedTokenizer, Step
from inferq.shared.schemas import DoneEvent, ErrorEvent, ErrorInfo, JobStatus, TokenEvent, ToolCallPiece
from inferq.worker.jobs.outputs import OutputEvents, Progress
from inferq.worker.jobs.prompt import PromptReturn


@dataclass
class Sink:
    """What the writer would send; ``behind``: it is behind, so plain text joins the last event."""

    behind: bool = False
    events: list[TokenEvent] = field(default_factory=list)
    extended: list[tuple[int, str, int]] = field(default_factory=list)

    def emit(self, event: TokenEvent) -> None:
        self.events.append(event)

    def extend(self, index: int, text: str, n_tokens: int) -> bool:
        if self.behind and self.events and self.events[-1].index == index:
            self.extended.append((index, text, n_tokens))
            return True
        return False


def translate(steps: list[Step], *, ids: list[int] | None = None, echo: str | None = None,
              logprobs: int | None = None, sink: Sink | None = None, calls: Any = None,
              seq: int = 0) -> tuple[Progress, Sink]:
    sink = sink or Sink()
    progress = Progress(seq=seq, prompt_tokens=len(ids or [1, 2]))
    prompt = PromptReturn(ids or [1, 2], echo, logprobs, ScriptedTokenizer())
    events = OutputEvents(progress, prompt, ScriptedTokenizer(), logprobs, sink, calls)
    for step in steps:
        events.feed(step)
    return progress, sink


def test_each_delta_is_an_event_in_order_and_the_end_sums_them_up() -> None:
    p, sink = translate([Step([Out(0, "Hello", [5])]), Step([Out(0, " world", [6, 7], finish_reason="stop",
                                                                  stop_reason="\n")])], seq=3)
    assert [(e.seq, e.text, e.n_tokens) for e in sink.events] == [(4, "Hello", 1), (5, " world", 2)]
    fields, done = p.end(JobStatus.succeeded, None)
    assert isinstance(done, DoneEvent) and done.seq == 6 and done.finish_reason == "stop"
    assert done.choices[0].stop_reason == "\n"
    assert fields["choices"] == [{"index": 0, "text": "Hello world", "finish_reason": "stop", "stop_reason": "\n"}]
    assert (done.usage.prompt_tokens, done.usage.completion_tokens, done.usage.total_tokens) == (2, 3, 5)


def test_plain_text_joins_an_unsent_event_but_text_with_logprobs_never_does() -> None:
    steps = [Step([Out(0, "a", [1])]), Step([Out(0, "b", [2])]), Step([Out(0, "c", [3], finish_reason="length")])]
    p, sink = translate(steps, sink=Sink(behind=True))
    assert [e.text for e in sink.events] == ["a"] and sink.extended == [(0, "b", 1), (0, "c", 1)]
    assert p.seq == 1 and p.end(JobStatus.succeeded, None)[1].seq == 2  # no seq was skipped
    lp = SimpleNamespace(logprob=-0.5, rank=1, decoded_token="b")
    with_lps = [Step([Out(0, "a", [1])]), Step([Out(0, "b", [2])])]
    with_lps[1].outputs[0].logprobs = [{2: lp}]  # type: ignore[assignment]
    _, sink = translate(with_lps, logprobs=0, sink=Sink(behind=True))
    assert [e.text for e in sink.events] == ["a", "b"] and not sink.extended
    assert sink.events[1].logprobs[0].token == "b" and sink.events[1].logprobs[0].logprob == -0.5


def test_completions_keep_their_own_text_and_finish() -> None:
    p, sink = translate([Step([Out(0, "x", [1]), Out(1, "y", [2])]),
                         Step([Out(1, "z", [3], finish_reason="stop")])])
    assert [(e.index, e.text) for e in sink.events] == [(0, "x"), (1, "y"), (1, "z")]
    fields, done = p.end(JobStatus.cancelled, None)
    assert [c["text"] for c in fields["choices"]] == ["x", "yz"]
    assert [c.finish_reason for c in done.choices] == ["cancelled", "stop"]  # a cancel ends what still ran


def test_echo_puts_the_prompt_before_each_completions_first_text_once() -> None:
    p, sink = translate([Step([Out(0, "A", [1]), Out(1, "B", [2])]), Step([Out(0, "C", [3])])], echo="Q: ")
    assert [e.text for e in sink.events] == ["Q: A", "Q: B", "C"]
    assert p.end(JobStatus.succeeded, None)[0]["choices"][0]["text"] == "Q: AC"


def test_the_prompts_logprobs_come_once_in_an_event_of_their_own() -> None:
    first = {7: SimpleNamespace(logprob=-1.0, rank=1, decoded_token="b")}
    step = Step([Out(0, "x", [1])], prompt_logprobs=[None, first])
    p, sink = translate([step, Step([Out(0, "y", [2])], prompt_logprobs=[None, first])], ids=[3, 7])
    assert [e.text for e in sink.events] == ["", "x", "y"]
    assert sink.events[0].model_dump()["prompt_logprobs"] == [
        None, {"7": {"logprob": -1.0, "rank": 1, "decoded_token": "b"}}]
    assert sink.events[2].prompt_logprobs is None and p.seq == 3


@dataclass
class Calls:
    """A tool-call parser's stream as the runner uses one (vLLM's parsers are tested elsewhere)."""

    called: bool = False

    def feed(self, text: str, ids: list[int]) -> tuple[str, list[ToolCallPiece]]:
        if text.startswith("{"):
            self.called = True
            return "", [ToolCallPiece(index=0, id="call-1", name="f", arguments="")]
        return ("" if self.called else text), []

    def finish(self) -> list[ToolCallPiece]:
        return [ToolCallPiece(index=0, arguments='{"x": 1}')]


def test_a_parsed_tool_call_streams_as_pieces_and_ends_the_turn() -> None:
    steps = [Step([Out(0, "Sure. ", [1])]), Step([Out(0, "{", [2])]), Step([Out(0, "}", [3], finish_reason="stop")])]
    p, sink = translate(steps, calls=Calls)
    assert [(e.text, e.tool_calls) for e in sink.events] == [
        ("Sure. ", None), ("", [ToolCallPiece(index=0, id="call-1", name="f", arguments="")]),
        ("", [ToolCallPiece(index=0, arguments='{"x": 1}')])]
    fields, done = p.end(JobStatus.succeeded, None)
    assert done.finish_reason == "tool_calls" and fields["choices"][0]["text"] == "Sure. {}"
    assert done.usage.completion_tokens == 3


def test_a_tool_call_cut_by_max_tokens_ends_on_length() -> None:
    """A call the parser started but the output's length cut is no finished call: the turn ends on
    "length" (as vLLM's server says), not "tool_calls" (a client would parse the arguments)."""
    steps = [Step([Out(0, "{", [2])]), Step([Out(0, '"ci', [3], finish_reason="length")])]
    p, _ = translate(steps, calls=Calls)
    _, done = p.end(JobStatus.succeeded, None)
    assert done.finish_reason == "length"


def test_a_failure_ends_with_an_error_event_after_the_last_token() -> None:
    p, _ = translate([Step([Out(0, "partial", [1])])])
    err = ErrorInfo(type="server_error", code="engine_error", message="boom")
    fields, event = p.end(JobStatus.failed, err)
    assert isinstance(event, ErrorEvent) and event.seq == 2 and event.error == err
    assert fields["error"] == err and fields["choices"][0]["text"] == "partial"
    assert fields["finish_reason"] is None


def test_held_text_goes_out_once_an_interval_per_completion_and_all_of_it_before_the_end(monkeypatch) -> None:
    """Batch work (``hold_s``): plain text is held and sent at most once an interval, one event a
    completion, the rest before each completion's end and on ``flush``; log-probs are never held."""
    import inferq.worker.jobs.outputs as outputs

    clock = [100.0]
    monkeypatch.setattr(outputs.time, "monotonic", lambda: clock[0])
    sink = Sink()
    progress = Progress(prompt_tokens=2)
    events = OutputEvents(progress, PromptReturn([1, 2], None, None, ScriptedTokenizer()), ScriptedTokenizer(), None,
                          sink, None, hold_s=0.25)
    for i, piece in enumerate(["a", "b", "c"]):  # 0.1 s apart: held until 0.25 s since the start
        clock[0] += 0.1
        events.feed(Step([Out(0, piece, [i]), Out(1, piece.upper(), [i])]))
    assert [(e.index, e.text, e.n_tokens) for e in sink.events] == [(0, "abc", 3), (1, "ABC", 3)]
    clock[0] += 0.01
    events.feed(Step([Out(0, "d", [3]), Out(1, "D", [3], finish_reason="length")]))  # 1 ends: all goes first
    assert [(e.index, e.text) for e in sink.events[2:]] == [(0, "d"), (1, "D")]
    clock[0] += 0.01
    events.feed(Step([Out(0, "e", [4])]))
    assert len(sink.events) == 4  # held
    events.flush()  # the runner's, when the generation stops
    assert [(e.index, e.text) for e in sink.events[4:]] == [(0, "e")]
    assert [e.seq for e in sink.events] == [1, 2, 3, 4, 5]
    streamed = {i: "".join(e.text for e in sink.events if e.index == i) for i in (0, 1)}
    assert streamed == {i: "".join(progress.texts[i]) for i in (0, 1)} == {0: "abcde", 1: "ABCD"}
    assert sum(e.n_tokens for e in sink.events) == sum(progress.tokens.values())
    events.flush()
    assert len(sink.events) == 5  # nothing held: nothing sent
    lp = OutputEvents(Progress(), PromptReturn([1], None, 0, ScriptedTokenizer()), ScriptedTokenizer(), 0, sink,
                      None, hold_s=10.0)
    step = Step([Out(0, "x", [5])])
    step.outputs[0].logprobs = [{5: SimpleNamespace(logprob=-0.5, rank=1, decoded_token="x")}]  # type: ignore[assignment]
    lp.feed(step)
    assert sink.events[-1].text == "x" and sink.events[-1].logprobs  # with log-probs: at once
