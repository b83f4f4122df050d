"""REST jobs API: submit, poll, cancel."""

from __future__ import annotations

from fastapi import APIRouter

from api.deps import Service
from api.service import links
from shared.schemas import JobAccepted, JobRequest, JobView

router = APIRouter(prefix="/v1/jobs", tags=["jobs"])


@router.post("", status_code=202, response_model=JobAccepted)
async def submit(req: JobRequest, service: Service) -> JobAccepted:
    rec = await service.submit(req)
    return JobAccepted(id=rec.id, status=rec.status, model=rec.model, links=links(rec.id))


@router.get("/{job_id}", response_model=JobView)
async def get_job(job_id: str, service: Service) -> JobView:
    return await service.view(job_id)


@router.delete("/{job_id}", status_code=202, response_model=JobView)
async def cancel_job(job_id: str, service: Service) -> JobView:
    await service.cancel(job_id)
    return await service.view(job_id)
