"""vLLM's request extras about the prompt: token-id prompts, echo, logit_bias, prompt_logprobs and
the chat template's options, from the OpenAI request to the job, its limits, and back."""

from __future__ import annotations

import asyncio
import json
import time
from types import SimpleNamespace
from typing import Any

import pytest
from pydantic import ValidationError

from inferq.api.errors import to_response
from inferq.api.frames import frame, merged
from inferq.api.openai import Collected, Collector, chat_job, completion_jobs, completion_response
from inferq.api.openai.params import ChatCompletionRequest, CompletionRequest
from inferq.api.service import JobService
from inferq.shared.errors import ContextLengthExceeded, InvalidRequest
from inferq.shared.request_limits import check_limits
from inferq.shared.schemas import DoneEvent, JobMessage, JobRequest, PromptLogprob, TokenEvent, TokenLogprob, WorkerInfo
from inferq.shared.settings import Settings
from inferq.worker.jobs.prepare import Preparer
from inferq.worker.jobs.prompt import PromptReturn

CHAT = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Hello the"}]


def refusal(model: type, body: dict[str, Any]) -> tuple[int, str | None, str]:
    """The status, param and message a request body is refused with."""
    with pytest.raises(ValidationError) as e:
        model.model_validate(body)
    r = to_response(e.value)
    err = json.loads(r.body)["error"]
    return r.status_code, err["param"], err["message"]


# --- token-id prompts -------------------------------------------------------------------------

@pytest.mark.parametrize(("prompt", "jobs"), [
    ([5, 6, 7], [{"prompt_token_ids": [5, 6, 7]}]),
    ([[5, 6], [7]], [{"prompt_token_ids": [5, 6]}, {"prompt_token_ids": [7]}]),
    (["a", "b"], [{"prompt": "a"}, {"prompt": "b"}]),
    ("a", [{"prompt": "a"}]),
])
def test_each_prompt_form_becomes_one_job_per_prompt(prompt: Any, jobs: list[dict[str, Any]]) -> None:
    got = completion_jobs(CompletionRequest.model_validate({"prompt": prompt}))
    assert [j.model_dump(include={"prompt", "prompt_token_ids"}, exclude_none=True) for j in got] == jobs


@pytest.mark.parametrize("prompt", [[1, -1], [[1], [-2]], [1, "a"], [[1], "a"], [], [[1], []], [1.5], {"a": 1}])
def test_a_bad_prompt_is_a_400_naming_prompt(prompt: Any) -> None:
    status, param, _ = refusal(CompletionRequest, {"prompt": prompt})
    assert (status, param) == (400, "prompt")


def test_a_job_takes_exactly_one_prompt_form() -> None:
    JobRequest(prompt_token_ids=[1, 2])
    for body in ({"prompt": "x", "prompt_token_ids": [1]}, {"messages": [{"role": "user", "content": "x"}],
                                                           "prompt_token_ids": [1]}, {}):
        with pytest.raises(ValidationError, match="exactly one of"):
            JobRequest.model_validate(body)
    with pytest.raises(ValidationError):
        JobRequest(prompt_token_ids=[])


def test_token_ids_count_against_the_prompt_limit_naming_prompt() -> None:
    with pytest.raises(InvalidRequest) as e:
        check_limits(JobRequest(prompt_token_ids=[1] * 11), Settings(max_prompt_chars=10))
    assert (e.value.param, e.value.message) == ("prompt", "prompt: is 11 token ids; the limit is 10")
    check_limits(JobRequest(prompt_token_ids=[1] * 10), Settings(max_prompt_chars=10))


def worker_info(**kw: Any) -> WorkerInfo:
    return WorkerInfo(id="w", model="m", host="h", pid=1, max_model_len=64, max_num_seqs=4,
                      started_at=time.time(), last_seen=time.time(), **kw)


def test_the_gateway_checks_token_ids_against_the_context_and_the_vocabulary_without_a_tokenizer() -> None:
    service = JobService(Settings(), None, None, None)  # type: ignore[arg-type]  (the check needs none)
    info = worker_info(vocab_size=100)
    asyncio.run(service.check_context(JobRequest(prompt_token_ids=[99] * 60, max_tokens=4), info))
    with pytest.raises(ContextLengthExceeded) as ctx:
        asyncio.run(service.check_context(JobRequest(prompt_token_ids=[1] * 61, max_tokens=4), info))
    assert "61 prompt tokens" in ctx.value.message
    with pytest.raises(InvalidRequest) as e:
        asyncio.run(service.check_context(JobRequest(prompt_token_ids=[1, 100]), info))
    assert e.value.param == "prompt" and "token id 100 is out of vocabulary" in e.value.message
    # unknown: the worker checks
    asyncio.run(service.check_context(JobRequest(prompt_token_ids=[1, 100]), worker_info()))


