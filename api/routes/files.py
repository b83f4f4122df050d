"""OpenAI's Files API, for batch input and output files (api/batches/files.py)."""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, File, Form, Query, UploadFile
from fastapi.responses import Response

from inferq.api.batches.schemas import FileDeleted, FileList, FileObject
from inferq.api.deps import Caller, Files
from inferq.shared.errors import InvalidRequest

router = APIRouter(prefix="/v1/files", tags=["batch"])


@router.post("", response_model=FileObject)
async def upload(files: Files, caller: Caller, file: Annotated[UploadFile, File()],
                 purpose: Annotated[str, Form()]) -> FileObject:
    """Upload a JSONL file with purpose ``batch`` (at most ``INFERQ_MAX_FILE_BYTES``)."""
    if purpose != "batch":
        raise InvalidRequest(f"purpose {purpose[:40]!r} is not supported; files here are batch input files "
                             "(purpose 'batch')", param="purpose")
    data = await file.read(files.max_bytes + 1)
    return await files.create(caller.key_id, "batch", file.filename or "input.jsonl", data)


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
