"""REST jobs API: submit, poll, cancel."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Body, Header, Response

from inferq.api.admission import fingerprint
from inferq.api.deps import Admit, Caller, Service
from inferq.api.service import links
from inferq.shared.schemas import JobAccepted, JobRequest, JobView

router = APIRouter(prefix="/v1/jobs", tags=["jobs"])
EXAMPLES = {
    "prompt": {"value": {"prompt": "def fibonacci(n):", "max_tokens": 32, "temperature": 0}},
    "chat": {"value": {"messages": [{"role": "user", "content": "Say hi"}], "max_tokens": 16}},
    "sampled": {"value": {"prompt": "Once", "max_tokens": 8, "n": 2, "temperature": 0.8, "stop": ["\n"]}},
}


@router.post("", status_code=202, response_model=JobAccepted)
async def submit(req: Annotated[JobRequest, Body(openapi_examples=EXAMPLES)], caller: Caller,
                 admission: Admit, response: Response,
                 idempotency_key: Annotated[str | None, Header(alias="Idempotency-Key")] = None) -> JobAccepted:
    """Queue a job. A repeated ``Idempotency-Key`` returns the job the first request created."""
    got = await admission.submit(caller, [req], idempotency_key=idempotency_key,
                                 fingerprint=lambda: fingerprint("jobs", req.model_dump(mode="json")))
    rec = got.records[0]
    if got.replayed:
        response.headers["Idempotent-Replayed"] = "true"
    return JobAccepted(id=rec.id, status=rec.status, model=rec.served_name, links=links(rec.id))


@router.get("/{job_id}", response_model=JobView)
async def get_job(job_id: str, service: Service, caller: Caller) -> JobView:
    return await service.view(job_id, caller)


@router.delete("/{job_id}", status_code=202, response_model=JobView)
async def cancel_job(job_id: str, service: Service, caller: Caller) -> JobView:
    await service.cancel(job_id, caller)
    return await service.view(job_id, caller)
