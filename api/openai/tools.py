"""Tool calling on ``/v1/chat/completions``, as vLLM's server does it.

``tool_choice`` ``"required"`` or a named function constrains the output with structured outputs
(vLLM's own schemas: the function's parameters for a named call, an array of ``{name,
parameters}`` items for ``required``), so any model, a random-weight one included, returns a
valid call; the gateway turns the constrained text into ``tool_calls``. ``tools`` always reach
the model's chat template, and so do earlier calls and tool results in ``messages``.
``"auto"`` (the default when ``tools`` are given) leaves the text free: the worker's tool-call
parser (vLLM's, ``INFERQ_TOOL_CALL_PARSER``; worker/jobs/toolcalls.py) finds the calls in it and sends
them as pieces with the tokens. A model whose workers have no parser refuses it with a 400, as
vLLM does without ``--enable-auto-tool-choice``.
"""

from __future__ import annotations

import json
import secrets
from typing import Any

from inferq.api.openai.messages import NamedToolChoice
from inferq.api.openai.params import ChatCompletionRequest
from inferq.shared.errors import InvalidRequest
from inferq.shared.schemas import ToolCall, ToolCallFunction, ToolCallPiece

EMPTY_PARAMETERS: dict[str, Any] = {"type": "object", "properties": {}}


def forced(req: ChatCompletionRequest) -> bool:
    """True when the request must answer with tool calls (``required`` or a named function)."""
    return bool(req.tools) and (req.tool_choice == "required" or isinstance(req.tool_choice, NamedToolChoice))


def parsed(req: ChatCompletionRequest) -> bool:
    """True when the worker's parser finds the calls in free text (``auto``)."""
    return bool(req.tools) and req.tool_choice == "auto"


def tool_schema(req: ChatCompletionRequest) -> dict[str, Any] | None:
    """The JSON schema that constrains the output, or None when nothing is forced."""
    if not forced(req):
        return None
    if req.response_format is not None and req.response_format.type != "text":
        raise InvalidRequest("response_format cannot be combined with a forced tool_choice",
                             param="response_format")
    if isinstance(req.tool_choice, NamedToolChoice):
        fn = next(t.function for t in req.tools or () if t.function.name == req.tool_choice.function.name)
        return fn.parameters or EMPTY_PARAMETERS
    items = [{"properties": {"name": {"type": "string", "enum": [t.function.name]},
                             "parameters": t.function.parameters or EMPTY_PARAMETERS},
              "required": ["name", "parameters"]} for t in req.tools or ()]
    schema: dict[str, Any] = {"type": "array", "minItems": 1, "items": {"type": "object", "anyOf": items}}
    if req.parallel_tool_calls is False:
        schema["maxItems"] = 1
    return schema


def call_id() -> str:
    return f"chatcmpl-tool-{secrets.token_hex(8)}"


def tool_calls(req: ChatCompletionRequest, text: str) -> list[ToolCall]:
    """The calls in a forced output: for a named function, the text is its arguments (even when
    cut short by ``max_tokens``, as vLLM returns it); for ``required``, the calls of the array, or
    none when it is not complete JSON."""
    if isinstance(req.tool_choice, NamedToolChoice):
        return [ToolCall(id=call_id(), function=ToolCallFunction(name=req.tool_choice.function.name, arguments=text))]
    try:
        items = json.loads(text)
    except ValueError:
        return []
    return [ToolCall(id=call_id(), function=ToolCallFunction(
        name=item["name"], arguments=json.dumps(item["parameters"], ensure_ascii=False)))
        for item in items if isinstance(item, dict) and "name" in item and "parameters" in item]


def assembled(pieces: list[ToolCallPiece]) -> list[ToolCall]:
    """Whole calls from the pieces a parser streamed (by call index: id and name from the first
    piece, arguments added up)."""
    calls: dict[int, dict[str, str]] = {}
    for p in pieces:
        c = calls.setdefault(p.index, {"id": "", "name": "", "arguments": ""})
        c["id"] = c["id"] or p.id or ""
        c["name"] = c["name"] or p.name or ""
        c["arguments"] += p.arguments or ""
    return [ToolCall(id=c["id"] or call_id(), function=ToolCallFunction(name=c["name"], arguments=c["arguments"]))
            for _, c in sorted(calls.items())]


def finish_reason(req: ChatCompletionRequest, reason: str | None) -> str | None:
    """OpenAI's: ``tool_calls`` when ``required`` calls ended normally; a named call keeps ``stop``."""
    return "tool_calls" if req.tool_choice == "required" and reason == "stop" else reason
