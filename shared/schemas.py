"""Every message that crosses Redis or the public API, as pydantic models (JSON on the wire).

- :class:`JobRequest` is what a client submits to ``POST /v1/jobs`` (and what the OpenAI routes
  translate to); :class:`JobMessage` is the Celery task payload.
- :data:`StreamEvent` is the tagged union of events a job emits (``token | done | error``), each
  with a per-job ``seq`` that starts at 1 and grows by one.
- :class:`JobRecord` is the job's Redis hash; :class:`JobView` is what ``GET /v1/jobs/{id}`` returns.
"""

from __future__ import annotations

import json
import time
from enum import Enum
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, field_validator, model_serializer, model_validator

from inferq.shared.errors import ErrorType, InferqError, classify
from inferq.shared.keys import MODEL_NAME_PATTERN
from inferq.shared.pooling import EmbedInputs

#: A free-text identifier (``user``): any characters but control characters.
NO_CONTROL_CHARS = r"^[^\x00-\x1f\x7f]*$"
#: Longest structured-output ``regex`` or ``grammar`` (characters).
STRUCTURE_MAX_CHARS = 16_384


class JobStatus(str, Enum):  # noqa: UP042 (StrEnum would change str() and f-strings of it)
    queued = "queued"
    running = "running"
    succeeded = "succeeded"
    failed = "failed"
    cancelled = "cancelled"

    @property
    def terminal(self) -> bool:
        return self.value in TERMINAL_STATUSES


#: The statuses a job never leaves, as the job record and the API spell them. The one definition:
#: the gateway's Lua scripts, the tests and the benchmark clients use it too.
TERMINAL_STATUSES: frozenset[str] = frozenset(s.value for s in (JobStatus.succeeded, JobStatus.failed,
                                                                JobStatus.cancelled))


class ToolCallFunction(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(min_length=1, max_length=64)
    arguments: str = Field(description="The arguments as a JSON text, as the model wrote them.")


class ToolCall(BaseModel):
    """A function call an assistant turn made (OpenAI's ``tool_calls`` item)."""

    model_config = ConfigDict(extra="forbid")
    id: str = Field(min_length=1, max_length=256)
    type: Literal["function"] = "function"
    function: ToolCallFunction


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="forbid")
    role: Literal["system", "user", "assistant", "tool"]
    content: str
    name: str | None = Field(default=None, min_length=1, max_length=256,
                             description="The participant's name; the model's chat template sees it as "
                             "`message.name` (templates that do not use it ignore it).")
    tool_calls: list[ToolCall] | None = Field(default=None, max_length=128, description="An assistant "
                                              "turn's function calls, for the chat template.")
    tool_call_id: str | None = Field(default=None, max_length=256, description="A tool turn: the call it "
                                     "answers.")

    def template_dict(self) -> dict[str, Any]:
        """The message as a chat template reads it: unset fields absent (templates test
        ``message.name is defined``), a call's arguments as an object where they parse (as vLLM
        passes them)."""
        d = self.model_dump(exclude_none=True)
        for call in d.get("tool_calls", ()):
            try:
                call["function"]["arguments"] = json.loads(call["function"]["arguments"])
            except ValueError:
                pass
        return d


