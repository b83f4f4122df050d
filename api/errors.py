"""What a client is told when something fails, in one place for every protocol (docs/errors.md).

:func:`typed` turns any exception into one of the typed errors of ``shared/errors.py``; from
there an HTTP response (:func:`to_response`), OpenAI's error body (:class:`ErrorBody`, also the
last SSE payload of a failed stream) or a WebSocket ``error`` event and close code.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from pydantic import BaseModel, ValidationError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ReadOnlyError as RedisReadOnlyError
from redis.exceptions import ResponseError as RedisResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError
from starlette.exceptions import HTTPException as StarletteHTTPException

from inferq.api.metrics import count_rejection
from inferq.shared.errors import InferqError, InvalidRequest, NotFound, ServerError, Unavailable
from inferq.shared.schemas import ErrorEvent, ErrorInfo

log = logging.getLogger(__name__)

# WebSocket close codes: what the client did wrong, or 1011 (internal error) for the server's failures.
WS_CLOSE_CODES: dict[str, int] = {"invalid_request_error": 1008, "authentication_error": 4401,
                                  "permission_error": 4403,
                                  "not_found_error": 4404, "conflict_error": 4409, "rate_limit_error": 4429}
WS_CLOSE_SERVER_ERROR = 1011
_HTTP_CODES = {404: "route_not_found", 405: "method_not_allowed"}


class ErrorBody(BaseModel):
    """OpenAI's error body: every HTTP error response, and the last payload of a failed SSE stream."""

    error: ErrorInfo


class PassThrough(StarletteHTTPException):
    """A typed error raised where only an ``HTTPException`` gets through untouched (FastAPI wraps
    anything else raised while it reads a body into a 400)."""

    def __init__(self, error: InferqError) -> None:
        super().__init__(error.status, error.message)
        self.error = error


def validation_message(errors: Sequence[Mapping[str, Any]]) -> tuple[str, str | None]:
    """One readable line naming each bad field, and the first field's dotted path."""
    parts, first = [], None
    for e in errors:
        loc = [str(x) for x in e.get("loc", ()) if x not in ("body", "query", "path")]
        field = ".".join(loc) or None
        first = first or field
        msg = str(e.get("msg", "invalid")).removeprefix("Value error, ")
        if e.get("type") == "extra_forbidden":
            msg = "is not a supported parameter"
        parts.append(f"{field}: {msg}" if field else msg)
    return "; ".join(parts), first


def typed(exc: BaseException) -> InferqError:
    """``exc`` as the typed error a client is told about."""
    if isinstance(exc, InferqError):
        return exc
    if isinstance(exc, PassThrough):
        return exc.error
    if isinstance(exc, (RequestValidationError, ValidationError)):
        message, param = validation_message(exc.errors())
        return InvalidRequest(message, param=param)
    if isinstance(exc, (RedisConnectionError, RedisTimeoutError, RedisReadOnlyError)):  # READONLY: mid-failover
        log.warning("Redis unavailable: %s", exc)
        return Unavailable("the job store (Redis) is unavailable; retry shortly", retry_after=1.0)
    if isinstance(exc, RedisResponseError) and str(exc).startswith("OOM"):  # at maxmemory (noeviction)
        log.error("Redis refuses writes: it is at its maxmemory (%s)", exc)
        return Unavailable("the job store (Redis) is full; retry later", code="redis_full", retry_after=5.0)
    if isinstance(exc, StarletteHTTPException) and isinstance(exc.__cause__, RecursionError):
        # FastAPI's body parser gave up (thousands of levels): no field can be named yet
        return InvalidRequest("the request body nests JSON too deeply to be parsed")
    if isinstance(exc, StarletteHTTPException):  # routing: no such path, or not with this method
        if exc.status_code == 404:
            return NotFound(str(exc.detail), code=_HTTP_CODES[404])
        if exc.status_code < 500:
            return InvalidRequest(str(exc.detail), code=_HTTP_CODES.get(exc.status_code))
    log.exception("unhandled error", exc_info=exc)
    return ServerError("internal error")


def error_body(err: InferqError) -> ErrorBody:
    return ErrorBody(error=ErrorInfo.of(err))


def to_response(exc: Exception) -> Response:
    """The HTTP response for any exception: the only such mapping."""
    err = typed(exc)
    status, headers = err.status, {}
    if isinstance(exc, StarletteHTTPException) and not isinstance(exc, PassThrough):
        status, headers = exc.status_code, dict(exc.headers or {})  # 405 keeps its status and Allow
    if err.retry_after:
        headers["Retry-After"] = str(max(1, round(err.retry_after)))
    if status == 401:
        headers["WWW-Authenticate"] = "Bearer"
    if status == 429:
        count_rejection(err.code)
    if status in (408, 413):  # the request's body was not read to its end: the connection cannot carry another
        headers["Connection"] = "close"  # (said, a client opens a new one instead of racing the close)
    return Response(error_body(err).model_dump_json(), status, headers, media_type="application/json")


def ws_error_event(err: InferqError) -> ErrorEvent:
    """The ``error`` event a WebSocket gets when the gateway itself refuses or fails it; ``seq`` 0:
    it is not one of the job's events."""
    if err.status == 429:
        count_rejection(err.code)
    return ErrorEvent(seq=0, error=ErrorInfo.of(err))


def ws_close_code(err: InferqError) -> int:
    return WS_CLOSE_CODES.get(err.type, WS_CLOSE_SERVER_ERROR)


def document(schema: dict[str, Any]) -> dict[str, Any]:
    """Make an OpenAPI schema say what the gateway answers to an invalid request: ``400`` with
    :class:`ErrorBody` (FastAPI documents its own ``422``, which the gateway never sends)."""
    components = schema.setdefault("components", {}).setdefault("schemas", {})
    for name in ("HTTPValidationError", "ValidationError"):
        components.pop(name, None)
    body = ErrorBody.model_json_schema(ref_template="#/components/schemas/{model}")
    components.update(body.pop("$defs", {}))
    components["ErrorBody"] = body
    invalid = {"description": "Invalid request (docs/errors.md)",
               "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorBody"}}}}
    for operations in schema.get("paths", {}).values():
        for op in operations.values():
            if "422" in op.get("responses", {}):
                del op["responses"]["422"]
                op["responses"].setdefault("400", invalid)
    return schema


def install(app: FastAPI) -> None:
    """Answer every exception through :func:`to_response`, and document it in the OpenAPI schema."""

    async def handler(_: Request, exc: Exception) -> Response:
        return to_response(exc)

    for exc_type in (InferqError, RequestValidationError, ValidationError, StarletteHTTPException,
                     RedisConnectionError, RedisTimeoutError, Exception):
        app.add_exception_handler(exc_type, handler)
    build = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = document(build())
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
