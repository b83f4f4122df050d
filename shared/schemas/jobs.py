"""What a client asks for: the job request (``POST /v1/jobs``, and what the OpenAI routes
translate to), its messages and sampling options, and the job statuses."""

from __future__ import annotations

import contextlib
import json
from enum import Enum
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from inferq.shared.keys import MODEL_NAME_PATTERN
from inferq.shared.pooling import EmbedInputs

NO_CONTROL_CHARS = r"^[^\x00-\x1f\x7f]*$"
#: Longest structured-output ``regex`` or ``grammar`` (characters).
STRUCTURE_MAX_CHARS = 16_384
STREAM_INTERVAL_MAX = 1024  # tokens a stream event may be asked to carry (INFERQ_STREAM_INTERVAL too)
#: A job's priority when its request gives none (0 runs first, 9 last).
DEFAULT_PRIORITY = 5
#: What a job is to the fleet: interactive work (someone waits on it) or batch work (it runs on the
#: capacity interactive work leaves: docs/design.md, "Service classes").
ServiceClass = Literal["interactive", "batch"]
SERVICE_CLASSES: tuple[ServiceClass, ...] = ("interactive", "batch")


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
            with contextlib.suppress(ValueError):
                call["function"]["arguments"] = json.loads(call["function"]["arguments"])
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
    stream_interval: int | None = Field(
        default=None, ge=1, le=STREAM_INTERVAL_MAX, description="Tokens a stream's event carries (vLLM's "
        "`stream_interval`): the first and last go at once. Below INFERQ_STREAM_INTERVAL it is raised to it.")

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

    @field_validator("min_tokens")
    @classmethod
    def _min_within_max(cls, v: int, info: ValidationInfo) -> int:
        """``min_tokens`` above ``max_tokens`` cannot be met (vLLM refuses it): a 400 naming it."""
        most = info.data.get("max_tokens")
        if most is not None and v > most:
            raise ValueError(f"min_tokens ({v}) must be <= max_tokens ({most})")
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
    priority: int = Field(default=DEFAULT_PRIORITY, ge=0, le=9, description="0 runs first, 9 last (queue and "
                          "engine). With API keys, each key may use the priorities its keys-file line gives it "
                          "(default: 5 to 9; docs/security.md); another is refused (400).")
    service_class: ServiceClass = Field(
        default="interactive", description="'batch': bulk work, run on the capacity interactive work leaves, at "
        "INFERQ_BATCH_PRIORITY (the batch lane); not for a streamed request. Default 'interactive' (a key with "
        "class=batch in the keys file: 'batch').")
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
