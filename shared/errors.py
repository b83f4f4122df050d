"""inferq's typed errors. Each carries its HTTP status and an OpenAI-style ``type``/``code``;
``api/errors.py`` maps them to responses in one place, and workers turn them into ``error`` events."""

from __future__ import annotations


class InferqError(Exception):
    status: int = 500
    type: str = "internal_error"

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None,
                 retry_after: float | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code
        self.retry_after = retry_after


class InvalidRequest(InferqError):
    status = 400
    type = "invalid_request_error"


class ContextLengthExceeded(InvalidRequest):
    """Prompt tokens plus ``max_tokens`` do not fit the model's context window."""

    def __init__(self, prompt_tokens: int, max_tokens: int, max_model_len: int) -> None:
        super().__init__(
            f"this model's maximum context length is {max_model_len} tokens; the request has "
            f"{prompt_tokens} prompt tokens and asks for {max_tokens} more "
            f"({prompt_tokens + max_tokens} in all): shorten the prompt or lower max_tokens",
            param="max_tokens", code="context_length_exceeded",
        )


class NotFound(InferqError):
    status = 404
    type = "not_found_error"


class QueueFull(InferqError):
    status = 429
    type = "rate_limit_error"


class Unauthenticated(InferqError):
    """No API key, or one the gateway does not know."""

    status = 401
    type = "authentication_error"


class RateLimited(QueueFull):
    """The caller's own limits (submissions per minute, unfinished jobs) are used up."""


class IdempotencyConflict(InferqError):
    """The first request with this Idempotency-Key has not finished submitting yet."""

    status = 409
    type = "conflict_error"


class IdempotencyKeyReused(InferqError):
    """The Idempotency-Key was already used with a different request body."""

    status = 422
    type = "invalid_request_error"


class Unavailable(InferqError):
    status = 503
    type = "service_unavailable"


class EngineError(InferqError):
    status = 500
    type = "engine_error"
