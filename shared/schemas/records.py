"""A job in Redis and on the API: the Celery task payload (:class:`JobMessage`), the record
(:class:`JobRecord`, a Redis hash) and what ``GET /v1/jobs/{id}`` returns (:class:`JobView`)."""

from __future__ import annotations

import json
import time
from enum import Enum
from typing import Any

from pydantic import BaseModel, Field

from inferq.shared.schemas.events import ChoiceEnd, ErrorInfo, Usage
from inferq.shared.schemas.jobs import JobRequest, JobStatus


class AdapterRef(BaseModel):
    """A LoRA adapter a job runs with: its name (what the client sent as ``model``) and the folder
    its worker loads it from."""

    name: str
    path: str
    id: int = Field(default=0, description="Its id in the engine (the registry's, unique in the fleet); 0: from a "
                    "registry written before ids, derived from name and path.")


class Resume(BaseModel):
    """What a job handed back with its progress kept has produced (its one completion): the next
    attempt continues from it, the tokens as the end of its prompt, instead of starting over
    (worker/jobs/resume.py). Written in the record (``resume``) by the hand-back, read by the claim."""

    ids: list[int] = Field(description="The completion's token ids so far.")
    text: str = Field(description="Their text, as the job's stream carried it.")


class JobMessage(BaseModel):
    """The Celery task payload: everything a worker needs to run the job."""

    id: str
    model: str
    request: JobRequest
    created_at: float
    deadline: float | None = None
    traceparent: str | None = Field(default=None, description="W3C trace context of the submission (tracing on).")
    prompt_ids: list[int] | None = Field(default=None, description="The prompt's token ids as the gateway "
                                         "tokenized it, where its tokenizing is the worker's "
                                         "(shared/prompt_probe.py); None: the worker tokenizes the prompt.")
    adapter: AdapterRef | None = Field(default=None, description="The LoRA adapter the job runs with; None: "
                                       "the base model.")
    passed_by: str | None = Field(default=None, description="The worker that passed the job to this one's lane "
                                  "(cache-affine pull, worker/jobs/affinity.py): it is run, never passed again.")
    tenant: str | None = Field(default=None, description="The tenant whose fair share the job takes "
                               "(shared/fairshare.py); None: a message sent before tenants were named.")
    tenant_weight: float | None = Field(default=None, gt=0, description="The tenant's weight when the job was "
                                        "submitted (its share of a worker's interactive reserve); None: 1.")


class ChoiceView(ChoiceEnd):
    """A choice as the job's record keeps it: how it ended, and its text."""

    text: str


class ResponseOptions(BaseModel):
    """What a ``/v1/responses`` request said that its job does not otherwise keep, so that the
    response reads back as it was created."""

    background: bool = False
    previous_response_id: str | None = None


class JobRecord(BaseModel):
    """The job's Redis hash. Every field is stored as a string; JSON-valued ones are JSON."""

    id: str
    model: str
    status: JobStatus = JobStatus.queued
    request: JobRequest
    created_at: float = Field(default_factory=time.time)
    started_at: float | None = None
    first_token_at: float | None = None
    finished_at: float | None = None
    worker: str | None = None
    finish_reason: str | None = None
    choices: list[ChoiceView] | None = None
    usage: Usage | None = None
    error: ErrorInfo | None = None
    cancel_requested: bool = False
    attempt: int = Field(default=0, description="Runs started so far; fences out a lost worker.")
    deadline: float | None = Field(default=None, description="Unix time after which the job is abandoned.")
    owner: str | None = Field(default=None, description="Hash id of the API key that submitted it.")
    traceparent: str | None = Field(default=None, description="W3C trace context of the submission.")
    adapter: AdapterRef | None = Field(default=None, description="The LoRA adapter the job runs with "
                                       "(``model`` is then its base model, whose queue the job is on).")
    response: ResponseOptions | None = Field(default=None, description="A response's own options (the job "
                                             "of a ``/v1/responses`` request); None for any other job.")
    tenant: str | None = Field(default=None, description="The tenant whose fair share the job takes (an API "
                               "key, or the tenant= its keys-file line names; shared/fairshare.py).")
    tenant_weight: float | None = Field(default=None, gt=0, description="The tenant's weight when the job was "
                                        "submitted; None: 1.")

    @property
    def served_name(self) -> str:
        """The name the job's answers carry as ``model``: its adapter's, else its model's (as vLLM)."""
        return self.adapter.name if self.adapter is not None else self.model

    def message(self, prompt_ids: list[int] | None = None) -> JobMessage:
        """The Celery task payload that (re-)sends this job to a worker (with the prompt's token ids
        where the gateway tokenized it; a job re-sent from its record is tokenized by the worker)."""
        return JobMessage(id=self.id, model=self.model, request=self.request, created_at=self.created_at,
                          deadline=self.deadline, traceparent=self.traceparent, prompt_ids=prompt_ids,
                          adapter=self.adapter, tenant=self.tenant, tenant_weight=self.tenant_weight)

    def to_hash(self) -> dict[str, str]:
        return hash_fields(**self.model_dump(mode="json", exclude_none=True))

    @classmethod
    def from_hash(cls, h: dict[str, str]) -> JobRecord:
        return cls.model_validate({k: json.loads(v) for k, v in h.items() if k in cls.model_fields})


def hash_fields(**values: Any) -> dict[str, str]:
    """Encode fields for the job hash: every value is stored as JSON (a str as a JSON string)."""
    return {k: json.dumps(v.model_dump(mode="json") if isinstance(v, BaseModel) else
                          v.value if isinstance(v, Enum) else v) for k, v in values.items()}


class JobLinks(BaseModel):
    self: str
    stream: str


class JobAccepted(BaseModel):
    id: str
    status: JobStatus
    model: str
    links: JobLinks


class JobView(BaseModel):
    """Body of ``GET /v1/jobs/{id}``."""

    id: str
    model: str
    status: JobStatus
    text: str
    choices: list[ChoiceView]
    finish_reason: str | None
    usage: Usage | None
    created_at: float
    started_at: float | None
    first_token_at: float | None
    finished_at: float | None
    worker: str | None = Field(default=None, description="The worker that ran the job.")
    error: ErrorInfo | None
    links: JobLinks
