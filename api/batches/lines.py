"""A batch's lines: the input file's format check, each line's jobs, and its output line.

A line's body goes through the same parsing, checks and conversion as the endpoint it names
(``/v1/chat/completions``, ``/v1/completions`` or ``/v1/embeddings``), so a body that endpoint would refuse gets the
same status code and error body in the error file, and a line that runs gets the same response
body in the output file. ``stream`` is ignored: a batch line is answered whole.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Sequence
from dataclasses import dataclass

from pydantic import BaseModel, ValidationError

from inferq.api import openai as oc
from inferq.api.batches.schemas import BatchEndpoint, BatchError, InputLine, LineError, LineResponse, OutputLine
from inferq.api.errors import error_body, typed
from inferq.api.openai.embeddings import EmbeddingRequest
from inferq.api.openai.params import ChatCompletionRequest, CompletionRequest
from inferq.shared.errors import InferqError
from inferq.shared.jsonl import one_line
from inferq.shared.request_limits import check_limits
from inferq.shared.schemas import JobRequest
from inferq.shared.settings import Settings
from inferq.shared.store import Event

#: At most this many format errors are listed on a failed batch.
MAX_ERRORS = 100
_CODES = {"custom_id": "invalid_custom_id", "method": "invalid_method", "url": "invalid_url", "body": "invalid_body"}


def jsonl(lines_: Sequence[str]) -> bytes:
    """An output file from its lines (compact JSON each): one ``\\n``-ended line per answer, with the
    line breaks JSON leaves raw written as escapes (the same JSON, read back)."""
    return "".join(one_line(raw) + "\n" for raw in lines_).encode()


def check_file(text: str, endpoint: BatchEndpoint, max_lines: int) -> tuple[list[str], list[BatchError]]:
    """The input file's request lines (compact JSON), or its format errors: a batch with any
    fails before a job is queued. Blank lines are skipped; ``line`` numbers count every line."""
    good: list[str] = []
    errors: list[BatchError] = []
    seen: set[str] = set()
    # JSONL lines end at "\n" (str.splitlines would also cut at U+2028 and others, which JSON
    # strings may hold unescaped); a BOM and "\r\n" endings are accepted
    for n, raw in enumerate(text.removeprefix("\ufeff").split("\n"), 1):
        raw = raw.removesuffix("\r")
        if not raw.strip():
            continue
        if len(good) + len(errors) >= max_lines:
            return [], [BatchError(code="too_many_lines", line=n, message=f"the file has more than {max_lines} "
                                   "requests (INFERQ_MAX_BATCH_LINES)")]
        err = _check_line(raw, endpoint, seen)
        if isinstance(err, BatchError):
            err.line = n
            errors.append(err)
        else:
            good.append(err)
    if not good and not errors:
        errors.append(BatchError(code="empty_file", message="the file has no requests"))
    return (good, []) if not errors else ([], errors[:MAX_ERRORS])


def _check_line(raw: str, endpoint: BatchEndpoint, seen: set[str]) -> str | BatchError:
    try:
        obj = json.loads(raw)
    except (ValueError, RecursionError):  # RecursionError: nested too deeply to parse
        return BatchError(code="invalid_json_line", message="this line is not valid JSON")
    if not isinstance(obj, dict):
        return BatchError(code="invalid_json_line", message="this line is not a JSON object")
    if "custom_id" not in obj:
        return BatchError(code="missing_custom_id", param="custom_id", message="the line has no custom_id")
    try:
        line = InputLine.model_validate(obj)
    except ValidationError as e:
        first = e.errors()[0]
        field = ".".join(str(x) for x in first["loc"]) or None
        return BatchError(code=_CODES.get(field or "", "invalid_request"), param=field,
                          message=f"{field}: {first['msg']}" if field else first["msg"])
    if line.url != endpoint:
        return BatchError(code="mismatched_url", param="url",
                          message=f"url {line.url} is not the batch's endpoint {endpoint}")
    if line.custom_id in seen:
        return BatchError(code="duplicate_custom_id", param="custom_id",
                          message=f"custom_id {line.custom_id[:100]!r} is used by an earlier line")
    try:
        compact = line.model_dump_json()
    except ValueError as e:  # e.g. a lone surrogate escape ("\ud800") cannot be written as UTF-8
        return BatchError(code="invalid_request", message=f"this line cannot be stored as UTF-8 JSON: {e}"[:300])
    seen.add(line.custom_id)
    return compact


@dataclass
class Prepared:
    """A line as its endpoint reads it, and the jobs it becomes (one per prompt)."""

    line: InputLine
    chat: ChatCompletionRequest | None
    completion: CompletionRequest | None
    jobs: list[JobRequest]
    embedding: EmbeddingRequest | None = None

    @property
    def n(self) -> int:
        req = self.chat or self.completion
        return req.n if req is not None else 1


def prepare(raw: str, settings: Settings) -> Prepared:
    """The line's jobs, batch work at the batch priority; raises what its endpoint would answer instead."""
    line = InputLine.model_validate_json(raw)
    body = {k: v for k, v in line.body.items() if k not in ("stream", "stream_options")}
    chat = completion = embedding = None
    if line.url == "/v1/chat/completions":
        chat = ChatCompletionRequest.model_validate(body)
        oc.check_chat(chat, settings)
        jobs = [oc.chat_job(chat)]
    elif line.url == "/v1/embeddings":
        embedding = EmbeddingRequest.model_validate(line.body)
        jobs = [oc.embedding_job(embedding)]
    else:
        completion = CompletionRequest.model_validate(body)
        jobs = oc.completion_jobs(completion)
    jobs = [j.model_copy(update={"priority": settings.batch_priority, "service_class": "batch"}) for j in jobs]
    for j in jobs:
        check_limits(j, settings)
    return Prepared(line, chat, completion, jobs, embedding)


