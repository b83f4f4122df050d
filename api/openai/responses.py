"""OpenAI's Responses API (``/v1/responses``) on the queue: a response is a job.

- A response's id is its job's (``resp_<hex>`` for ``job-<hex>``), so ``GET /v1/responses/{id}``
  reads the job record, and a response lives as long as the job (``INFERQ_JOB_TTL_S``).
- ``instructions`` become the job's system text (not carried to a follow-up, as OpenAI's);
  ``previous_response_id`` puts that response's conversation and answer before the new input.
- ``background: true`` answers at once (``queued``); the client polls, or streams. What the
  request said that a job does not keep (``background``, ``previous_response_id``) is kept on its
  record (``JobRecord.response``), so a response reads back as it was created.
- Streams are made from the job's event log, one ``response.output_text.delta`` per token event,
  numbered from 0 the same way every time: ``GET /v1/responses/{id}?stream=true&starting_after=N``
  replays exactly the events after ``N``, however often, from any gateway.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from inferq.api.openai.params import NullIsDefault, ServiceTier, tier_class
from inferq.api.openai.sent_events import sent_batches
from inferq.api.sse import Payload
from inferq.api.streams import StreamHub
from inferq.shared.errors import InvalidRequest, NotFound, error_from
from inferq.shared.keys import MODEL_NAME_PATTERN
from inferq.shared.schemas import ChatMessage, ErrorEvent, JobRecord, JobRequest, JobStatus, RestartEvent

RESPONSE_ID_PATTERN = r"^resp_[0-9a-f]{32}$"


class InputText(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["input_text", "output_text"]
    text: str
    annotations: list[Any] | None = None  # an earlier output sent back as it came


class InputMessage(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["message"] = "message"
    role: Literal["user", "system", "developer", "assistant"]
    content: str | Annotated[list[InputText], Field(min_length=1, max_length=256)]
    id: str | None = Field(default=None, max_length=128)  # an earlier output item sent back as it came
    status: str | None = Field(default=None, max_length=32)

    def chat(self) -> ChatMessage:
        text = self.content if isinstance(self.content, str) else "".join(p.text for p in self.content)
        return ChatMessage(role="system" if self.role == "developer" else self.role, content=text)


class TextFormat(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["text"]


class TextConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    format: TextFormat | None = None


class ResponsesRequest(NullIsDefault):
    """What inferq serves of ``POST /v1/responses``; anything else is a 400 naming it."""

    model_config = ConfigDict(extra="forbid")
    model: str | None = Field(default=None, min_length=1, max_length=256, pattern=MODEL_NAME_PATTERN)
    input: str | Annotated[list[InputMessage], Field(min_length=1, max_length=1024)]
    instructions: str | None = Field(default=None, max_length=200_000)
    max_output_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    stream: bool = False
    background: bool = False
    previous_response_id: str | None = Field(default=None, pattern=RESPONSE_ID_PATTERN)
    store: bool = Field(default=True, description="Accepted; a response is always kept as its job is.")
    metadata: dict[Annotated[str, Field(max_length=64)], Annotated[str, Field(max_length=512)]] | None = \
        Field(default=None, max_length=16)
    user: str | None = Field(default=None, max_length=256)
    text: TextConfig | None = None
    tools: list[Any] | None = Field(default=None, max_length=0, description="Empty only: tools are not "
                                    "served on /v1/responses yet (use /v1/chat/completions).")
    tool_choice: Literal["none", "auto"] | None = None
    parallel_tool_calls: bool | None = None
    include: list[str] | None = Field(default=None, max_length=0, description="Empty only.")
    truncation: Literal["disabled"] | None = None
    service_tier: ServiceTier | None = Field(default=None, description="'flex': batch work, run on the "
                                             "capacity interactive work leaves (not with stream).")

    def job(self, history: list[ChatMessage]) -> JobRequest:
        """The job: ``history`` (a previous response's conversation), then the input."""
        given = [ChatMessage(role="user", content=self.input)] if isinstance(self.input, str) \
            else [m.chat() for m in self.input]
        fields: dict[str, Any] = {k: v for k, v in (("max_tokens", self.max_output_tokens), ("temperature",
                                  self.temperature), ("top_p", self.top_p)) if v is not None}
        return JobRequest(messages=[*history, *given], instructions=self.instructions, model=self.model,
                          user=self.user, metadata=self.metadata, **fields, **tier_class(self.service_tier))


def response_id(job_id: str) -> str:
    return "resp_" + job_id.removeprefix("job-")


def not_found(resp_id: str, param: str = "response_id") -> NotFound:
    """The 404 of a response id that names no response the caller may see (``param``: the field
    that held it)."""
    return NotFound(f"no response {resp_id[:80]!r}", param=param, code="response_not_found")


def job_id(resp_id: str, param: str = "response_id") -> str:
    """The job of a response id; 404 for anything that is not one."""
    if not resp_id.startswith("resp_") or len(resp_id) != 37:
        raise not_found(resp_id, param)
    return "job-" + resp_id.removeprefix("resp_")


def history(rec: JobRecord) -> list[ChatMessage]:
    """A finished response's conversation (without its instructions) and its answer."""
    if not rec.status.terminal:
        raise InvalidRequest(
            f"previous_response_id {response_id(rec.id)!r} has not finished yet", param="previous_response_id")
    text = rec.choices[0].text if rec.choices else ""
    return [*(rec.request.messages or []), ChatMessage(role="assistant", content=text)]


_STATUS = {JobStatus.queued: "queued", JobStatus.running: "in_progress", JobStatus.succeeded: "completed",
           JobStatus.failed: "failed", JobStatus.cancelled: "cancelled"}


def status_of(status: JobStatus) -> str:
    """A job status as a response's."""
    return _STATUS[status]


def response(rec: JobRecord, text: str | None = None, status: str | None = None) -> dict[str, Any]:
    """The Response object of a job (``text``/``status``: as a stream has them so far)."""
    req, hexid, opts = rec.request, rec.id.removeprefix("job-"), rec.response
    text = text if text is not None else (rec.choices[0].text if rec.choices else "")
    status = status or _STATUS[rec.status]
    done = rec.status.terminal or status == "cancelled"
    incomplete = None
    if status == "completed" and rec.finish_reason == "length":
        status, incomplete = "incomplete", {"reason": "max_output_tokens"}
    usage = None
    if rec.usage is not None:
        u = rec.usage
        usage = {"input_tokens": u.prompt_tokens, "input_tokens_details": {"cached_tokens": 0},
                 "output_tokens": u.completion_tokens, "output_tokens_details": {"reasoning_tokens": 0},
                 "total_tokens": u.total_tokens}
    # a message item is completed, incomplete (cut short: max_output_tokens, failed, cancelled) or in progress
    item_status = "completed" if status == "completed" else "incomplete" if done else "in_progress"
    output = [] if status == "queued" else [{
        "type": "message", "id": f"msg_{hexid}", "status": item_status, "role": "assistant",
        "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": None}]}]
    err = rec.error
    return {
        "id": response_id(rec.id), "object": "response", "created_at": int(rec.created_at), "status": status,
        "model": rec.served_name, "output": output, "instructions": req.instructions,
        "max_output_tokens": req.max_tokens, "temperature": req.temperature, "top_p": req.top_p,
        "previous_response_id": opts.previous_response_id if opts else None, "metadata": req.metadata or {},
        "user": req.user, "parallel_tool_calls": True, "tool_choice": "auto", "tools": [],
        "text": {"format": {"type": "text"}}, "truncation": "disabled",
        "background": opts.background if opts else None,
        "service_tier": "flex" if req.service_class == "batch" else "default",
        "incomplete_details": incomplete, "usage": usage,
        "error": {"code": err.code or err.type, "message": err.message} if err is not None and done else None,
    }


