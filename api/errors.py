"""Every error the gateway returns is built here, in OpenAI's shape:
``{"error": {"message", "type", "param", "code"}}`` with the matching HTTP status."""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import ValidationError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from starlette.exceptions import HTTPException as StarletteHTTPException

from inferq.shared.errors import InferqError

log = logging.getLogger(__name__)

_HTTP_TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
               405: "invalid_request_error", 413: "invalid_request_error", 422: "invalid_request_error",
               429: "rate_limit_error", 503: "service_unavailable"}


def error_body(message: str, type_: str, param: str | None = None, code: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def validation_message(errors: list[dict[str, Any]]) -> tuple[str, str | None]:
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


def to_response(exc: Exception) -> JSONResponse:
    """Map any exception to the HTTP response a client gets: the only such mapping."""
    if isinstance(exc, InferqError):
        headers = {"Retry-After": str(max(1, round(exc.retry_after)))} if exc.retry_after else {}
        if exc.status == 401:
            headers["WWW-Authenticate"] = "Bearer"
        return JSONResponse(error_body(exc.message, exc.type, exc.param, exc.code), exc.status, headers)
    if isinstance(exc, (RequestValidationError, ValidationError)):
        message, param = validation_message(list(exc.errors()))
        return JSONResponse(error_body(message, "invalid_request_error", param, "invalid_value"), 422)
    if isinstance(exc, (RedisConnectionError, RedisTimeoutError)):
        log.warning("Redis unavailable: %s", exc)
        return JSONResponse(error_body("the job store (Redis) is unavailable; retry shortly",
                                       "service_unavailable"), 503, {"Retry-After": "1"})
    if isinstance(exc, StarletteHTTPException):
        return JSONResponse(error_body(str(exc.detail), _HTTP_TYPES.get(exc.status_code, "error")),
                            exc.status_code, getattr(exc, "headers", None))
    log.exception("unhandled error", exc_info=exc)
    return JSONResponse(error_body("internal error", "internal_error"), 500)


def install(app: FastAPI) -> None:
    async def handler(_: Request, exc: Exception) -> JSONResponse:
        return to_response(exc)

    for exc_type in (InferqError, RequestValidationError, ValidationError, StarletteHTTPException, Exception):
        app.add_exception_handler(exc_type, handler)