def line_id() -> str:
    return "batch_req_" + secrets.token_hex(12)


def refused(custom_id: str, exc: BaseException) -> OutputLine:
    """The error line of a request its endpoint refused (or whose job failed)."""
    err = typed(exc)
    body = json.loads(error_body(err).model_dump_json())
    return OutputLine(id=line_id(), custom_id=custom_id,
                      response=LineResponse(status_code=err.status, request_id="", body=body))


def unanswered(custom_id: str, code: str, message: str) -> OutputLine:
    """The error line of a request that never ran to the end (the batch was cancelled or expired)."""
    return OutputLine(id=line_id(), custom_id=custom_id, error=LineError(code=code, message=message))


def answered(prep: Prepared, job_ids: Sequence[str], model: str, logs: Sequence[list[Event]]) -> OutputLine:
    """The line's output: the endpoint's response body, from its jobs' event logs; the error line
    when a job failed."""
    body: BaseModel
    try:
        if prep.embedding is not None:
            got = next((v for ev in logs[0] if (v := oc.vectors_of(ev)) is not None), None)
            if got is None:
                raise InferqError("the job ended without its vectors")
            body = oc.embedding_response(job_ids[0], model, prep.embedding, got)
        else:
            parts = []
            for events in logs:
                c = oc.Collector(prep.n)
                for ev in events:
                    c.feed(ev)
                parts.append(c.out)
            if prep.chat is not None:
                body = oc.chat_response(job_ids[0], model, prep.chat, parts[0])
            else:
                assert prep.completion is not None
                body = oc.completion_response(job_ids[0], model, prep.completion, parts)
    except InferqError as e:
        out = refused(prep.line.custom_id, e)
        assert out.response is not None
        out.response.request_id = job_ids[0]
        return out
    return OutputLine(id=line_id(), custom_id=prep.line.custom_id,
                      response=LineResponse(status_code=200, request_id=job_ids[0],
                                            body=json.loads(body.model_dump_json())))


def custom_id_of(raw: str) -> str:
    return str(json.loads(raw)["custom_id"])

