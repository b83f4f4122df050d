"""The request limits an operator configures (``INFERQ_MAX_*``), checked against a given
:class:`Settings`, never the process-wide ones: the schemas hold only shapes and fixed bounds, so
``create_app(settings)`` (or a gateway with other variables) enforces its own limits."""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Iterator
from typing import Any

from inferq.shared.errors import InvalidRequest
from inferq.shared.schemas import JobRequest
from inferq.shared.settings import Settings


def check_limits(req: JobRequest, settings: Settings) -> None:
    """Raise :class:`InvalidRequest` (400) naming the first field over its configured limit."""
    s = settings
    _check_sampling(req, s)
    _check_prompt_size(req, s)
    if req.timeout is not None and req.timeout > s.max_timeout_s:
        _refuse("timeout", f"must be <= {s.max_timeout_s:g} seconds")
    for param, text in _texts(req):
        if not _encodable(text):
            _refuse(param, "is not valid Unicode (it holds a lone surrogate)")
    if req.tools is not None:  # first: a forced tool call's json_schema is built from them
        check_json(req.tools, "tools", s)
    if req.json_schema is not None:
        check_json(req.json_schema, "json_schema", s)


def _check_sampling(req: JobRequest, s: Settings) -> None:
    if req.max_tokens is not None and req.max_tokens > s.max_tokens_limit:
        _refuse("max_tokens", f"must be <= {s.max_tokens_limit}")
    if len(req.stop) > s.max_stop_sequences:
        _refuse("stop", f"at most {s.max_stop_sequences} stop sequences")
    if any(len(x) > s.max_stop_chars for x in req.stop):
        _refuse("stop", f"each stop sequence must be 1 to {s.max_stop_chars} characters")
    if req.n > s.max_n:
        _refuse("n", f"must be <= {s.max_n}")


def _check_prompt_size(req: JobRequest, s: Settings) -> None:
    """The prompt in whatever form (text, token ids, messages, embedding inputs) against
    ``max_prompt_chars``."""
    if req.prompt is not None and len(req.prompt) > s.max_prompt_chars:
        _refuse("prompt", f"is {len(req.prompt)} characters; the limit is {s.max_prompt_chars}")
    if req.prompt_token_ids is not None and len(req.prompt_token_ids) > s.max_prompt_chars:
        # a token is at least one character: the ids may not say more than the text could
        _refuse("prompt", f"is {len(req.prompt_token_ids)} token ids; the limit is {s.max_prompt_chars}")
    if req.messages is not None and (chars := sum(len(m.content) for m in req.messages)) > s.max_prompt_chars:
        _refuse("messages", f"hold {chars} characters; the limit is {s.max_prompt_chars}")
    for i, x in enumerate((req.embed.texts or req.embed.token_ids or ()) if req.embed is not None else ()):
        if len(x) > s.max_prompt_chars:
            what = "characters" if isinstance(x, str) else "token ids"
            _refuse("input", f"input {i} is {len(x)} {what}; the limit is {s.max_prompt_chars}")


def check_token_ids(ids: list[int], vocab_size: int, param: str = "prompt") -> None:
    """A prompt of token ids, each in a vocabulary of ``vocab_size`` tokens, else 400 naming
    ``param`` (``prompt``, as OpenAI's API calls the prompt whatever form it takes)."""
    if ids and (bad := max(ids)) >= vocab_size:
        _refuse(param, f"token id {bad} is out of vocabulary (the model has {vocab_size} tokens)")


def check_vocabulary(req: JobRequest, vocab_size: int) -> None:
    """Every token id the request names (its prompt's, ``stop_token_ids``, ``logit_bias``' keys)
    in a vocabulary of ``vocab_size`` tokens, else 400 naming the field: the engine would refuse
    them only once the job runs."""
    if req.prompt_token_ids is not None:
        check_token_ids(req.prompt_token_ids, vocab_size)
    for param, ids in (("stop_token_ids", req.stop_token_ids), ("logit_bias", list(req.logit_bias or ()))):
        if bad := [t for t in ids if not 0 <= t < vocab_size]:
            _refuse(param, f"token id {bad[0]} is out of vocabulary (ids are 0 to {vocab_size - 1})")


def _texts(req: JobRequest) -> Iterator[tuple[str, str]]:
    """The request's strings that pydantic lets through as they are: a JSON string may hold a
    lone surrogate (``"\\ud800"``), which Python's JSON parser accepts and no UTF-8 encoder does."""
    if req.prompt is not None:
        yield "prompt", req.prompt
    for i, m in enumerate(req.messages or ()):
        yield f"messages.{i}.content", m.content
        if m.name is not None:
            yield f"messages.{i}.name", m.name
        for j, call in enumerate(m.tool_calls or ()):
            yield f"messages.{i}.tool_calls.{j}.function.arguments", call.function.arguments
    for x in req.stop:
        yield "stop", x
    for i, text in enumerate((req.embed.texts or ()) if req.embed is not None else ()):
        yield f"input.{i}", text
    for param, value in (("model", req.model), ("user", req.user)):
        if value is not None:
            yield param, value


def check_json(value: Any, param: str, settings: Settings) -> None:
    """A free-form JSON field (a JSON schema) as the worker can take it, else 400 naming ``param``:
    objects and arrays nested at most ``max_json_depth`` deep, at most ``max_json_bytes`` as
    compact JSON, and nothing JSON cannot carry (NaN, infinities, lone surrogates: Python's JSON
    parser lets them through, the worker's refuses them).

    The walk is iterative and stops at the first level too deep, so a value nested thousands of
    levels costs no recursion; only a value that passed it is serialized, to measure it."""
    limit = settings.max_json_depth
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        v, depth = stack.pop()
        if isinstance(v, (dict, list)):
            if depth > limit:
                _refuse(param, f"nests objects and arrays more than {limit} levels deep")
            if isinstance(v, dict):
                for k in v:
                    if not _encodable(k):
                        _refuse(param, "holds a string that is not valid Unicode (a lone surrogate)")
                items: Iterable[Any] = v.values()
            else:
                items = v
            stack.extend((x, depth + 1) for x in items if isinstance(x, (dict, list, str, float)))
        elif isinstance(v, str):
            if not _encodable(v):
                _refuse(param, "holds a string that is not valid Unicode (a lone surrogate)")
        elif isinstance(v, float) and not math.isfinite(v):
            _refuse(param, "holds a number JSON cannot represent (NaN or an infinity)")
    size = len(json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode())
    if size > settings.max_json_bytes:
        _refuse(param, f"is {size} bytes as JSON; the limit is {settings.max_json_bytes}")


def _encodable(text: str) -> bool:
    if text.isascii():
        return True
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


def _refuse(param: str, message: str) -> None:
    raise InvalidRequest(f"{param}: {message}", param=param)