def test_a_max_tokens_over_the_window_is_refused_with_the_prompts_real_count() -> None:
    """max_tokens at or over the context window: the error names the prompt's token count where
    the gateway counted it (never "0 prompt tokens"), and claims none where it could not."""
    service = JobService(Settings(), None, None, None)  # type: ignore[arg-type]  (the check needs none)
    with pytest.raises(ContextLengthExceeded) as ctx:
        asyncio.run(service.check_context(JobRequest(prompt_token_ids=[1, 2, 3], max_tokens=5000), worker_info()))
    assert ctx.value.param == "max_tokens" and "3 prompt tokens" in ctx.value.message
    assert "5000" in ctx.value.message and "5003 in all" in ctx.value.message and "64 tokens" in ctx.value.message
    with pytest.raises(ContextLengthExceeded) as ctx:  # a text prompt this gateway has no tokenizer for
        asyncio.run(service.check_context(JobRequest(prompt="hello world", max_tokens=64), worker_info()))
    assert ctx.value.param == "max_tokens" and "prompt tokens" not in ctx.value.message
    assert "asks for 64 output tokens" in ctx.value.message and "64 tokens" in ctx.value.message


def test_stop_token_ids_and_logit_bias_out_of_vocabulary_are_refused_naming_the_field() -> None:
    """Both reach the engine as token ids: out of the vocabulary, the gateway answers 400 naming the
    field before queueing (the engine would fail the job once it ran), and a worker refuses them
    the same way for a job no gateway could check."""
    service = JobService(Settings(), None, None, None)  # type: ignore[arg-type]  (the check needs none)
    info = worker_info(vocab_size=100)
    asyncio.run(service.check_context(JobRequest(prompt="x", stop_token_ids=[0, 99], logit_bias={99: 1}), info))
    for req, param, bad in ((JobRequest(prompt="x", stop_token_ids=[3, 100]), "stop_token_ids", 100),
                            (JobRequest(prompt="x", stop_token_ids=[-1]), "stop_token_ids", -1),
                            (JobRequest(prompt="x", logit_bias={5: 1.0, 4096: -1.0}), "logit_bias", 4096),
                            (JobRequest(prompt="x", logit_bias={-1: 2.0}), "logit_bias", -1)):
        with pytest.raises(InvalidRequest) as e:
            asyncio.run(service.check_context(req, info))
        assert e.value.param == param and f"token id {bad} is out of vocabulary" in e.value.message
        with pytest.raises(InvalidRequest) as e:
            runner(vocab_size=100).prepare(message(**req.model_dump(exclude_defaults=True)))
        assert e.value.param == param


class Tokenizer:
    """The tokenizer calls a worker makes, recorded."""

    def __init__(self, refuse: bool = False) -> None:
        self.refuse = refuse
        self.kwargs: list[dict[str, Any]] = []

    def apply_chat_template(self, messages: list[dict], **kw: Any) -> str:
        if self.refuse:
            raise ValueError("continue_final_message and add_generation_prompt are not compatible")
        self.kwargs.append(kw)
        return "rendered"

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return [1, 2]

    def decode(self, ids: list[int]) -> str:
        return "".join(f"<{i}>" for i in ids)


def runner(tokenizer: Tokenizer | None = None, vocab_size: int = 10) -> Preparer:
    """What the worker makes of a job's prompt (the runner's preparer)."""
    return Preparer(SimpleNamespace(tokenizer=tokenizer or Tokenizer(), vocab_size=vocab_size))  # type: ignore[arg-type]


def message(**req: Any) -> JobMessage:
    return JobMessage(id="job-1", model="m", request=JobRequest(**req), created_at=0.0)


def test_the_worker_gives_token_ids_to_the_engine_as_they_are_and_refuses_one_out_of_vocabulary() -> None:
    assert runner().prompt_ids(message(prompt_token_ids=[9, 0, 3])) == [9, 0, 3]
    with pytest.raises(InvalidRequest) as e:
        runner().prompt_ids(message(prompt_token_ids=[1, 10]))
    assert e.value.param == "prompt"
    assert runner(vocab_size=0).prompt_ids(message(prompt_token_ids=[10**6])) == [10**6]  # vLLM checks then


# --- echo ---------------------------------------------------------------------------------------

