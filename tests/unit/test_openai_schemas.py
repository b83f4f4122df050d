"""OpenAI request fields are honoured or refused, never dropped."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace

import pytest
from pydantic import ValidationError

from inferq.api.errors import to_response
from inferq.api.openai import chat_job
from inferq.api.openai.params import ChatCompletionRequest, CompletionRequest
from inferq.api.service import JobService
from inferq.shared.errors import InvalidRequest
from inferq.shared.schemas import JobMessage, JobRequest, WorkerInfo
from inferq.shared.settings import Settings
from inferq.worker.jobs.prepare import Preparer
from inferq.worker.jobs.toolcalls import parser_class

CHAT = [{"role": "user", "content": "hi"}]


@pytest.mark.parametrize("model", [ChatCompletionRequest, CompletionRequest])
def test_continuous_usage_stats_is_refused_naming_it(model: type) -> None:
    body = {"messages": CHAT} if model is ChatCompletionRequest else {"prompt": "x"}
    ok = model.model_validate({**body, "stream": True,
                               "stream_options": {"include_usage": True, "continuous_usage_stats": False}})
    assert ok.stream_options.include_usage
    with pytest.raises(ValidationError) as e:
        model.model_validate({**body, "stream": True, "stream_options": {"continuous_usage_stats": True}})
    r = to_response(e.value)
    err = r.body.decode()
    assert r.status_code == 400 and '"param":"stream_options.continuous_usage_stats"' in err
    assert "usage is sent once, at the end, with include_usage" in err


@pytest.mark.parametrize("strict", [True, False, None])
def test_json_schema_strict_is_accepted_and_the_schema_always_enforced(strict: bool | None) -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    spec = {"name": "thing", "schema": schema, **({} if strict is None else {"strict": strict})}
    req = ChatCompletionRequest.model_validate({"messages": CHAT, "response_format": {
        "type": "json_schema", "json_schema": spec}})
    assert chat_job(req).json_schema == schema


def test_message_name_reaches_the_chat_template() -> None:
    req = ChatCompletionRequest.model_validate({"messages": [
        {"role": "developer", "content": "be brief", "name": "ops"},
        {"role": "user", "content": [{"type": "text", "text": "hi"}], "name": "alice"},
        {"role": "user", "content": "and me"}]})
    job = chat_job(req)
    assert [m.name for m in job.messages] == ["ops", "alice", None]

    seen: list[list[dict]] = []

    class Tokenizer:
        def apply_chat_template(self, messages: list[dict], tokenize: bool, add_generation_prompt: bool,
                                tools: list[dict] | None = None) -> str:
            seen.append(messages)
            return "rendered"

        def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
            return [1, 2]

    host = SimpleNamespace(tokenizer=Tokenizer())
    preparer = Preparer(host)  # type: ignore[arg-type]
    assert preparer.prompt_ids(JobMessage(id="job-1", model="m", request=job, created_at=0.0)) == [1, 2]
    # an unset name is absent, not None: templates test `message.name is defined`
    assert seen == [[{"role": "system", "content": "be brief", "name": "ops"},
                     {"role": "user", "content": "hi", "name": "alice"},
                     {"role": "user", "content": "and me"}]]
    with pytest.raises(ValidationError):
        ChatCompletionRequest.model_validate({"messages": [{"role": "user", "content": "x", "name": ""}]})


def test_auto_tool_choice_needs_a_parser_on_the_models_workers() -> None:
    service = JobService(Settings(), None, None, None)  # type: ignore[arg-type]  (the check needs none)
    req = JobRequest(messages=[{"role": "user", "content": "hi"}], tools=[{"type": "function", "function": {
        "name": "f"}}], parse_tool_calls=True)
    info = WorkerInfo(id="w", model="m", host="h", pid=1, max_model_len=64, max_num_seqs=4,
                      started_at=time.time(), last_seen=time.time())
    with pytest.raises(InvalidRequest) as e:
        asyncio.run(service.check_context(req, info))
    assert e.value.param == "tool_choice"
    asyncio.run(service.check_context(req, info.model_copy(update={"tool_call_parser": "pythonic"})))  # served


def test_an_unknown_parser_name_fails_the_worker_start() -> None:
    assert parser_class("pythonic").__name__
    with pytest.raises(KeyError):
        parser_class("no-such-parser")


def test_an_agent_loops_second_turn_reaches_the_tool_call_parser() -> None:
    """The history's call (arguments a JSON string, as OpenAI sends them) and the tool's answer, with
    the tools still given: vLLM's protocol takes the messages as the client sent them."""
    from inferq.worker.jobs.toolcalls import ToolCallStream

    call = {"id": "call_1", "type": "function", "function": {"name": "weather", "arguments": '{"city": "Paris"}'}}
    req = JobRequest(messages=[{"role": "user", "content": "Weather in Paris?"},
                               {"role": "assistant", "content": "", "tool_calls": [call]},
                               {"role": "tool", "tool_call_id": "call_1", "content": "20 C"}],
                     tools=[{"type": "function", "function": {"name": "weather", "parameters": {
                         "type": "object", "properties": {"city": {"type": "string"}}}}}], parse_tool_calls=True)
    stream = ToolCallStream(parser_class("pythonic"), None, req)
    assert stream.request.messages[1]["tool_calls"][0]["function"]["arguments"] == '{"city": "Paris"}'
    # the chat template still reads the arguments as an object, as vLLM renders them
    assert req.chat_messages()[1]["tool_calls"][0]["function"]["arguments"] == {"city": "Paris"}
