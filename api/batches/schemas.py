"""Wire messages of the Files and Batch APIs, in OpenAI's shapes, and the stored batch record."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

BatchEndpoint = Literal["/v1/chat/completions", "/v1/completions", "/v1/embeddings"]
BatchStatus = Literal["validating", "failed", "in_progress", "finalizing", "completed", "expired",
                      "cancelling", "cancelled"]
#: Statuses a batch does not leave.
ENDED: frozenset[str] = frozenset({"failed", "completed", "expired", "cancelled"})
FilePurpose = Literal["batch", "batch_output"]


class FileObject(BaseModel):
    id: str
    object: Literal["file"] = "file"
    bytes: int
    created_at: int
    filename: str
    purpose: FilePurpose
    status: Literal["processed"] = "processed"
    expires_at: int | None = None
    status_details: str | None = None


class FileList(BaseModel):
    object: Literal["list"] = "list"
    data: list[FileObject]
    first_id: str | None = None
    last_id: str | None = None
    has_more: bool = False


class FileDeleted(BaseModel):
    id: str
    object: Literal["file"] = "file"
    deleted: bool = True


def _check_metadata(value: dict[str, str] | None) -> dict[str, str] | None:
    """OpenAI's limits on ``metadata``: 16 pairs, keys up to 64 and values up to 512 characters."""
    if value is None:
        return None
    if len(value) > 16:
        raise ValueError(f"at most 16 pairs (got {len(value)})")
    for k, v in value.items():
        if len(k) > 64:
            raise ValueError(f"key {k[:70]!r}... is longer than 64 characters")
        if len(v) > 512:
            raise ValueError(f"the value of {k!r} is longer than 512 characters")
    return value


#: The shortest and longest expiry a file may be given (OpenAI's limits).
MIN_EXPIRY_S, MAX_EXPIRY_S = 3600, 30 * 86400


class ExpiresAfter(BaseModel):
    """When a file expires: ``seconds`` after its ``anchor`` (its creation)."""

    model_config = ConfigDict(extra="forbid")
    anchor: Literal["created_at"]
    seconds: int = Field(ge=MIN_EXPIRY_S, le=MAX_EXPIRY_S)


class BatchCreate(BaseModel):
    """``POST /v1/batches``."""

    model_config = ConfigDict(extra="forbid")
    input_file_id: str = Field(max_length=64)
    endpoint: BatchEndpoint
    completion_window: Literal["24h"]
    metadata: dict[str, str] | None = None
    output_expires_after: ExpiresAfter | None = None  # of its output and error files

    _metadata = field_validator("metadata")(_check_metadata)


class BatchError(BaseModel):
    code: str
    message: str
    param: str | None = None
    line: int | None = None  # 1-based line of the input file


class BatchErrors(BaseModel):
    object: Literal["list"] = "list"
    data: list[BatchError]


class RequestCounts(BaseModel):
    total: int = 0
    completed: int = 0
    failed: int = 0


class Batch(BaseModel):
    id: str
    object: Literal["batch"] = "batch"
    endpoint: BatchEndpoint
    errors: BatchErrors | None = None
    input_file_id: str
    completion_window: Literal["24h"] = "24h"
    status: BatchStatus = "validating"
    output_file_id: str | None = None
    error_file_id: str | None = None
    created_at: int
    in_progress_at: int | None = None
    expires_at: int
    finalizing_at: int | None = None
    completed_at: int | None = None
    failed_at: int | None = None
    expired_at: int | None = None
    cancelling_at: int | None = None
    cancelled_at: int | None = None
    request_counts: RequestCounts = Field(default_factory=RequestCounts)
    metadata: dict[str, str] | None = None


class BatchList(BaseModel):
    object: Literal["list"] = "list"
    data: list[Batch]
    first_id: str | None = None
    last_id: str | None = None
    has_more: bool = False


class BatchRecord(BaseModel):
    """What Redis keeps of a batch: the object clients see, and the runner's own fields."""

    batch: Batch
    owner: str | None  # the API key's id; None when auth is off
    subject: str  # whom the batch's jobs count against (api.auth.Principal.subject)
    ending: Literal["cancelled", "expired"] | None = None  # set once the batch is being stopped
    aborted: bool = False  # its unfinished jobs were told to stop
    # what its lines' job ids are made from (api/batches/runner.py: line_job_ids); None in batches
    # created before it existed: their id stands in
    secret: str | None = None
    output_ttl_s: int | None = None  # its output and error files expire this long after they are written


class InputLine(BaseModel):
    """One request of a batch's input file (its body is checked as the endpoint checks it)."""

    model_config = ConfigDict(extra="forbid")
    custom_id: str = Field(min_length=1, max_length=512)
    method: Literal["POST"]
    url: BatchEndpoint
    body: dict[str, Any]


class LineResponse(BaseModel):
    status_code: int
    request_id: str  # the job id (of the first job, for several prompts): GET /v1/jobs/{id} shows it
    body: dict[str, Any]


class LineError(BaseModel):
    code: str
    message: str


class OutputLine(BaseModel):
    """One line of a batch's output file (status 200) or error file (any other, or no response)."""

    id: str
    custom_id: str
    response: LineResponse | None = None
    error: LineError | None = None