def test_echo_is_for_prompts_and_the_worker_echoes_text_or_decoded_ids() -> None:
    assert completion_jobs(CompletionRequest.model_validate({"prompt": [[4, 5]], "echo": True}))[0].echo
    with pytest.raises(ValidationError, match="echo needs"):
        JobRequest(messages=[{"role": "user", "content": "x"}], echo=True)
    assert runner().echo_text(message(prompt_token_ids=[4, 5], echo=True), [4, 5]) == "<4><5>"
    assert runner().echo_text(message(prompt="The sky", echo=True), [1, 2]) == "The sky"
    assert runner().echo_text(message(prompt="The sky"), [1, 2]) is None


def lp(logprob: float, rank: int, token: str) -> SimpleNamespace:
    return SimpleNamespace(logprob=logprob, rank=rank, decoded_token=token)


def test_prompt_logprobs_are_taken_once_whole_and_echoed_before_each_completion() -> None:
    positions = [None, {7: lp(-0.5, 2, "b"), 3: lp(-0.1, 1, "x")}, {8: lp(float("-inf"), 9, "c"),
                                                                    3: lp(-0.2, 1, "x")}]
    prompt = PromptReturn([6, 7, 8], "abc", 1, Tokenizer())

    def out(part: list[Any], index: int = 0) -> SimpleNamespace:
        return SimpleNamespace(prompt_logprobs=part, outputs=[SimpleNamespace(index=index)])

    assert prompt.take(out(positions[:2])) is None  # a prefill in chunks: not whole yet
    assert prompt.take(out(positions[:1], index=1)) is None  # another completion's copy, kept apart
    wire = prompt.take(out(positions[2:]))
    assert wire is not None and wire[0] is None
    assert wire[1] == {"7": PromptLogprob(logprob=-0.5, rank=2, decoded_token="b"),
                       "3": PromptLogprob(logprob=-0.1, rank=1, decoded_token="x")}
    assert wire[2]["8"].logprob == -9999.0  # minus infinity, as vLLM's server sends it
    assert prompt.take(out(positions)) is None  # once
    text, lps = prompt.echo(0)
    assert text == "abc" and [x.token for x in lps] == ["<6>", "b", "c"]
    assert lps[0].logprob is None and lps[1].logprob == -0.5 and [t.token for t in lps[1].top_logprobs] == ["x"]
    assert prompt.echo(0) is None and prompt.echo(1)[0] == "abc"
    assert PromptReturn([1], "a", None, Tokenizer()).echo(0) == ("a", None)
    assert PromptReturn([1], None, None, Tokenizer()).echo(0) is None


def test_an_echoed_first_token_has_null_logprobs_in_the_completion() -> None:
    req = CompletionRequest.model_validate({"prompt": "ab", "echo": True, "logprobs": 1})
    c = Collector(1)
    plp = [None, {"5": PromptLogprob(logprob=-1.0, rank=1, decoded_token="b")}]
    c.feed(TokenEvent(seq=1, text="", prompt_logprobs=plp))
    c.feed(TokenEvent(seq=2, text="abc", n_tokens=1, logprobs=[
        TokenLogprob(token="a", logprob=None), TokenLogprob(token="b", logprob=-1.0),
        TokenLogprob(token="c", logprob=-2.0)]))
    c.feed(DoneEvent(seq=3, finish_reason="length"))
    choice = completion_response("job-1", "m", req, [c.out]).choices[0]
    assert choice.text == "abc" and choice.prompt_logprobs == plp
    assert choice.logprobs.token_logprobs == [None, -1.0, -2.0] and choice.logprobs.top_logprobs[0] is None
    assert choice.logprobs.text_offset == [0, 1, 2]


def test_a_prompt_logprobs_event_is_never_merged_with_text() -> None:
    plp = [None, {"5": PromptLogprob(logprob=-1.0)}]
    evs = [TokenEvent(seq=1, text="", prompt_logprobs=plp), TokenEvent(seq=2, text="a", n_tokens=1),
           TokenEvent(seq=3, text="b", n_tokens=1)]
    frames = [frame(e.model_dump_json(exclude_none=True)) for e in evs]
    assert not frames[0].plain_token
    got = merged(frames)
    assert [(e.seq, e.text) for e in got] == [(1, ""), (3, "ab")] and got[0].prompt_logprobs == plp
    assert Collected().prompt_logprobs is None


# --- logit_bias and prompt_logprobs -------------------------------------------------------------

def test_logit_bias_reaches_the_job_with_integer_ids_clamped_as_vllm_does() -> None:
    req = ChatCompletionRequest.model_validate({"messages": CHAT[:1], "logit_bias": {"5": 300, "-1": -2.5}})
    assert chat_job(req).logit_bias == {5: 100.0, -1: -2.5}  # -1: the engine refuses it (out of vocabulary)
    assert chat_job(ChatCompletionRequest.model_validate({"messages": CHAT[:1], "logit_bias": {}})).logit_bias is None
    assert refusal(ChatCompletionRequest, {"messages": CHAT[:1], "logit_bias": {"a": 1}})[:2] == (400, "logit_bias")


