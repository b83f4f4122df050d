"""inferq's one error vocabulary (docs/errors.md).

Every error has a ``type``, the class of failure a client can act on (OpenAI's word for it), and
a ``code``, the specific reason; each type has one HTTP status. Each type is an exception class
below; the gateway maps them to HTTP responses, SSE payloads and WebSocket events in
``api/errors.py``, and workers store them in job records as ``ErrorInfo``.
"""

from __future__ import annotations

from typing import ClassVar, Literal, Protocol, get_args

ErrorType = Literal["invalid_request_error", "authentication_error", "permission_error", "not_found_error",
                    "conflict_error",
                    "rate_limit_error", "server_error", "service_unavailable", "timeout_error"]
TYPES: frozenset[str] = frozenset(get_args(ErrorType))

# Codes that stood alone in the ``type`` field of job records and events written before types
# and codes were kept apart, and the type each belongs to.
_LEGACY_CODE_TYPES: dict[str, ErrorType] = {
    "context_length_exceeded": "invalid_request_error",
    "deadline_exceeded": "timeout_error",
    "worker_lost": "service_unavailable",
    "enqueue_failed": "service_unavailable",
    "engine_error": "server_error",
    "internal_error": "server_error",
}


def classify(type_: str, code: str | None = None) -> tuple[ErrorType, str | None]:
    """``(type, code)`` in today's vocabulary. A ``type`` that is not one of :data:`TYPES` is an
    old record's code: its type is looked up (``server_error`` when unknown)."""
    if type_ in TYPES:
        return type_, code  # type: ignore[return-value]
    return _LEGACY_CODE_TYPES.get(type_, "server_error"), code or type_


class InferqError(Exception):
    """Base of every typed error; on its own, an unexpected failure (``server_error``)."""

    status: ClassVar[int] = 500
    type: ClassVar[ErrorType] = "server_error"
    default_code: ClassVar[str] = "internal_error"

    def __init__(self, message: str, *, code: str | None = None, param: str | None = None,
                 retry_after: float | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.code = code or self.default_code
        self.param = param
        self.retry_after = retry_after


class InvalidRequest(InferqError):
    status = 400
    type = "invalid_request_error"
    default_code = "invalid_value"


class ContextLengthExceeded(InvalidRequest):
    """Prompt tokens plus ``max_tokens`` do not fit the model's context window. A prompt that
    leaves no room for even one token names the prompt's field (``prompt_param``: ``prompt`` or
    ``messages``), since no ``max_tokens`` would help; otherwise the error names ``max_tokens``.
    ``prompt_tokens`` None: the prompt was not counted, and ``max_tokens`` alone fills the window."""

    default_code = "context_length_exceeded"

    def __init__(self, prompt_tokens: int | None, max_tokens: int, max_model_len: int,
                 prompt_param: str = "prompt") -> None:
        if prompt_tokens is None:  # not counted (the gateway cannot tokenize the prompt): max_tokens alone
            super().__init__(
                f"this model's maximum context length is {max_model_len} tokens; the request asks for "
                f"{max_tokens} output tokens, which leaves no room for its prompt: lower max_tokens",
                param="max_tokens",
            )
            return
        if prompt_tokens >= max_model_len:
            super().__init__(
                f"this model's maximum context length is {max_model_len} tokens; the prompt alone has "
                f"{prompt_tokens} tokens, which leaves no room for output: shorten the prompt",
                param=prompt_param,
            )
            return
        super().__init__(
            f"this model's maximum context length is {max_model_len} tokens; the request has "
            f"{prompt_tokens} prompt tokens and asks for {max_tokens} more "
            f"({prompt_tokens + max_tokens} in all): shorten the prompt or lower max_tokens",
            param="max_tokens",
        )


class BodyTooLarge(InvalidRequest):
    """An ``invalid_request_error`` that is not a 400 (as are the three below)."""

    status = 413
    default_code = "body_too_large"

    def __init__(self, max_bytes: int) -> None:
        super().__init__(f"request body is larger than {max_bytes} bytes")


class RequestTimeout(InvalidRequest):
    """The client stopped sending its request, headers or body, for longer than the gateway waits."""

    status = 408
    default_code = "request_timeout"


class HeadersTooLarge(InvalidRequest):
    """A request's line and headers are larger than the gateway reads."""

    status = 431
    default_code = "headers_too_large"


class UriTooLong(InvalidRequest):
    """A request line (its URL) longer than the gateway reads."""

    status = 414
    default_code = "uri_too_long"


class Unauthenticated(InferqError):
    """No API key, or one the gateway does not know."""

    status = 401
    type = "authentication_error"
    default_code = "invalid_api_key"


class Forbidden(InferqError):
    """The caller is known (or needs no key) but may not do this: e.g. a browser page on an origin
    outside ``INFERQ_ALLOWED_ORIGINS`` opening a WebSocket."""

    status = 403
    type = "permission_error"
    default_code = "origin_not_allowed"


class NotFound(InferqError):
    status = 404
    type = "not_found_error"
    default_code = "job_not_found"


def job_not_found(job_id: str) -> NotFound:
    """The one answer for a job a caller cannot see: unknown, malformed id, expired, or another
    key's (docs/security.md)."""
    return NotFound(f"job {job_id} not found", param="id", code="job_not_found")


class Conflict(InferqError):
    status = 409
    type = "conflict_error"
    default_code = "idempotency_in_progress"


class RateLimited(InferqError):
    """The model's queue is full, or the caller's own limits are used up."""

    status = 429
    type = "rate_limit_error"
    default_code = "rate_limit_exceeded"


class ServerError(InferqError):
    default_code = "internal_error"


class EngineError(ServerError):
    default_code = "engine_error"


class Unavailable(InferqError):
    """Something the job needs is away (Redis, the queue, its worker); retrying may succeed."""

    status = 503
    type = "service_unavailable"
    default_code = "redis_unavailable"


class DeadlineExceeded(InferqError):
    """The job reached its deadline (``timeout``) before it could finish."""

    status = 504
    type = "timeout_error"
    default_code = "deadline_exceeded"


BY_TYPE: dict[str, type[InferqError]] = {cls.type: cls for cls in (
    InvalidRequest, Unauthenticated, Forbidden, NotFound, Conflict, RateLimited, ServerError, Unavailable,
    DeadlineExceeded)}
STATUS: dict[str, int] = {t: cls.status for t, cls in BY_TYPE.items()}


class StoredError(Protocol):
    """An error as a job record or an ``error`` event stores it (``shared.schemas.ErrorInfo``)."""

    @property
    def type(self) -> str: ...
    @property
    def code(self) -> str | None: ...
    @property
    def message(self) -> str: ...
    @property
    def param(self) -> str | None: ...


def error_from(info: StoredError) -> InferqError:
    """The typed error a stored or streamed ``ErrorInfo`` stands for: a job that failed
    ``deadline_exceeded`` is a 504 ``timeout_error``, ``worker_lost`` a 503, and so on."""
    type_, code = classify(info.type, info.code)
    return BY_TYPE[type_](info.message, code=code, param=info.param)
