"""OpenAI's Files API, for batch input and output files (api/batches/files.py)."""

from __future__ import annotations

import re
from typing import Annotated, Literal

from fastapi import APIRouter, File, Form, Query, UploadFile
from fastapi.responses import Response

from inferq.api.batches.schemas import MAX_EXPIRY_S, MIN_EXPIRY_S, FileDeleted, FileList, FileObject
from inferq.api.deps import Caller, Files
from inferq.shared.errors import InvalidRequest

router = APIRouter(prefix="/v1/files", tags=["batch"])


@router.post("", response_model=FileObject)
async def upload(files: Files, caller: Caller, file: Annotated[UploadFile, File()],
                 purpose: Annotated[str, Form()],
                 anchor: Annotated[str | None, Form(alias="expires_after[anchor]")] = None,
                 seconds: Annotated[str | None, Form(alias="expires_after[seconds]")] = None) -> FileObject:
    """Upload a JSONL file with purpose ``batch`` (at most ``INFERQ_MAX_FILE_BYTES``). It expires
    ``expires_after[seconds]`` after its upload (``expires_after[anchor]``: ``created_at``), or
    ``INFERQ_FILE_TTL_S`` (30 days) after it unless that is 0."""
    if purpose != "batch":
        raise InvalidRequest(f"purpose {purpose[:40]!r} is not supported; files here are batch input files "
                             "(purpose 'batch')", param="purpose")
    ttl = _expiry(anchor, seconds) if anchor is not None or seconds is not None else files.ttl_s or None
    data = await file.read(files.max_bytes + 1)
    return await files.create(caller.key_id, "batch", file.filename or "input.jsonl", data, ttl_s=ttl)


def _expiry(anchor: str | None, seconds: str | None) -> int:
    """The seconds of a form's ``expires_after``, as :class:`ExpiresAfter` bounds them; 400 naming
    the field otherwise."""
    if anchor != "created_at":
        raise InvalidRequest("expires_after[anchor]: must be 'created_at'", param="expires_after[anchor]")
    if seconds is None or not re.fullmatch(r"[0-9]{1,9}", seconds) or not MIN_EXPIRY_S <= int(seconds) <= MAX_EXPIRY_S:
        raise InvalidRequest(f"expires_after[seconds]: must be an integer from {MIN_EXPIRY_S} to {MAX_EXPIRY_S}",
                             param="expires_after[seconds]")
    return int(seconds)


@router.get("", response_model=FileList)
async def list_files(files: Files, caller: Caller, purpose: str | None = None,
                     limit: Annotated[int, Query(ge=1, le=10_000)] = 10_000, after: str | None = None,
                     order: Literal["asc", "desc"] = "desc") -> FileList:
    """The caller's files, newest first (``order=asc``: oldest first)."""
    return await files.list(caller, purpose, limit, after, newest_first=order == "desc")


@router.get("/{file_id}", response_model=FileObject)
async def get_file(file_id: str, files: Files, caller: Caller) -> FileObject:
    return await files.get(file_id, caller)


@router.get("/{file_id}/content")
async def file_content(file_id: str, files: Files, caller: Caller) -> Response:
    return Response(await files.content(file_id, caller), media_type="application/jsonl")


@router.delete("/{file_id}", response_model=FileDeleted)
async def delete_file(file_id: str, files: Files, caller: Caller) -> FileDeleted:
    await files.delete(file_id, caller)
    return FileDeleted(id=file_id)
