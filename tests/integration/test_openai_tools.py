"""Tool calling through the official openai SDK: a named function and ``required`` return valid
calls from a random-weight model (structured outputs), streamed and not; a call and its result go
back into the conversation; ``auto`` runs the workers' tool-call parser (vLLM's ``pythonic``, set
on the session stack): structured outputs make the model write a call, which comes back as
``tool_calls``, streamed and not, and plain text stays content."""

from __future__ import annotations

import json

import openai
import pytest

pytestmark = pytest.mark.integration
MODEL = "inferq-tiny"
CHAT = [{"role": "user", "content": "What is the weather?"}]
WEATHER = {"type": "function", "function": {"name": "weather", "description": "Weather now", "parameters": {
    "type": "object", "properties": {"unit": {"type": "string", "enum": ["c", "f"]}}, "required": ["unit"],
    "additionalProperties": False}}}
NOOP = {"type": "function", "function": {"name": "noop"}}
NAMED = {"type": "function", "function": {"name": "weather"}}


@pytest.fixture
def client(stack) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{stack.base}/v1", api_key="unused", max_retries=0)


def test_named_function_returns_a_valid_call(client) -> None:
    r = client.chat.completions.create(model=MODEL, messages=CHAT, tools=[WEATHER, NOOP], tool_choice=NAMED,
                                       max_tokens=40, temperature=0)
    (call,) = r.choices[0].message.tool_calls
    assert call.type == "function" and call.function.name == "weather" and call.id
    assert json.loads(call.function.arguments)["unit"] in ("c", "f")
    assert r.choices[0].finish_reason == "stop"  # OpenAI's for a named call
    assert r.choices[0].message.content == ""


def test_required_returns_calls_of_the_given_tools(client) -> None:
    r = client.chat.completions.create(model=MODEL, messages=CHAT, tools=[WEATHER, NOOP], tool_choice="required",
                                       parallel_tool_calls=False, max_tokens=60, temperature=0.8, seed=3)
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    (call,) = choice.message.tool_calls
    assert call.function.name in ("weather", "noop")
    args = json.loads(call.function.arguments)
    assert isinstance(args, dict) and (call.function.name == "noop" or args["unit"] in ("c", "f"))


@pytest.mark.parametrize("choice", [NAMED, "required"])
def test_streamed_calls_add_up_to_the_same_call(client, choice) -> None:
    body = {"model": MODEL, "messages": CHAT, "tools": [WEATHER], "tool_choice": choice, "parallel_tool_calls": False,
                "max_tokens": 40, "temperature": 0}
    whole = client.chat.completions.create(**body).choices[0].message.tool_calls[0]
    calls: dict[int, dict[str, str]] = {}
    finish = None
    for chunk in client.chat.completions.create(**body, stream=True):
        for c in chunk.choices:
            finish = c.finish_reason or finish
            for d in c.delta.tool_calls or []:
                got = calls.setdefault(d.index, {"name": "", "arguments": "", "id": ""})
                got["id"] = d.id or got["id"]
                got["name"] += (d.function.name or "") if d.function else ""
                got["arguments"] += (d.function.arguments or "") if d.function else ""
    assert list(calls) == [0] and calls[0]["id"]
    assert calls[0]["name"] == whole.function.name == "weather"
    assert json.loads(calls[0]["arguments"]) == json.loads(whole.function.arguments)  # greedy: the same call
    assert finish == ("stop" if choice == NAMED else "tool_calls")


def test_a_call_and_its_result_go_back_into_the_conversation(client) -> None:
    first = client.chat.completions.create(model=MODEL, messages=CHAT, tools=[WEATHER], tool_choice=NAMED,
                                           max_tokens=40, temperature=0).choices[0].message
    history = [*CHAT, first.model_dump(exclude_none=True),
               {"role": "tool", "tool_call_id": first.tool_calls[0].id, "content": "20 degrees"}]
    r = client.chat.completions.create(model=MODEL, messages=history, tools=[WEATHER], tool_choice="none",
                                       max_tokens=8, temperature=0)
    assert r.choices[0].message.content and not r.choices[0].message.tool_calls
    longer = r.usage.prompt_tokens
    r2 = client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=8, temperature=0)
    assert longer > r2.usage.prompt_tokens  # the call and its result reached the template


PYTHONIC = '[weather(unit="f"), noop()]'
WRITE_CALL = {"structured_outputs": {"choice": [PYTHONIC]}}


def test_auto_finds_the_calls_the_model_wrote(client) -> None:
    r = client.chat.completions.create(model=MODEL, messages=CHAT, tools=[WEATHER, NOOP], max_tokens=40,
                                       temperature=0, extra_body=WRITE_CALL)  # auto: the default with tools
    choice = r.choices[0]
    assert [(c.function.name, json.loads(c.function.arguments)) for c in choice.message.tool_calls] == \
        [("weather", {"unit": "f"}), ("noop", {})]
    assert all(c.id and c.type == "function" for c in choice.message.tool_calls)
    assert choice.message.content is None and choice.finish_reason == "tool_calls"


def test_auto_streams_the_same_calls(client) -> None:
    calls: dict[int, dict[str, str]] = {}
    finish = None
    for chunk in client.chat.completions.create(model=MODEL, messages=CHAT, tools=[WEATHER, NOOP],
                                                tool_choice="auto", max_tokens=40, temperature=0, stream=True,
                                                extra_body=WRITE_CALL):
        for ch in chunk.choices:
            for d in ch.delta.tool_calls or []:
                c = calls.setdefault(d.index, {"name": "", "arguments": "", "id": ""})
                c["id"] += d.id or ""
                c["name"] += (d.function.name or "") if d.function else ""
                c["arguments"] += (d.function.arguments or "") if d.function else ""
            finish = ch.finish_reason or finish
    assert [(c["name"], json.loads(c["arguments"])) for _, c in sorted(calls.items())] == \
        [("weather", {"unit": "f"}), ("noop", {})]
    assert all(c["id"] for c in calls.values()) and finish == "tool_calls"


def test_auto_leaves_text_that_is_no_call_as_content(client) -> None:
    r = client.chat.completions.create(model=MODEL, messages=CHAT, tools=[WEATHER], tool_choice="auto",
                                       max_tokens=30, temperature=0, extra_body={"structured_outputs": {
                                           "choice": ["sunny today"]}})
    assert r.choices[0].message.content == "sunny today" and not r.choices[0].message.tool_calls
    assert r.choices[0].finish_reason == "stop"


@pytest.mark.parametrize("body", [
    {"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "other"}}},
    {"tool_choice": "required"},
    {"tools": [{"type": "function", "function": {"name": "bad name!"}}], "tool_choice": "required"},
])
def test_tool_requests_inferq_cannot_serve_are_400_naming_the_field(client, body) -> None:
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=8, **body)
    assert "tool" in str(e.value.body).lower()
