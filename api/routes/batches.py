"""OpenAI's Batch API, online: a batch's lines run as ordinary jobs at a low priority
(api/batches/runner.py)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from inferq.api.batches.schemas import Batch, BatchCreate, BatchList
from inferq.api.deps import Admit, Batches, Caller

router = APIRouter(prefix="/v1/batches", tags=["batch"])


@router.post("", response_model=Batch)
async def create_batch(req: BatchCreate, batches: Batches, caller: Caller, admission: Admit) -> Batch:
    """Run every request of ``input_file_id`` (a ``batch`` file); the batch starts ``validating``."""
    await admission.check_rate(caller.subject)  # the batch counts as one request against the rate limit
    return await batches.create(req, caller)


@router.get("", response_model=BatchList)
async def list_batches(batches: Batches, caller: Caller, limit: Annotated[int, Query(ge=1, le=100)] = 20,
                       after: str | None = None) -> BatchList:
    """The caller's batches, newest first; ``after`` continues after that batch id."""
    return await batches.list(caller, limit, after)


@router.get("/{batch_id}", response_model=Batch)
async def get_batch(batch_id: str, batches: Batches, caller: Caller) -> Batch:
    return await batches.get(batch_id, caller)


@router.post("/{batch_id}/cancel", response_model=Batch)
async def cancel_batch(batch_id: str, batches: Batches, caller: Caller) -> Batch:
    """Stop the batch: it is ``cancelling`` until its running requests are aborted, then ``cancelled``,
    with the requests that finished in its output file."""
    return await batches.cancel(batch_id, caller)
