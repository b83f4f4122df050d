"""The request limits an operator configures (``INFERQ_MAX_*``), checked against a given
:class:`Settings`, never the process-wide ones: the schemas hold only shapes and fixed bounds, so
``create_app(settings)`` (or a gateway with other variables) enforces its own limits."""

from __future__ import annotations

from inferq.shared.errors import InvalidRequest
from inferq.shared.schemas import JobRequest
from inferq.shared.settings import Settings


def check_limits(req: JobRequest, settings: Settings) -> None:
    """Raise :class:`InvalidRequest` (400) naming the first field over its configured limit."""
    s = settings
    if req.max_tokens is not None and req.max_tokens > s.max_tokens_limit:
        _refuse("max_tokens", f"must be <= {s.max_tokens_limit}")
    if len(req.stop) > s.max_stop_sequences:
        _refuse("stop", f"at most {s.max_stop_sequences} stop sequences")
    if any(len(x) > s.max_stop_chars for x in req.stop):
        _refuse("stop", f"each stop sequence must be 1 to {s.max_stop_chars} characters")
    if req.n > s.max_n:
        _refuse("n", f"must be <= {s.max_n}")
    if req.prompt is not None and len(req.prompt) > s.max_prompt_chars:
        _refuse("prompt", f"is {len(req.prompt)} characters; the limit is {s.max_prompt_chars}")
    if req.messages is not None and (chars := sum(len(m.content) for m in req.messages)) > s.max_prompt_chars:
        _refuse("messages", f"hold {chars} characters; the limit is {s.max_prompt_chars}")
    if req.timeout is not None and req.timeout > s.max_timeout_s:
        _refuse("timeout", f"must be <= {s.max_timeout_s:g} seconds")


def _refuse(param: str, message: str) -> None:
    raise InvalidRequest(f"{param}: {message}", param=param)
