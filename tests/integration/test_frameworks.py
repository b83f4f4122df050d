"""What frameworks built on the OpenAI API send, against inferq: LangChain's ``ChatOpenAI`` (invoke,
stream, tools bound by name) and LiteLLM's ``completion`` (plain and streamed), the way their
users point them at a vLLM server."""

from __future__ import annotations

import json
import os

import pytest

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # LiteLLM: no fetch of its price list
os.environ.setdefault("LITELLM_TELEMETRY", "False")

import litellm  # noqa: E402
from langchain_core.tools import tool  # noqa: E402
from langchain_openai import ChatOpenAI  # noqa: E402

pytestmark = pytest.mark.integration
MODEL = "inferq-tiny"


@tool
def weather(unit: str) -> str:
    """Weather now, in unit c or f."""
    return "sunny"


@pytest.fixture
def chat(stack) -> ChatOpenAI:
    return ChatOpenAI(base_url=f"{stack.base}/v1", api_key="unused", model=MODEL, max_tokens=8, temperature=0,
                      max_retries=0)


def test_langchain_invoke_and_stream_agree(chat) -> None:
    msg = chat.invoke("Say hi")
    assert msg.content and msg.response_metadata["finish_reason"] == "length"
    assert msg.usage_metadata["output_tokens"] == 8
    assert "".join(str(c.content) for c in chat.stream("Say hi")) == msg.content  # greedy: the same text


def test_langchain_bound_tool_returns_its_call(chat) -> None:
    msg = chat.bind_tools([weather], tool_choice="weather").invoke("What is the weather?",
                                                                   max_tokens=40)
    (call,) = msg.tool_calls
    assert call["name"] == "weather" and set(call["args"]) == {"unit"} and call["id"]


def test_litellm_completion_and_stream(stack) -> None:
    kw = {"model": f"openai/{MODEL}", "api_base": f"{stack.base}/v1", "api_key": "unused",
              "messages": [{"role": "user", "content": "Say hi"}], "max_tokens": 8, "temperature": 0}
    r = litellm.completion(**kw)
    text = r.choices[0].message.content
    assert text and r.usage.completion_tokens == 8 and r.choices[0].finish_reason == "length"
    pieces = [c.choices[0].delta.content or "" for c in litellm.completion(**kw, stream=True)]
    assert "".join(pieces) == text
    assert json.loads(r.model_dump_json())["model"].endswith(MODEL)
