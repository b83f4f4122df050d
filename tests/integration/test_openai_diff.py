"""The differential suite: the same OpenAI requests to inferq and to vLLM's own OpenAI server
(``python -m vllm.entrypoints.openai.api_server``, started here on the same tiny model with the
engine arguments a worker uses), compared on what a client depends on: the status code, the
error's shape, which fields the answer has and of what JSON type, the finish and stop reasons, the
chunk sequence of a stream and, at temperature 0, the text. The Responses API's steps of more than
one request (a background response read back and cancelled) are in diff_responses.py.

Every difference found is listed. Those that are intended (inferq's extras) are in ``INTENDED``;
those not matched yet are in ``NOT_YET`` with the reason. The test fails when a difference appears
that neither list holds, and when one of ``NOT_YET`` disappears (update the list: it is the
record of what is left).
"""

from __future__ import annotations

import json
import os
import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from tests.conftest import ADAPTER_SEEDS, Service, ahead, http_ok, lora_modules, quiet_port, spawn, take
from tests.integration.diff_responses import lifecycle
from tests.wait import eventually

pytestmark = pytest.mark.integration
MODEL = "inferq-tiny"
CHAT = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Say hi"}]
G = {"temperature": 0, "max_tokens": 8}  # greedy and short: the texts must match
T = {"temperature": 0, "max_tokens": 40}  # room for a whole call
TOOLS = [{"type": "function", "function": {"name": "weather", "description": "Weather now", "parameters": {
    "type": "object", "properties": {"unit": {"type": "string", "enum": ["c", "f"]}}, "required": ["unit"],
    "additionalProperties": False}}}, {"type": "function", "function": {"name": "noop"}}]
NAMED = {"tool_choice": {"type": "function", "function": {"name": "weather"}}}
# tool_choice auto on a random-weight model: structured outputs make it write a pythonic call,
# which both servers' parsers (pythonic) must find
CALL = {"tool_choice": "auto", "structured_outputs": {"choice": ['[weather(unit="c"), noop()]']}}
IDS = [1882, 306, 77, 91, 338]  # "The sky is"
BIAS = {"logit_bias": {"306": 100, "91": 40, "77": -100}}  # greedy: the first wins every step
CONTINUED = [*CHAT, {"role": "assistant", "content": "Hello the"}]
HISTORY = [{"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function", "function": {
    "name": "weather", "arguments": '{"unit": "c"}'}}]}, {"role": "tool", "tool_call_id": "call_1", "content": "20"}]