def test_prompt_logprobs_are_not_streamed_but_zero() -> None:
    for model, body in ((CompletionRequest, {"prompt": "x"}), (ChatCompletionRequest, {"messages": CHAT[:1]})):
        assert refusal(model, {**body, "stream": True, "prompt_logprobs": 1})[:2] == (400, "prompt_logprobs")
        assert model.model_validate({**body, "stream": True, "prompt_logprobs": 0}).prompt_logprobs == 0
        assert refusal(model, {**body, "prompt_logprobs": 21})[:2] == (400, "prompt_logprobs")
    job = completion_jobs(CompletionRequest.model_validate({"prompt": "x", "prompt_logprobs": 3}))[0]
    assert job.prompt_logprobs == 3


# --- the chat template's options ----------------------------------------------------------------

@pytest.mark.parametrize("body", [{"continue_final_message": True},
                                  {"continue_final_message": True, "add_generation_prompt": True}])
def test_continue_final_message_needs_add_generation_prompt_false(body: dict[str, Any]) -> None:
    status, param, message = refusal(ChatCompletionRequest, {"messages": CHAT, **body})
    assert (status, param) == (400, "continue_final_message") and "add_generation_prompt" in message


def test_the_worker_renders_the_template_with_the_requests_options() -> None:
    job = chat_job(ChatCompletionRequest.model_validate({"messages": CHAT, "continue_final_message": True,
                                                         "add_generation_prompt": False}))
    tok = Tokenizer()
    runner(tok).prompt_ids(JobMessage(id="job-1", model="m", request=job, created_at=0.0))
    runner(tok).prompt_ids(message(messages=CHAT))
    assert [(k["add_generation_prompt"], k.get("continue_final_message")) for k in tok.kwargs] == [
        (False, True), (True, None)]
    with pytest.raises(ValidationError, match="continue_final_message and add_generation_prompt need"):
        JobRequest(prompt="x", continue_final_message=True, add_generation_prompt=False)


def test_a_template_that_refuses_the_messages_is_a_400_not_a_500() -> None:
    with pytest.raises(InvalidRequest) as e:
        runner(Tokenizer(refuse=True)).prompt_ids(message(messages=CHAT))
    assert e.value.status == 400 and e.value.param == "messages" and "not compatible" in e.value.message


def test_an_echoed_first_token_without_logprobs_survives_the_event_log() -> None:
    """Events are written without their nulls: a token without log-probs reads back as one."""
    from inferq.shared.schemas import parse_event

    ev = TokenEvent(seq=1, text="ab", logprobs=[TokenLogprob(token="a"), TokenLogprob(token="b", logprob=-1.0)])
    assert parse_event(ev.model_dump_json(exclude_none=True)) == ev


@pytest.mark.parametrize("given, fields", [
    ({"regex": "a+"}, {"regex": "a+"}),
    ({"grammar": 'root ::= "x"'}, {"grammar": 'root ::= "x"'}),
    ({"json": {"type": "object"}}, {"json_schema": {"type": "object"}}),
    ({"json": '{"type": "integer"}'}, {"json_schema": {"type": "integer"}}),
    ({"choice": ["a", "b"]}, {"choice": ["a", "b"]}),
])
def test_structured_outputs_become_the_jobs_constraint(given: dict, fields: dict) -> None:
    from inferq.api.openai import completion_jobs
    from inferq.api.openai.params import CompletionRequest

    job = completion_jobs(CompletionRequest.model_validate({"prompt": "x", "structured_outputs": given}))[0]
    got = {k: getattr(job, k) for k in ("regex", "grammar", "json_schema", "choice") if getattr(job, k) is not None}
    assert got == fields


@pytest.mark.parametrize("given, where", [
    ({"regex": "a", "choice": ["a"]}, "exactly one"),
    ({}, "exactly one"),
    ({"json": "[1"}, "JSON schema"),
    ({"structural_tag": "x"}, "structural_tag"),
    ({"regex": "a" * 20_000}, "regex"),
])
def test_structured_outputs_refused_naming_the_field(given: dict, where: str) -> None:
    from pydantic import ValidationError

    from inferq.api.errors import typed
    from inferq.api.openai.params import CompletionRequest

    with pytest.raises(ValidationError) as e:
        CompletionRequest.model_validate({"prompt": "x", "structured_outputs": given})
    err = typed(e.value)
    assert err.status == 400 and (err.param or "").startswith("structured_outputs") and where in err.message
