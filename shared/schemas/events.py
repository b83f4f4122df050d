"""The events a job emits (:data:`StreamEvent`: ``token | done | error | restart | loading``), each with a
per-job ``seq`` that starts at 1 and grows by one; the WebSocket's own messages."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field, TypeAdapter, model_serializer, model_validator

from inferq.shared.errors import ErrorType, InferqError, classify
from inferq.shared.schemas.jobs import JobStatus


class Usage(BaseModel):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0


class ErrorInfo(BaseModel):
    """Why a job failed, as its record and its ``error`` event store it (docs/errors.md): the same
    ``type``/``code`` a client gets over HTTP. Records written before types and codes were kept
    apart (only ``type``, holding a code) are read into today's form."""

    type: ErrorType = Field(description="The class of failure; each has one HTTP status.")
    code: str | None = Field(default=None, description="The specific reason, e.g. deadline_exceeded.")
    message: str
    param: str | None = Field(default=None, description="The request field at fault, if one is.")

    @model_validator(mode="before")
    @classmethod
    def _legacy(cls, v: Any) -> Any:
        if isinstance(v, dict) and isinstance(v.get("type"), str):
            type_, code = classify(v["type"], v.get("code"))
            v = {**v, "type": type_, "code": code}
        return v

    @model_serializer  # no return annotation: the schema stays the fields'
    def _every_key(self):  # type: ignore[no-untyped-def]
        """All four keys, ``null`` included, whatever ``exclude_none`` says: the shape is fixed."""
        return {"type": self.type, "code": self.code, "message": self.message, "param": self.param}

    @classmethod
    def of(cls, err: InferqError) -> ErrorInfo:
        return cls(type=err.type, code=err.code, message=err.message, param=err.param)


class TopLogprob(BaseModel):
    token: str
    logprob: float


class TokenLogprob(BaseModel):
    token: str
    logprob: float | None = Field(default=None, description="None (left out) for an echoed prompt's first "
                                  "token, which has none.")
    top_logprobs: list[TopLogprob] = Field(default_factory=list)


class PromptLogprob(BaseModel):
    """One token's log-prob at a prompt position, as vLLM's ``Logprob`` (its ``prompt_logprobs``)."""

    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


#: Per prompt position (the first has none: null), token id -> its log-prob; vLLM's shape.
PromptLogprobs = list[dict[str, PromptLogprob] | None]


class ToolCallPiece(BaseModel):
    """A streamed piece of a tool call found by the worker's parser: the first piece of a call has
    its ``id`` and ``name``; the rest add to ``arguments``."""

    index: int
    id: str | None = None
    name: str | None = None
    arguments: str | None = None


class TokenEvent(BaseModel):
    type: Literal["token"] = "token"
    seq: int
    index: int = Field(default=0, description="Which completion (0..n-1) the text belongs to.")
    text: str
    n_tokens: int = 0
    logprobs: list[TokenLogprob] | None = None
    tool_calls: list[ToolCallPiece] | None = Field(default=None, description="Tool calls the worker's parser "
                                                   "found in these tokens (`text` is then what is not a call).")
    prompt_logprobs: PromptLogprobs | None = Field(default=None, description="The prompt's log-probs "
                                                   "(`prompt_logprobs`), once, in an event of their own "
                                                   "(empty `text`, before the tokens that follow them).")


class ChoiceEnd(BaseModel):
    index: int
    finish_reason: str | None = None
    stop_reason: str | int | None = Field(default=None, description="The stop string or stop token id "
                                          "that ended the choice, as vLLM's server says it.")


class DoneEvent(BaseModel):
    type: Literal["done"] = "done"
    seq: int
    status: Literal[JobStatus.succeeded, JobStatus.cancelled] = JobStatus.succeeded
    finish_reason: str | None = None
    choices: list[ChoiceEnd] = Field(default_factory=list)
    usage: Usage = Field(default_factory=Usage)
    embeddings: list[str] | None = Field(default=None, description="An embedding job's vectors in input "
                                         "order, each its float32 values, little-endian, in base64.")
    embedding_tokens: list[int] | None = Field(default=None, description="An embedding job's prompt tokens "
                                               "per input, in input order (what each input was embedded from).")


class ErrorEvent(BaseModel):
    type: Literal["error"] = "error"
    seq: int
    error: ErrorInfo


class RestartEvent(BaseModel):
    """The attempt that produced the tokens so far was lost (its worker died, drained or lost its
    engine); generation starts again from scratch. Clients discard the text received so far."""

    type: Literal["restart"] = "restart"
    seq: int
    attempt: int = Field(description="The attempt that was lost (1 = the first run).")
    reason: str


class LoadingEvent(BaseModel):
    """The job was queued for a model that no worker holds awake, while workers that can wake it hold
    it asleep: it waits in the queue until one of them has woken the model (docs/design.md, "Workers
    that follow demand"). Written once, before any other event of the job; informational (nothing
    to discard)."""

    type: Literal["loading"] = "loading"
    seq: int
    model: str
    expected_s: float | None = Field(default=None, description="Seconds until a worker is expected to have "
                                     "the model awake, from those workers' recent wakes and what they hold now; "
                                     "null: no estimate yet (the model was never woken on them).")
    bound_s: float | None = Field(default=None, description="The longest such a wait should last: those workers' "
                                  "INFERQ_SWAP_MAX_WAIT_S plus a wake (null: no estimate of a wake yet).")


StreamEvent = Annotated[TokenEvent | DoneEvent | ErrorEvent | RestartEvent | LoadingEvent,
                        Field(discriminator="type")]
_EVENT = TypeAdapter(StreamEvent)


def parse_event(data: str | bytes) -> TokenEvent | DoneEvent | ErrorEvent | RestartEvent | LoadingEvent:
    """Decode one event from its JSON form."""
    return _EVENT.validate_json(data)


class AcceptedMessage(BaseModel):
    """First message on ``WS /v1/generate``: the id the job got (not part of the job's log)."""

    type: Literal["accepted"] = "accepted"
    id: str
    model: str


class ControlMessage(BaseModel):
    """Published on the control channel; every worker holding ``job_id`` acts on it."""

    type: Literal["cancel"] = "cancel"
    job_id: str
