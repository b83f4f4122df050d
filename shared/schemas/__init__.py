"""Every message that crosses Redis or the public API, as pydantic models (JSON on the wire).

- :class:`JobRequest` is what a client submits to ``POST /v1/jobs`` (and what the OpenAI routes
  translate to); :class:`JobMessage` is the Celery task payload.
- :data:`StreamEvent` is the tagged union of events a job emits (``token | done | error``), each
  with a per-job ``seq`` that starts at 1 and grows by one.
- :class:`JobRecord` is the job's Redis hash; :class:`JobView` is what ``GET /v1/jobs/{id}`` returns.

The models live in four modules: ``jobs`` (the request and the statuses), ``events`` (what a job
emits), ``records`` (the task payload, the record, the view) and ``fleet`` (workers and adapters);
import them from here.
"""

from __future__ import annotations

from inferq.shared.schemas.events import (
    AcceptedMessage,
    ChoiceEnd,
    ControlMessage,
    DoneEvent,
    ErrorEvent,
    ErrorInfo,
    LoadingEvent,
    PromptLogprob,
    PromptLogprobs,
    RestartEvent,
    StreamEvent,
    TokenEvent,
    TokenLogprob,
    ToolCallPiece,
    TopLogprob,
    Usage,
    parse_event,
)
from inferq.shared.schemas.fleet import (
    AdapterCommand,
    AdapterHomes,
    AdapterInfo,
    AdapterReply,
    ClassesInfo,
    EngineStats,
    ModelSlot,
    ModelState,
    SwapperInfo,
    SwapRecord,
    WorkerInfo,
)
from inferq.shared.schemas.jobs import (
    DEFAULT_PRIORITY,
    NO_CONTROL_CHARS,
    SERVICE_CLASSES,
    STREAM_INTERVAL_MAX,
    STRUCTURE_MAX_CHARS,
    TERMINAL_STATUSES,
    ChatMessage,
    JobRequest,
    JobStatus,
    SamplingOptions,
    ServiceClass,
    ToolCall,
    ToolCallFunction,
)
from inferq.shared.schemas.records import (
    AdapterRef,
    ChoiceView,
    JobAccepted,
    JobLinks,
    JobMessage,
    JobRecord,
    JobView,
    ResponseOptions,
    Resume,
    hash_fields,
)

__all__ = [
    "AcceptedMessage", "AdapterCommand", "AdapterHomes", "AdapterInfo", "AdapterRef", "AdapterReply", "ChatMessage",
    "ChoiceEnd",
    "ChoiceView", "ClassesInfo", "ControlMessage", "DEFAULT_PRIORITY", "DoneEvent", "EngineStats", "ErrorEvent",
    "ErrorInfo", "hash_fields", "JobAccepted", "JobLinks", "JobMessage", "JobRecord", "JobRequest", "JobStatus",
    "JobView", "LoadingEvent", "ModelSlot", "ModelState", "NO_CONTROL_CHARS", "parse_event", "PromptLogprob",
    "PromptLogprobs", "ResponseOptions", "RestartEvent", "Resume", "SamplingOptions", "SERVICE_CLASSES", "ServiceClass",
    "StreamEvent", "STREAM_INTERVAL_MAX", "STRUCTURE_MAX_CHARS", "SwapperInfo", "SwapRecord", "TERMINAL_STATUSES",
    "TokenEvent",
    "TokenLogprob", "ToolCall", "ToolCallFunction", "ToolCallPiece", "TopLogprob", "Usage", "WorkerInfo"
]