# name -> (path, body). Streams end in "stream": true.
CASES: dict[str, tuple[str, dict[str, Any]]] = {
    "chat": ("/v1/chat/completions", {"messages": CHAT, **G}),
    "chat stream": ("/v1/chat/completions", {"messages": CHAT, "stream": True,
                                             "stream_options": {"include_usage": True}, **G}),
    "chat n=2 seed": ("/v1/chat/completions", {"messages": CHAT, "n": 2, "seed": 7, "temperature": 1.0,
                                               "max_tokens": 4}),
    # stop strings and ids the greedy output holds: each case ends on its stop (STOPPED checks it)
    "chat stop": ("/v1/chat/completions", {"messages": CHAT, "stop": ["quiv"], **G}),
    "chat stop stream": ("/v1/chat/completions", {"messages": CHAT, "stop": ["quiv"], "stream": True, **G}),
    "completion stop": ("/v1/completions", {"prompt": "The sky is", "stop": ["NINE"], **G}),
    "completion stop stream": ("/v1/completions", {"prompt": "The sky is", "stop": ["NINE"], "stream": True, **G}),
    "completion stop_token_ids matched": ("/v1/completions", {"prompt": "The sky is", "stop_token_ids": [3526],
                                                              **G}),
    "chat stop not matched": ("/v1/chat/completions", {"messages": CHAT, "stop": ["\n"], **G}),
    "chat logprobs": ("/v1/chat/completions", {"messages": CHAT, "logprobs": True, "top_logprobs": 2, **G}),
    "chat SDK nulls": ("/v1/chat/completions", {"messages": CHAT, "tools": None, "tool_choice": None, "n": None,
                                                "stream": None, "parallel_tool_calls": None, **G}),
    "chat defaults": ("/v1/chat/completions", {"messages": CHAT, "logit_bias": {}, "store": False,
                                               "metadata": {}, **G}),
    "chat assistant content null": ("/v1/chat/completions", {"messages": [
        *CHAT, {"role": "assistant", "content": None}, {"role": "user", "content": "again"}], **G}),
    "chat min_tokens": ("/v1/chat/completions", {"messages": CHAT, "min_tokens": 4, **G}),
    "chat min_tokens over max_tokens": ("/v1/chat/completions", {"messages": CHAT, "min_tokens": 20, **G}),
    "chat temperature 3": ("/v1/chat/completions", {"messages": CHAT, "temperature": 3, "max_tokens": 4}),
    "chat max_tokens 0": ("/v1/chat/completions", {"messages": CHAT, "max_tokens": 0}),
    "chat unknown model": ("/v1/chat/completions", {"model": "nope", "messages": CHAT, **G}),
    "chat no messages": ("/v1/chat/completions", {"messages": [], **G}),
    "completion": ("/v1/completions", {"prompt": "The sky is", **G}),
    "completion stream": ("/v1/completions", {"prompt": "The sky is", "stream": True, **G}),
    "completion prompt list": ("/v1/completions", {"prompt": ["The sky is", "Grass is"], **G}),
    "completion echo false best_of 1": ("/v1/completions", {"prompt": "The sky is", "echo": False, "best_of": 1,
                                                            **G}),
    "completion logprobs 2": ("/v1/completions", {"prompt": "The sky is", "logprobs": 2, **G}),
    "completion logprobs 0": ("/v1/completions", {"prompt": "The sky is", "logprobs": 0, **G}),
    "completion seed -5": ("/v1/completions", {"prompt": "The sky is", "seed": -5, "temperature": 1.0,
                                               "max_tokens": 4}),
    "completion stop_token_ids": ("/v1/completions", {"prompt": "The sky is", "stop_token_ids": [5], **G}),
    "completion default max_tokens": ("/v1/completions", {"prompt": "The sky is", "temperature": 0}),
    "completion over the context": ("/v1/completions", {"prompt": "The sky is", "max_tokens": 5000}),
    "chat stream over the context": ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x " * 3000}],
                                                              "stream": True, "max_tokens": 4}),
    "chat tools auto": ("/v1/chat/completions", {"messages": CHAT, "tool_choice": "auto", "tools": [
        {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}], **G}),
    "chat tools auto call": ("/v1/chat/completions", {"messages": CHAT, "tools": TOOLS, **T, **CALL}),
    "chat tools auto call stream": ("/v1/chat/completions", {"messages": CHAT, "tools": TOOLS, **T, **CALL,
                                                             "stream": True}),
    "completion choice": ("/v1/completions", {"prompt": "The sky is",
                                              "structured_outputs": {"choice": ["blue", "grey"]}, **G}),
    "completion regex": ("/v1/completions", {"prompt": "The sky is", "structured_outputs": {"regex": "(ab|cd)[0-9]{3}"},
                                             **G}),
    "chat regex stream": ("/v1/chat/completions", {"messages": CHAT, "structured_outputs": {"regex": "[a-c]{4}x"},
                                                   "stream": True, **G}),
    "completion grammar": ("/v1/completions", {"prompt": "The sky is", **G, "structured_outputs": {
        "grammar": 'root ::= "yes" | "no" | ("maybe " [0-9])'}}),
    "chat structured json": ("/v1/chat/completions", {"messages": CHAT, **G, "max_tokens": 48, "structured_outputs": {
        "json": {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"],
                 "additionalProperties": False}}}),
    "completion bad regex": ("/v1/completions", {"prompt": "x", "structured_outputs": {"regex": "(ab"}, **G}),
    "completion bad grammar": ("/v1/completions", {"prompt": "x", "structured_outputs": {"grammar": "root ::= "}, **G}),
    "completion two constraints": ("/v1/completions", {"prompt": "x", **G,
                                                       "structured_outputs": {"regex": "a+", "choice": ["a"]}}),
    "chat tool named": ("/v1/chat/completions", {"messages": CHAT, "tools": TOOLS, **NAMED, **T}),
    "chat tool named stream": ("/v1/chat/completions", {"messages": CHAT, "tools": TOOLS, **NAMED, **T,
                                                        "stream": True}),
    "chat tool required": ("/v1/chat/completions", {"messages": CHAT, "tools": TOOLS, "tool_choice": "required",
                                                    "parallel_tool_calls": False, **T}),
    "chat tool required stream": ("/v1/chat/completions", {"messages": CHAT, "tools": TOOLS, "stream": True,
                                                           "tool_choice": "required", "parallel_tool_calls": False,
                                                           **T}),
    "chat tool none": ("/v1/chat/completions", {"messages": CHAT, "tools": TOOLS, "tool_choice": "none", **G}),
    "chat tool history": ("/v1/chat/completions", {"messages": [
        *CHAT,
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "weather", "arguments": '{"unit": "c"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "20 degrees"}], **G}),
    # an agent loop's second turn: the tools still given (auto), the call and its result in the history,
    # the call's arguments a JSON string as OpenAI sends them
    "chat tools auto history": ("/v1/chat/completions", {"messages": [*CHAT, *HISTORY], "tools": TOOLS,
                                                         "tool_choice": "auto", **G}),
    "chat tools auto history stream": ("/v1/chat/completions", {"messages": [*CHAT, *HISTORY], "tools": TOOLS,
                                                                "tool_choice": "auto", "stream": True, **G}),
    # a call cut by max_tokens: the answer ends on "length", never "tool_calls"
    "chat tools auto call cut": ("/v1/chat/completions", {"messages": CHAT, "tools": TOOLS, **CALL,
                                                          "temperature": 0, "max_tokens": 11}),
    "chat tools auto call cut stream": ("/v1/chat/completions", {"messages": CHAT, "tools": TOOLS, **CALL,
                                                                 "temperature": 0, "max_tokens": 11, "stream": True}),
    "chat tool_choice not in tools": ("/v1/chat/completions", {"messages": CHAT, "tools": TOOLS, **T,
                                                               "tool_choice": {"type": "function",
                                                                               "function": {"name": "x"}}}),
    "chat tool_choice without tools": ("/v1/chat/completions", {"messages": CHAT, "tool_choice": "required", **G}),
    # vLLM's prompt extras: token ids, echo, logit_bias, prompt_logprobs, chat template options
    "completion token ids": ("/v1/completions", {"prompt": IDS, **G}),
    "completion token ids stream": ("/v1/completions", {"prompt": IDS, "stream": True,
                                                        "stream_options": {"include_usage": True}, **G}),
    "completion token id lists": ("/v1/completions", {"prompt": [IDS[:2], IDS[2:]], **G}),
    "completion token id lists stream": ("/v1/completions", {"prompt": [IDS[:2], IDS[2:]], "stream": True, **G}),
    "completion token id lists logprobs": ("/v1/completions", {"prompt": [IDS[:2], IDS], "logprobs": 1, **G}),
    "completion token id out of vocab": ("/v1/completions", {"prompt": [1, 99999], **G}),
    "completion token id out of vocab stream": ("/v1/completions", {"prompt": [[1], [99999]], "stream": True, **G}),
    "completion token id negative": ("/v1/completions", {"prompt": [1, -1], **G}),
    "completion token ids over the context": ("/v1/completions", {"prompt": [5] * 3000, "max_tokens": 4}),
    "completion echo": ("/v1/completions", {"prompt": "The sky is", "echo": True, **G}),
    "completion echo stream": ("/v1/completions", {"prompt": "The sky is", "echo": True, "stream": True, **G}),
    "completion echo token ids": ("/v1/completions", {"prompt": IDS, "echo": True, **G}),
    "completion echo logprobs": ("/v1/completions", {"prompt": "The sky is", "echo": True, "logprobs": 2, **G}),
    "completion echo logprobs stream": ("/v1/completions", {"prompt": "The sky is", "echo": True, "logprobs": 1,
                                                            "stream": True, **G}),
    "completion echo n=2": ("/v1/completions", {"prompt": ["The sky is", "Grass"], "echo": True, "n": 2,
                                                "temperature": 1.0, "max_tokens": 3}),
    "completion logit_bias": ("/v1/completions", {"prompt": "The sky is", **BIAS, **G}),
    "chat logit_bias": ("/v1/chat/completions", {"messages": CHAT, **BIAS, **G}),
    "chat logit_bias stream": ("/v1/chat/completions", {"messages": CHAT, **BIAS, "stream": True, **G}),
    "chat logit_bias out of range": ("/v1/chat/completions", {"messages": CHAT, "logit_bias": {"306": 500}, **G}),
    "chat logit_bias out of vocab": ("/v1/chat/completions", {"messages": CHAT, "logit_bias": {"99999": 5}, **G}),
    "chat logit_bias out of vocab stream": ("/v1/chat/completions", {"messages": CHAT, "logit_bias": {"-1": 5},
                                                                     "stream": True, **G}),
    "chat logit_bias not a token id": ("/v1/chat/completions", {"messages": CHAT, "logit_bias": {"x": 5}, **G}),
    "completion prompt_logprobs": ("/v1/completions", {"prompt": "The sky is", "prompt_logprobs": 2, **G}),
    "completion prompt_logprobs token ids": ("/v1/completions", {"prompt": IDS, "prompt_logprobs": 0, **G}),
    "completion prompt_logprobs 0 stream": ("/v1/completions", {"prompt": "The sky is", "prompt_logprobs": 0,
                                                                "stream": True, **G}),
    "completion prompt_logprobs stream": ("/v1/completions", {"prompt": "The sky is", "prompt_logprobs": 1,
                                                              "stream": True, **G}),
    "completion prompt_logprobs over 20": ("/v1/completions", {"prompt": "The sky is", "prompt_logprobs": 21, **G}),
    "chat prompt_logprobs": ("/v1/chat/completions", {"messages": CHAT, "prompt_logprobs": 1, **G}),
    "chat prompt_logprobs stream": ("/v1/chat/completions", {"messages": CHAT, "prompt_logprobs": 1,
                                                             "stream": True, **G}),
    "chat continue_final_message": ("/v1/chat/completions", {"messages": CONTINUED, "continue_final_message": True,
                                                             "add_generation_prompt": False, **G}),
    "chat continue_final_message stream": ("/v1/chat/completions", {"messages": CONTINUED, "stream": True,
                                                                    "continue_final_message": True,
                                                                    "add_generation_prompt": False, **G}),
    "chat add_generation_prompt false": ("/v1/chat/completions", {"messages": CHAT, "add_generation_prompt": False,
                                                                  **G}),
    "chat continue_final_message and add_generation_prompt": ("/v1/chat/completions", {
        "messages": CONTINUED, "continue_final_message": True, "add_generation_prompt": True, **G}),
    "chat continue_final_message alone": ("/v1/chat/completions", {"messages": CONTINUED,
                                                                   "continue_final_message": True, **G}),
    "responses": ("/v1/responses", {"input": "Say hi", "instructions": "You are terse.", "temperature": 0,
                                    "max_output_tokens": 8}),
    "responses messages": ("/v1/responses", {"input": CHAT[1:], "temperature": 0, "max_output_tokens": 8}),
    "responses stream": ("/v1/responses", {"input": "Say hi", "temperature": 0, "max_output_tokens": 8,
                                           "stream": True}),
    "responses max_output_tokens 0": ("/v1/responses", {"input": "Say hi", "max_output_tokens": 0}),
    "responses unknown previous_response_id": ("/v1/responses", {"input": "Say hi", "max_output_tokens": 8,
                                                                 "previous_response_id": "resp_" + "0" * 32}),
    "responses retrieve unknown": ("/v1/responses/resp_" + "0" * 32, {}),
    "tokenize": ("/tokenize", {"prompt": "The sky is blue"}),
    "tokenize no special tokens": ("/tokenize", {"prompt": "The sky is blue", "add_special_tokens": False}),
    "tokenize messages": ("/tokenize", {"messages": CHAT}),
    "tokenize messages no generation prompt": ("/tokenize", {"messages": CHAT, "add_generation_prompt": False}),
    "tokenize token strs": ("/tokenize", {"prompt": "The sky is blue", "return_token_strs": True}),
    "tokenize messages token strs": ("/tokenize", {"messages": CHAT, "return_token_strs": True}),
    "tokenize continue_final_message": ("/tokenize", {"messages": CONTINUED, "continue_final_message": True,
                                                      "add_generation_prompt": False, "return_token_strs": True}),
    "tokenize continue_final_message and add_generation_prompt": ("/tokenize", {
        "messages": CONTINUED, "continue_final_message": True, "add_generation_prompt": True}),
    "tokenize continue_final_message alone": ("/tokenize", {"messages": CONTINUED, "continue_final_message": True}),
    "detokenize": ("/detokenize", {"tokens": [1882, 306, 77, 91, 338]}),
    "models": ("/v1/models", {}),
    "health": ("/health", {}),
    "version": ("/version", {}),
}

#: The cases that end on a stop string or stop token id, and the ``stop_reason`` each choice has.
STOPPED = {"chat stop": ["quiv"], "chat stop stream": ["quiv"], "completion stop": ["NINE"],
           "completion stop stream": ["NINE"], "completion stop_token_ids matched": [3526]}

#: Fields whose null a client reads from the wire (OpenAI's chunks carry them as null until set).
#: Any other field absent on one side and null on the other is no difference: a client reads
#: null either way (vLLM's own extensions such as ``token_ids`` or ``kv_transfer_params`` are null
#: unless asked for, and inferq leaves them out).
NULL_MATTERS = ("finish_reason", "logprobs")

_ROOT = "the model's (or adapter's) path on the worker's disk is not shown to clients"
_ADAPTER_LEN = "an adapter's card carries its base model's context window"
_PERMISSION = "a legacy OpenAI object that OpenAI itself no longer sends"
_STATE = ("a model's state in the fleet and its awake and asleep workers (multi-model workers hold models asleep); "
          "null on an adapter's card")
_REFUSED_FIRST = ("refused before the stream starts (400 and the error body, as a request vLLM's renderer "
                  "refuses), where vLLM's engine refuses it after its stream started (200, then an error "
                  "payload): the same error, told as an HTTP error")
_ECHO_IDS = ("vLLM's streamed echo also sends the prompt's token ids in the first chunk (code it shares with "
             "`return_token_ids`, which inferq does not serve); inferq sends what echo asks for: the text "
             "and, with logprobs, the log-probs")
_OPENAI_SHAPE = "as OpenAI's Responses API answers: metadata {} and text.format when none were given"
_VLLM_RESPONSES = ("vLLM's own additions to a Response: per-turn and tool usage counts (its multi-turn tool "
                   "loop, which inferq does not run) and the penalties its /v1/responses takes (inferq's, as "
                   "OpenAI's, takes none)")
_RESPONSE_CASES = ("responses", "responses messages")
_CANCEL_AGAIN = ("a cancelled background response cancelled again is answered as it is (OpenAI: cancelling is "
                 "idempotent); vLLM refuses any response that is not queued or in progress")
# (case, path) -> why inferq differs on purpose.
INTENDED: dict[tuple[str, str], str] = {
    # the model, then its two LoRA adapters
    **{("models", f"shape .data[{i}].root"): _ROOT for i in range(3)},
    **{("models", f"shape .data[{i}].max_model_len"): _ADAPTER_LEN for i in (1, 2)},
    **{("models", f"shape .data[{i}].{f}"): _STATE for i in range(3)
       for f in ("state", "awake_workers", "asleep_workers")},
    **{("models", f"shape .data[{i}].permission{p}"): _PERMISSION for i in range(3) for p in (
        "", "[0]", "[0].allow_create_engine", "[0].allow_fine_tuning", "[0].allow_logprobs", "[0].allow_sampling",
        "[0].allow_search_indices", "[0].allow_view", "[0].is_blocking", "[0].object", "[0].organization")},
    # a token id out of the vocabulary is refused before the first token (the prompt's by the gateway,
    # logit_bias's by the engine): a stream's response, held until then, is that error
    **{(case, key): _REFUSED_FIRST for case in ("completion token id out of vocab stream",
                                                "chat logit_bias out of vocab stream")
       for key in ("status", "error", "done", "first chunk", "finish_reasons", "stop_reasons", "text",
                   "usage chunk")},
    **{(case, f"{where}{p}"): _OPENAI_SHAPE for case, where in (*((c, "shape ") for c in _RESPONSE_CASES),
                                                               ("responses stream", "first chunk .response"))
       for p in (".metadata", ".text", ".text.format", ".text.format.type")},
    **{(case, f"shape {p}"): _VLLM_RESPONSES for case in _RESPONSE_CASES for p in (
        ".frequency_penalty", ".presence_penalty", ".usage.input_tokens_details.cache_write_tokens",
        ".usage.input_tokens_details.cached_tokens_per_turn", ".usage.input_tokens_details.input_tokens_per_turn",
        ".usage.output_tokens_details.output_tokens_per_turn", ".usage.output_tokens_details.tool_output_tokens",
        ".usage.output_tokens_details.tool_output_tokens_per_turn")},
    **{("responses stream", f"first chunk .response.{p}"): _VLLM_RESPONSES
       for p in ("frequency_penalty", "presence_penalty")},
    **{(case, f"first chunk .choices[0].prompt_token_ids{i}"): _ECHO_IDS
       for case in ("completion echo stream", "completion echo logprobs stream") for i in ("", "[0]", "[1]", "[2]")},
    **{("responses background cancel again", key): _CANCEL_AGAIN for key in ("status", "error", "values")},
}

#: A chunk's per-token logprobs after its first token, in a shape's path (``.logprobs.tokens[1]``).
_LATER_TOKEN = re.compile(r"\.logprobs\.(tokens|token_logprobs|text_offset|top_logprobs|content)\[[1-9][0-9]*\]")

_CUT_CALL = ("a tool call cut by max_tokens, collected: vLLM parses the whole text once and, as it does not parse, "
             "answers it as content with no call; inferq's answer is made of the parser's streamed pieces (as its "
             "stream is, and vLLM's), so it holds the partial call. Both end on finish_reason length")
# (case, path) -> not matched yet (the record of what is left to do).
NOT_YET: dict[tuple[str, str], str] = {
    **{("chat tools auto call cut", f"shape .choices[0].message.{p}"): _CUT_CALL for p in (
        "content", "tool_calls", "tool_calls[0]", "tool_calls[0].function", "tool_calls[0].function.arguments",
        "tool_calls[0].function.name", "tool_calls[0].type")},
    ("chat tools auto call cut", "texts"): _CUT_CALL,
}


def shape(v: Any, path: str = "") -> dict[str, str]:
    """Every field's JSON type by path (list items by index), ids and timestamps included."""
    if isinstance(v, dict):
        out = {path or ".": "object"}
        for k, x in v.items():
            out.update(shape(x, f"{path}.{k}"))
        return out
    if isinstance(v, list):
        out = {path or ".": "array"}
        for i, x in enumerate(v[:3]):
            out.update(shape(x, f"{path}[{i}]"))
        return out
    kind = {bool: "bool", int: "number", float: "number", str: "string", type(None): "null"}[type(v)]
    return {path: kind}


def answer(http: httpx.Client, path: str, body: dict[str, Any]) -> dict[str, Any]:
    """What a client sees: status, and the JSON body or (streams) the parsed chunks."""
    if body.get("stream"):
        with http.stream("POST", path, json=body) as r:
            if r.status_code != 200:
                r.read()
                return {"status": r.status_code, "body": r.json()}
            chunks = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
        done = chunks[-1:] == ["[DONE]"]
        return {"status": 200, "chunks": [json.loads(c) for c in chunks if c != "[DONE]"], "done": done}
    r = http.post(path, json=body) if body else http.get(path)
    try:
        return {"status": r.status_code, "body": r.json()}
    except ValueError:
        return {"status": r.status_code, "body": {}}


def summary(a: dict[str, Any]) -> dict[str, Any]:
    """What is compared of an answer."""
    out: dict[str, Any] = {"status": a["status"]}
    if "chunks" in a:
        chunks = a["chunks"]
        out["done"] = a["done"]
        out["first chunk"] = shape(chunks[0]) if chunks else None
        # a chunk in the middle: not the first, and not one that ends a choice (with several prompts,
        # inferq streams them one after another, and where a prompt's end falls depends on load)
        content = [c for c in chunks if c.get("choices") and not any(ch.get("finish_reason") for ch in c["choices"])]
        out["middle chunk"] = shape(content[1]) if len(content) > 2 else None
        out["finish_reasons"] = sorted({ch["finish_reason"] for c in chunks for ch in c.get("choices", [])
                                        if ch.get("finish_reason")})
        out["usage chunk"] = any(c.get("usage") and not c.get("choices") for c in chunks)
        out["stop_reasons"] = [ch.get("stop_reason") for c in chunks for ch in c.get("choices", [])
                               if ch.get("finish_reason")]
        out["text"] = "".join((ch.get("delta") or {}).get("content") or ch.get("text") or ""
                              for c in chunks for ch in c.get("choices", []) if ch.get("index", 0) == 0)
        return out
    body = a["body"]
    if a["status"] >= 400:
        err = body.get("error", body)
        out["error"] = {k: type(err.get(k)).__name__ for k in ("message", "type")}
        return out
    out["shape"] = shape(body)
    out["values"] = {k: body[k] for k in ("tokens", "token_strs", "count", "prompt", "max_model_len") if k in body}
    out["finish_reasons"] = [c.get("finish_reason") for c in body.get("choices", [])]
    out["stop_reasons"] = [c.get("stop_reason") for c in body.get("choices", [])]
    out["texts"] = [c.get("text", (c.get("message") or {}).get("content")) for c in body.get("choices", [])]
    if isinstance(body.get("output"), list):  # a response (/v1/responses): its output text and status
        out["texts"] = [p.get("text") for item in body["output"] for p in item.get("content") or []]
        out["values"] = {"status": body.get("status")}
    return out


def differences(case: str, ours: dict[str, Any], theirs: dict[str, Any], greedy: bool) -> dict[tuple[str, str], str]:
    out = {}
    for key in sorted(set(ours) | set(theirs)):
        a, b = ours.get(key), theirs.get(key)
        if key in ("text", "texts") and not greedy:
            continue
        if key == "middle chunk" and None in (a, b):  # how a stream is cut depends on load, not code
            continue
        if key in ("shape", "first chunk", "middle chunk") and isinstance(a, dict) and isinstance(b, dict):
            for p in sorted(set(a) | set(b)):
                pair = {a.get(p), b.get(p)}
                if pair == {None, "null"} and p.rsplit(".", 1)[-1] not in NULL_MATTERS:
                    continue
                if key == "middle chunk" and None in pair and _LATER_TOKEN.search(p):
                    continue  # a chunk's per-token logprobs: how many tokens it carries depends on load
                if a.get(p) != b.get(p) and not p.endswith((".id", ".created", ".system_fingerprint")):
                    out[(case, f"{key} {p}")] = f"inferq {a.get(p)}, vLLM {b.get(p)}"
        elif a != b:
            out[(case, key)] = f"inferq {str(a)[:120]!r}, vLLM {str(b)[:120]!r}"
    return out


@dataclass
class VllmServer:
    base: str
    service: Service

    def stop(self) -> None:
        self.service.stop()


@ahead("vllm_server")
def start_vllm_server(request: pytest.FixtureRequest) -> VllmServer:
    """vLLM's own OpenAI server on the built-in model, with a worker's engine arguments (not
    waited for)."""
    from bench.inprocess import engine_args
    from bench.vllm_serve import flags
    from inferq.shared.settings import Settings
    from inferq.worker.engine.models import resolve_model

    adapters = request.getfixturevalue("lora_adapters")
    settings = {"max_num_seqs": 64, "cpu_kv_cache_gib": 0.5, "lora_modules": lora_modules(adapters)}
    path = resolve_model(Settings(**settings))
    port = quiet_port()  # its process starts for a while (quiet_port)
    # a tool-call parser: vLLM serves no tool_choice but "none" without one
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--host", "127.0.0.1", "--port",
           str(port), "--enable-auto-tool-choice", "--tool-call-parser", "pythonic",
           "--structured-outputs-config", json.dumps({"backend": "xgrammar", "disable_any_whitespace": True}),
           *flags(engine_args({"model_path": path, "settings": settings})),
           "--lora-modules", *(f"{name}={folder}" for name, folder in adapters.items())]
    # its Responses store: background responses, read back and cancelled (as inferq keeps each response)
    service = spawn("vllm-openai", cmd, {**os.environ, "VLLM_NO_USAGE_STATS": "1",
                                         "VLLM_ENABLE_RESPONSES_API_STORE": "1"},
                    request.getfixturevalue("logdir"))
    return VllmServer(f"http://127.0.0.1:{port}", service)


@pytest.fixture(scope="module")
def vllm_server(request: pytest.FixtureRequest) -> Iterator[str]:
    server: VllmServer = take("vllm_server", request)
    try:
        eventually(lambda: http_ok(f"{server.base}/health"), 240, "vLLM's OpenAI server", procs=[server.service],
                   interval=0.2)
        yield server.base
    finally:
        server.stop()


def test_inferq_answers_as_vllm_serve_does(stack, vllm_server) -> None:
    found: dict[tuple[str, str], str] = {}
    stopped: dict[str, tuple[Any, Any]] = {}
    with httpx.Client(base_url=stack.base, timeout=120) as ours, \
            httpx.Client(base_url=vllm_server, timeout=120) as theirs:
        for case, (path, body) in CASES.items():
            body = {"model": MODEL, **body} if body else body
            greedy = body.get("temperature") == 0
            a, b = summary(answer(ours, path, body)), summary(answer(theirs, path, body))
            found.update(differences(case, a, b, greedy))
            if case in STOPPED:
                stopped[case] = (a.get("stop_reasons"), b.get("stop_reasons"))
        for (case, a), b in zip(lifecycle(ours).items(), lifecycle(theirs).values(), strict=True):
            found.update(differences(case, a, b, greedy=False))
    # the stop cases really stop on their string or id, on both servers
    assert stopped == {case: (want, want) for case, want in STOPPED.items()}, stopped
    new = {k: v for k, v in found.items() if k not in INTENDED and k not in NOT_YET}
    gone = sorted(k for k in NOT_YET if k not in found)
    report = "\n".join(f"  {c} | {p}: {v}" for (c, p), v in sorted(new.items()))
    assert not new, f"{len(new)} differences from vLLM's OpenAI server not on a list:\n{report}"
    assert not gone, f"matched now, take them off NOT_YET: {gone}"


ADAPTER_CASES = {
    "/v1/completions": {"prompt": "def main():", "max_tokens": 16, "temperature": 0},
    "/v1/chat/completions": {"messages": [{"role": "user", "content": "Say something."}], "max_tokens": 16,
                             "temperature": 0},
}


def _text(path: str, body: dict[str, Any]) -> str:
    choice = body["choices"][0]
    return choice["text"] if path == "/v1/completions" else choice["message"]["content"]


def test_each_lora_adapter_answers_as_vllm_serve_does(stack, vllm_server) -> None:
    """At temperature 0, each LoRA adapter's completions and chat answers are vLLM's own with the
    same adapter, token for token, named as the adapter; and the adapters steer the model apart."""
    texts: dict[tuple[str, str], str] = {}
    with httpx.Client(base_url=stack.base, timeout=120) as ours, \
            httpx.Client(base_url=vllm_server, timeout=120) as theirs:
        for name in [MODEL, *ADAPTER_SEEDS]:
            for path, body in ADAPTER_CASES.items():
                a, b = (c.post(path, json={"model": name, **body}) for c in (ours, theirs))
                assert a.status_code == b.status_code == 200, (name, path, a.text, b.text)
                assert a.json()["model"] == b.json()["model"] == name
                assert _text(path, a.json()) == _text(path, b.json()), (name, path)
                assert a.json()["usage"]["total_tokens"] == b.json()["usage"]["total_tokens"], (name, path)
                texts[name, path] = _text(path, a.json())
    for path in ADAPTER_CASES:
        assert len({texts[name, path] for name in [MODEL, *ADAPTER_SEEDS]}) == 1 + len(ADAPTER_SEEDS), texts