class SamplingOptions(BaseModel):
    """Sampling knobs mirroring vLLM's ``SamplingParams``. The schema holds the shape and fixed
    bounds; the limits an operator configures (``INFERQ_MAX_*``) are checked where a job is
    admitted, against that process's settings (:func:`inferq.shared.request_limits.check_limits`)."""

    model_config = ConfigDict(extra="forbid")

    max_tokens: int | None = Field(default=None, ge=1, description="Default: INFERQ_DEFAULT_MAX_TOKENS; "
                                   "at most INFERQ_MAX_TOKENS_LIMIT.")
    temperature: float = Field(default=1.0, ge=0.0, le=2.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    top_k: int = Field(default=-1, ge=-1, le=100_000, description="-1 or 0 disables top-k.")
    min_p: float = Field(default=0.0, ge=0.0, le=1.0)
    stop: list[str] = Field(default_factory=list, description="At most INFERQ_MAX_STOP_SEQUENCES strings of "
                            "1 to INFERQ_MAX_STOP_CHARS characters.")
    seed: int | None = Field(default=None, ge=-(2**63), le=2**63 - 1)
    presence_penalty: float = Field(default=0.0, ge=-2.0, le=2.0)
    frequency_penalty: float = Field(default=0.0, ge=-2.0, le=2.0)
    repetition_penalty: float = Field(default=1.0, gt=0.0, le=2.0)
    ignore_eos: bool = False
    min_tokens: int = Field(default=0, ge=0, description="Tokens to generate before EOS or a stop may end "
                            "the output (vLLM's `min_tokens`).")
    stop_token_ids: list[int] = Field(default_factory=list, max_length=64,
                                      description="Token ids that end the output (vLLM's `stop_token_ids`).")
    n: int = Field(default=1, ge=1, description="Completions of the prompt; at most INFERQ_MAX_N.")
    logprobs: int | None = Field(default=None, ge=0, le=20, description="Top log-probs per token.")
    json_schema: dict[str, Any] | None = Field(default=None, description="Constrain output to this schema.")
    json_object: bool = Field(default=False, description="Constrain output to any JSON object.")
    choice: list[Annotated[str, Field(min_length=1, max_length=1024)]] | None = Field(
        default=None, min_length=1, max_length=64, description="Constrain output to exactly one of these "
        "strings (vLLM's structured output `choice`).")
    regex: str | None = Field(default=None, min_length=1, max_length=STRUCTURE_MAX_CHARS,
                              description="Constrain output to match this regular expression (vLLM's "
                              "structured output `regex`).")
    grammar: str | None = Field(default=None, min_length=1, max_length=STRUCTURE_MAX_CHARS,
                                description="Constrain output to this grammar (vLLM's structured output "
                                "`grammar`: EBNF/GBNF with the xgrammar backend).")
    logit_bias: dict[int, Annotated[float, Field(allow_inf_nan=False)]] | None = Field(
        default=None, description="Token id -> a bias added to its logit before sampling; clamped to "
        "[-100, 100], as vLLM does. An id outside the model's vocabulary is refused (400).")
    prompt_logprobs: int | None = Field(default=None, ge=0, le=20, description="Log-probs of the prompt's "
                                        "tokens, with this many alternatives each (vLLM's `prompt_logprobs`).")

    @field_validator("stop", mode="before")
    @classmethod
    def _stop_list(cls, v: Any) -> Any:
        return [v] if isinstance(v, str) else ([] if v is None else v)

    @field_validator("stop")
    @classmethod
    def _stop_not_empty(cls, v: list[str]) -> list[str]:
        if not all(v):
            raise ValueError("a stop sequence cannot be empty")
        return v

    @field_validator("logit_bias")
    @classmethod
    def _clamp_bias(cls, v: dict[int, float] | None) -> dict[int, float] | None:
        return None if v is None else {k: min(100.0, max(-100.0, b)) for k, b in v.items()}

    @model_validator(mode="after")
    def _greedy_n(self) -> SamplingOptions:
        if self.n > 1 and self.temperature == 0:
            raise ValueError("n > 1 needs temperature > 0 (greedy sampling gives one answer)")
        return self


class JobRequest(SamplingOptions):
    """Body of ``POST /v1/jobs``: exactly one of ``prompt``, ``prompt_token_ids`` or ``messages``."""

    prompt: str | None = Field(default=None, min_length=1, description="At most INFERQ_MAX_PROMPT_CHARS "
                               "characters.")
    prompt_token_ids: list[Annotated[int, Field(ge=0)]] | None = Field(
        default=None, min_length=1, description="The prompt as token ids, given to the engine as they are "
        "(no tokenizer, no special tokens added): at most INFERQ_MAX_PROMPT_CHARS ids, each in the model's "
        "vocabulary (an id outside it, or too many, is refused with a 400 naming `prompt`).")
    messages: list[ChatMessage] | None = Field(default=None, min_length=1, max_length=1024,
                                               description="Contents of at most INFERQ_MAX_PROMPT_CHARS "
                                               "characters in all.")
    echo: bool = Field(default=False, description="The output starts with the prompt (its text, and its "
                       "tokens' log-probs when `logprobs` is set), as OpenAI's completions `echo`. Needs "
                       "`prompt` or `prompt_token_ids`.")
    add_generation_prompt: bool = Field(default=True, description="With `messages`: the chat template adds "
                                        "the header that starts the assistant's turn.")
    continue_final_message: bool = Field(default=False, description="With `messages`: the last message is "
                                         "left open and the model continues it (needs "
                                         "`add_generation_prompt: false`).")
    tools: list[dict[str, Any]] | None = Field(default=None, max_length=128, description="Function tools "
                                               "(OpenAI's `tools` items), given to the chat template with "
                                               "`messages`.")
    instructions: str | None = Field(default=None, max_length=200_000, description="System text put before "
                                     "`messages` (the Responses API's `instructions`).")
    metadata: dict[Annotated[str, Field(max_length=64)], Annotated[str, Field(max_length=512)]] | None = Field(
        default=None, max_length=16, description="Your key-value pairs (16, keys of 64 and values of 512 "
        "characters at most), kept with the job and returned as given.")
    parse_tool_calls: bool = Field(default=False, description="Find tool calls in the output with the "
                                   "worker's tool-call parser (INFERQ_TOOL_CALL_PARSER): OpenAI's "
                                   "tool_choice 'auto'. Needs `tools` and `messages`.")
    model: str | None = Field(default=None, min_length=1, max_length=256, pattern=MODEL_NAME_PATTERN,
                              description="Letters, digits and . _ - / @ + only.")
    user: str | None = Field(default=None, max_length=256, pattern=NO_CONTROL_CHARS,
                             description="End-user id, for your logs.")
    priority: int = Field(default=5, ge=0, le=9, description="0 runs first, 9 last (queue and engine).")
    timeout: float | None = Field(default=None, gt=0, description="Seconds from submit until the job is "
                                  "abandoned; default INFERQ_DEFAULT_TIMEOUT_S, at most "
                                  "INFERQ_MAX_TIMEOUT_S.")
    embed: EmbedInputs | None = Field(default=None, description="An embedding job (a model served with "
                                      "INFERQ_RUNNER=pooling): its inputs' vectors come in the `done` event; "
                                      "/v1/embeddings is its OpenAI form.")

    @model_validator(mode="after")
    def _one_input(self) -> JobRequest:
        if sum(x is not None for x in (self.prompt, self.prompt_token_ids, self.messages, self.embed)) != 1:
            raise ValueError("give exactly one of 'prompt', 'prompt_token_ids', 'messages' or 'embed'")
        if self.echo and self.messages is not None:
            raise ValueError("echo needs 'prompt' or 'prompt_token_ids'")
        if (self.continue_final_message or not self.add_generation_prompt) and self.messages is None:
            raise ValueError("continue_final_message and add_generation_prompt need 'messages'")
        if self.continue_final_message and self.add_generation_prompt:
            raise ValueError("cannot set both continue_final_message and add_generation_prompt to true")
        if self.instructions is not None and self.messages is None:
            raise ValueError("instructions need 'messages'")
        if self.parse_tool_calls and (not self.tools or self.messages is None):
            raise ValueError("parse_tool_calls needs 'tools' and 'messages'")
        if sum(x is not None and x is not False
               for x in (self.json_schema, self.json_object, self.choice, self.regex, self.grammar)) > 1:
            raise ValueError("give at most one of 'json_schema', 'json_object', 'choice', 'regex' and 'grammar'")
        return self

    @property
    def prompt_param(self) -> str:
        """The request field that holds its prompt, as an error names it (ids count as ``prompt``)."""
        return "messages" if self.messages is not None else "input" if self.embed is not None else "prompt"

    def chat_messages(self) -> list[dict[str, Any]]:
        """``messages`` as the chat template is given them, after ``instructions`` as a system turn."""
        system = [{"role": "system", "content": self.instructions}] if self.instructions is not None else []
        return [*system, *(m.template_dict() for m in self.messages or ())]


class AdapterRef(BaseModel):
    """A LoRA adapter a job runs with: its name (what the client sent as ``model``) and the folder
    its worker loads it from."""

    name: str
    path: str


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
    stop_reason: str | int | None = None


class DoneEvent(BaseModel):
    type: Literal["done"] = "done"
    seq: int
    status: Literal[JobStatus.succeeded, JobStatus.cancelled] = JobStatus.succeeded
    finish_reason: str | None = None
    choices: list[ChoiceEnd] = Field(default_factory=list)
    usage: Usage = Field(default_factory=Usage)
    embeddings: list[str] | None = Field(default=None, description="An embedding job's vectors in input "
                                         "order, each its float32 values, little-endian, in base64.")


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


StreamEvent = Annotated[TokenEvent | DoneEvent | ErrorEvent | RestartEvent, Field(discriminator="type")]
_EVENT = TypeAdapter(StreamEvent)


def parse_event(data: str | bytes) -> TokenEvent | DoneEvent | ErrorEvent | RestartEvent:
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


class ChoiceView(BaseModel):
    index: int
    text: str
    finish_reason: str | None = None


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

    @property
    def served_name(self) -> str:
        """The name the job's answers carry as ``model``: its adapter's, else its model's (as vLLM)."""
        return self.adapter.name if self.adapter is not None else self.model

    def message(self, prompt_ids: list[int] | None = None) -> JobMessage:
        """The Celery task payload that (re-)sends this job to a worker (with the prompt's token ids
        where the gateway tokenized it; a job re-sent from its record is tokenized by the worker)."""
        return JobMessage(id=self.id, model=self.model, request=self.request, created_at=self.created_at,
                          deadline=self.deadline, traceparent=self.traceparent, prompt_ids=prompt_ids,
                          adapter=self.adapter)

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


class EngineStats(BaseModel):
    running: int = 0
    waiting: int = 0
    kv_cache_usage: float = 0.0
    peak_running: int = Field(default=0, description="Largest running batch seen since start.")
    engine_requests: int = Field(default=0, description="Requests the engine holds right now.")
    jobs_started: int = 0
    jobs_finished: int = 0
    steps: int = 0
    prefix_cache_queries: int = Field(default=0, description="Prompt tokens looked up in the prefix cache "
                                      "since start (of the steps whose stats reached this worker).")
    prefix_cache_hits: int = Field(default=0, description="Of those, the tokens found cached.")
    last_step_at: float | None = Field(
        default=None, description="Unix time of the engine's last step: a busy engine moves it, a stuck one does not.")


class WorkerInfo(BaseModel):
    """What a worker publishes about itself on every heartbeat."""

    id: str
    model: str
    host: str
    pid: int
    max_model_len: int
    max_num_seqs: int
    tokenizer: str | None = None
    tool_call_parser: str | None = Field(default=None, description="INFERQ_TOOL_CALL_PARSER of the worker.")
    vocab_size: int | None = Field(default=None, description="The model's token ids are 0 to this, excluded "
                                   "(a prompt of token ids is checked against it).")
    started_at: float
    last_seen: float
    draining: bool = False
    stats: EngineStats = Field(default_factory=EngineStats)
    frontend: int = Field(default=0, description="This worker's index in its engine group.")
    tokenizer_files: str | None = Field(default=None, description="The Redis key of the model's tokenizer "
                                        "as this worker published it for gateways (worker/engine/tokenizer_files.py).")
    prompt_probe: dict[str, str] = Field(default_factory=dict, description="Per form of prompt, a digest "
                                         "of the probe's token ids as this worker tokenizes it "
                                         "(shared/prompt_probe.py).")
    frontends: int = Field(default=1, description="Workers sharing this worker's engine (INFERQ_FRONTENDS); "
                           "each reports the whole engine's stats.")
    adapters: list[str] = Field(default_factory=list, description="LoRA adapters this worker's engine has "
                                "loaded (by name), most recently used last.")
    max_loras: int = Field(default=0, description="Adapters one engine batch may mix (0: LoRA off).")
    lane: bool = Field(default=False, description="Whether this worker consumes its lane (cache-affine pull): "
                       "only then may other workers pass jobs to it.")
    tasks: list[str] = Field(default_factory=lambda: ["generate"], description="What its engine serves: "
                             "'generate' (text), or pooling tasks such as 'embed' (INFERQ_RUNNER=pooling).")


class AdapterInfo(BaseModel):
    """A LoRA adapter the fleet serves (``inferq:adapters``): clients send ``name`` as ``model``."""

    name: str
    parent: str = Field(description="The base model it adapts: its workers run it, on its queue.")
    path: str = Field(description="Its folder, readable by every worker of the base model.")
    source: Literal["settings", "runtime"] = "settings"
    created_at: float = Field(default_factory=time.time)


class AdapterCommand(BaseModel):
    """Published on ``inferq:control:adapters``: the workers of ``adapter.parent`` load the adapter
    (and push an :class:`AdapterReply` onto ``reply_to``) or unload it."""

    op: Literal["load", "unload"]
    adapter: AdapterInfo
    reply_to: str | None = None


class AdapterReply(BaseModel):
    """A worker's answer to a load: ``error`` None when its engine took the adapter."""

    worker: str
    error: str | None = None