def _last(p: Payload | None) -> Payload | None:
    return p._replace(last=True) if p is not None else None


def _event(kind: str, seq: int, **fields: Any) -> Payload:
    return Payload(json.dumps({"type": kind, "sequence_number": seq, **fields}), event=kind)


async def stream_events(hub: StreamHub, rec: JobRecord, after: int = -1,
                        finished: Any = None) -> AsyncIterator[Payload]:
    """The response's stream events with ``sequence_number`` above ``after``. ``finished()``
    (async) reads the record again for the final response object."""
    item = f"msg_{rec.id.removeprefix('job-')}"
    seq, text = -1, ""

    def nxt(kind: str, **fields: Any) -> Payload | None:
        nonlocal seq
        seq += 1
        return _event(kind, seq, **fields) if seq > after else None

    pending = [nxt("response.created", response=response(rec, "", "queued")),
               nxt("response.in_progress", response=response(rec, "", "in_progress")),
               nxt("response.output_item.added", output_index=0, item={
                   "type": "message", "id": item, "status": "in_progress", "role": "assistant", "content": []}),
               nxt("response.content_part.added", item_id=item, output_index=0, content_index=0,
                   part={"type": "output_text", "text": "", "annotations": []})]
    for p in pending:
        if p is not None:
            yield p
    # one event per token, never merged: a resumed stream counts the same sequence numbers
    async for events in sent_batches(hub, rec.id, merge=False):
        for ev in events:
            if ev.type == "token":
                text += ev.text
                if (p := nxt("response.output_text.delta", item_id=item, output_index=0, content_index=0,
                             delta=ev.text, logprobs=[])) is not None:
                    yield p
                continue
            ends = (_done_events(nxt, item, text, await finished()) if ev.type == "done"
                    else [_failed_event(nxt, ev, await finished())])  # failed, or restarted after text went out
            for p in ends:
                if p is not None:
                    yield p
            return


def _done_events(nxt: Callable[..., Payload | None], item: str, text: str,
                 final: dict[str, Any]) -> list[Payload | None]:
    """The events that end a response that ran to its end (``final``: the response object), from
    ``nxt`` (None: at or before the resumed position)."""
    part = {"type": "output_text", "text": text, "annotations": []}
    return [nxt("response.output_text.done", item_id=item, output_index=0, content_index=0, text=text, logprobs=[]),
            nxt("response.content_part.done", item_id=item, output_index=0, content_index=0, part=part),
            nxt("response.output_item.done", output_index=0, item={
                "type": "message", "id": item, "role": "assistant", "content": [part],
                "status": "completed" if final["status"] == "completed" else "incomplete"}),
            # response.completed, response.incomplete (max_output_tokens) or response.cancelled
            _last(nxt(f"response.{final['status']}", response=final))]


def _failed_event(nxt: Callable[..., Payload | None], ev: ErrorEvent | RestartEvent,
                  final: dict[str, Any]) -> Payload | None:
    """The event that ends a response whose job failed, or restarted after its text went out."""
    err = error_from(ev.error) if ev.type == "error" else None
    return _last(nxt("response.failed", response={**final, "status": "failed", "error": {
        "code": err.code if err else "restarted", "message": str(err.message if err else
        "the job was restarted on another worker; read it again with GET /v1/responses/{id}")}}))
