"""The OpenAI requests the gateway accepts: chat completions and completions.

Requests forbid unknown fields: a parameter inferq does not implement is refused with a 400
naming it, never silently ignored; so is a known one set to a value inferq cannot honour
(``best_of`` above ``n``: every completion generated is returned; ``stream_options.
continuous_usage_stats: true``: usage is sent once, at the end; ``max_tokens: 0``, which vLLM
takes with ``echo`` to return the prompt alone: a job generates at least one token). What SDKs and
frameworks send as a matter of course is accepted with the meaning vLLM gives it: ``null`` for
any field (its default), ``best_of`` up to ``n``, and the bookkeeping fields ``store``,
``metadata`` and ``reasoning_effort``, which change nothing here (README, "OpenAI SDK").
``service_tier`` picks the job's service class as OpenAI's tiers read: ``flex`` (slower, for work
nobody waits on) is batch work, ``default``, ``priority`` and ``scale`` interactive, ``auto`` the
key's class (docs/design.md, "Service classes"). Messages and tools: api/openai/messages.py; tool
calling: api/openai/tools.py.

vLLM's request extras are served as ``vllm serve`` serves them: a completions ``prompt`` of token
ids (or a list of such prompts), ``echo`` (with ``logprobs``, the prompt's tokens come first, the
first with null log-probs), ``logit_bias`` (clamped to [-100, 100]), ``prompt_logprobs`` (not
streamed, except 0), and on chat ``add_generation_prompt`` and ``continue_final_message`` (not
both).
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    ValidatorFunctionWrapHandler,
    field_validator,
    model_validator,
)

from inferq.api.openai.messages import NamedToolChoice, OpenAIMessage, ToolDef
from inferq.shared.keys import MODEL_NAME_PATTERN
from inferq.shared.schemas import NO_CONTROL_CHARS, STREAM_INTERVAL_MAX, STRUCTURE_MAX_CHARS

#: A token id, as a completions ``prompt`` may be given.
TokenId = Annotated[int, Field(ge=0)]
#: Prompts in one completions request, as OpenAI and vLLM allow (strings, or lists of token ids).
MAX_PROMPTS = 64


class JsonSchemaSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    name: str = Field(max_length=64)
    description: str | None = None
    schema_: dict[str, Any] = Field(default_factory=dict, alias="schema")
    strict: bool | None = Field(default=None, description="Accepted, true or false: the output always "
                                "follows the schema (structured outputs constrain every token as it is "
                                "decoded).")


class ResponseFormat(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaSpec | None = None

    @model_validator(mode="after")
    def _schema_given(self) -> ResponseFormat:
        if self.type == "json_schema" and self.json_schema is None:
            raise ValueError("json_schema is required when type is 'json_schema'")
        return self


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    include_usage: bool = Field(default=False, description="A last chunk with the whole request's usage.")
    continuous_usage_stats: bool = Field(default=False, description="Not supported (false only): usage is "
                                         "sent once, at the end, with include_usage.")

    @field_validator("continuous_usage_stats")
    @classmethod
    def _once_at_the_end(cls, v: bool) -> bool:
        if v:
            raise ValueError("not supported: usage is sent once, at the end, with include_usage")
        return v


class StructuredOutputs(BaseModel):
    """vLLM's ``structured_outputs`` extension: exactly one of ``choice`` (the output is one of the
    strings), ``regex``, ``grammar`` (as vLLM's structured-output backend reads it: EBNF/GBNF for
    xgrammar) or ``json`` (a JSON schema, as an object or a string). vLLM's other knobs
    (``json_object``: use ``response_format``; ``structural_tag``, ``whitespace_pattern``, backend
    options) are refused by name."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    choice: list[Annotated[str, Field(min_length=1, max_length=1024)]] | None = Field(
        default=None, min_length=1, max_length=64)
    regex: str | None = Field(default=None, min_length=1, max_length=STRUCTURE_MAX_CHARS)
    grammar: str | None = Field(default=None, min_length=1, max_length=STRUCTURE_MAX_CHARS)
    json_: dict[str, Any] | str | None = Field(default=None, alias="json")

    @model_validator(mode="after")
    def _one(self) -> StructuredOutputs:
        given = [k for k in ("choice", "regex", "grammar", "json_") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError("give exactly one of choice, regex, grammar and json")
        if isinstance(self.json_, str):
            try:
                schema = json.loads(self.json_)
            except ValueError:
                raise ValueError("json: a string here must hold a JSON schema") from None
            if not isinstance(schema, dict):
                raise ValueError("json: the schema must be a JSON object")
            self.json_ = schema
        return self

    def job_fields(self) -> dict[str, Any]:
        """The job request's field for the constraint given."""
        if self.json_ is not None:
            return {"json_schema": self.json_}
        return {k: v for k in ("choice", "regex", "grammar") if (v := getattr(self, k)) is not None}


def _is_int(key: str) -> bool:
    """Whether ``key`` reads as an integer, as vLLM reads ``logit_bias`` keys (``int(key)``)."""
    try:
        int(key)
    except ValueError:
        return False
    return True


class NullIsDefault(BaseModel):
    """A request whose fields sent as null take their defaults, as in vLLM and the OpenAI SDK's own
    models."""

    @model_validator(mode="before")
    @classmethod
    def _null_is_default(cls, data: Any) -> Any:
        return {k: v for k, v in data.items() if v is not None} if isinstance(data, dict) else data


#: OpenAI's service tiers (another value is a 400 naming ``service_tier``).
ServiceTier = Literal["auto", "default", "flex", "priority", "scale"]


def tier_class(tier: ServiceTier | None) -> dict[str, Any]:
    """The job fields a service tier asks for: ``flex`` is batch work, ``default``, ``priority`` and
    ``scale`` interactive; ``auto`` (or none) leaves the class to the key (interactive by default)."""
    if tier is None or tier == "auto":
        return {}
    return {"service_class": "batch" if tier == "flex" else "interactive"}


class _Common(NullIsDefault):
    """Fields chat and completions share; sampling bounds are the same as ``POST /v1/jobs``."""

    model_config = ConfigDict(extra="forbid")
    model: str | None = Field(default=None, min_length=1, max_length=256, pattern=MODEL_NAME_PATTERN,
                              description="Letters, digits and . _ - / @ + only.")
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    n: int = Field(default=1, ge=1)
    stop: str | list[str] | None = None
    seed: int | None = Field(default=None, ge=-(2**63), le=2**63 - 1)
    presence_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    frequency_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = Field(default=None, max_length=256, pattern=NO_CONTROL_CHARS)
    # vLLM extensions the OpenAI SDK passes through extra_body
    top_k: int | None = Field(default=None, ge=-1)
    min_p: float | None = Field(default=None, ge=0.0, le=1.0)
    repetition_penalty: float | None = Field(default=None, gt=0.0, le=2.0)
    ignore_eos: bool = False
    min_tokens: int | None = Field(default=None, ge=0)
    stop_token_ids: list[int] | None = Field(default=None, max_length=64)
    structured_outputs: StructuredOutputs | None = None
    prompt_logprobs: int | None = Field(default=None, ge=0, le=20, description="The prompt's log-probs, "
                                        "with this many alternatives per token; not with `stream` (but 0).")
    logit_bias: dict[str, Annotated[float, Field(allow_inf_nan=False)]] | None = Field(
        default=None, description="Token id (a string) -> a bias added to its logit; clamped to [-100, 100], "
        "as vLLM does.")
    stream_interval: int | None = Field(
        default=None, ge=1, le=STREAM_INTERVAL_MAX, description="Tokens a streamed chunk carries (the first and "
        "last go at once); raised to the server's INFERQ_STREAM_INTERVAL.")
    # accepted as SDKs send them; they change nothing here
    store: bool | None = None
    metadata: dict[str, str] | None = Field(default=None, max_length=16)
    service_tier: ServiceTier | None = Field(default=None, description="'flex': batch work, run on the "
                                             "capacity interactive work leaves (not with stream).")

    @field_validator("logit_bias")
    @classmethod
    def _token_id_keys(cls, v: dict[str, float] | None) -> dict[str, float] | None:
        bad = [k for k in v or () if not _is_int(k)]
        if bad:
            raise ValueError(f"keys must be token ids (integers as strings), not {bad[:5]}")
        return v

    @field_validator("prompt_logprobs")
    @classmethod
    def _not_streamed(cls, v: int | None, info: ValidationInfo) -> int | None:
        if v and info.data.get("stream"):
            raise ValueError("not available when stream is true")
        return v

    def sampling_fields(self) -> dict[str, Any]:
        names = ("max_tokens", "temperature", "top_p", "n", "stop", "seed", "presence_penalty",
                 "frequency_penalty", "top_k", "min_p", "repetition_penalty", "ignore_eos", "min_tokens",
                 "stop_token_ids", "prompt_logprobs", "stream_interval")
        out = {k: getattr(self, k) for k in names if getattr(self, k) is not None}
        if self.structured_outputs is not None:
            out.update(self.structured_outputs.job_fields())
        if self.logit_bias:
            out["logit_bias"] = {int(k): b for k, b in self.logit_bias.items()}
        return out


class ChatCompletionRequest(_Common):
    messages: list[OpenAIMessage] = Field(min_length=1, max_length=1024)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    response_format: ResponseFormat | None = None
    tools: list[ToolDef] | None = Field(default=None, max_length=128, description="Functions the model "
                                        "may call; given to the chat template.")
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = Field(
        default=None, description="'required' or a named function: the answer is a call (structured "
        "outputs); 'none': text; 'auto' (the default with tools): the worker's tool-call parser "
        "(INFERQ_TOOL_CALL_PARSER) finds calls in the text (400 when the model's workers have none).")
    parallel_tool_calls: bool | None = Field(default=None, description="false: 'required' makes one call.")
    reasoning_effort: str | None = Field(default=None, max_length=16)
    # vLLM extras: how the chat template renders the messages
    add_generation_prompt: bool = Field(default=True, description="The template adds the header that "
                                        "starts the assistant's turn.")
    continue_final_message: bool = Field(default=False, description="The last message is left open and "
                                         "the model continues it; needs `add_generation_prompt: false`.")

    @field_validator("continue_final_message")
    @classmethod
    def _not_both(cls, v: bool, info: ValidationInfo) -> bool:
        """As vLLM (its check, or the chat template's with the default ``add_generation_prompt``)."""
        if v and info.data.get("add_generation_prompt", True):
            raise ValueError("cannot set both continue_final_message and add_generation_prompt to true")
        return v

    @model_validator(mode="after")
    def _top_logprobs_needs_logprobs(self) -> ChatCompletionRequest:
        if self.top_logprobs and not self.logprobs:
            raise ValueError("top_logprobs requires logprobs: true")
        return self

    @model_validator(mode="after")
    def _tool_choice_names_a_tool(self) -> ChatCompletionRequest:
        """As vLLM: ``auto`` by default when tools are given; a choice other than ``none`` needs
        tools, and a named one must be among them."""
        if "tool_choice" not in self.model_fields_set and self.tools:
            self.tool_choice = "auto"
        if self.tool_choice not in (None, "none") and not self.tools:
            raise ValueError("when using `tool_choice`, `tools` must be set")
        if isinstance(self.tool_choice, NamedToolChoice) and self.tools and \
                self.tool_choice.function.name not in {t.function.name for t in self.tools}:
            raise ValueError(f"tool_choice names {self.tool_choice.function.name!r}, which is not in `tools`")
        return self


class CompletionRequest(_Common):
    prompt: str | list[str] | list[TokenId] | list[list[TokenId]] = Field(
        description="A prompt (text, or token ids), or a list of prompts: one job each.")
    logprobs: int | None = Field(default=None, ge=0, le=20)
    echo: bool = Field(default=False, description="Each choice's text starts with its prompt (a prompt "
                       "of token ids decoded); with `logprobs`, so do its log-probs.")
    best_of: int | None = Field(default=None, ge=1, description="At most n: every completion generated is "
                                "returned.")

    @model_validator(mode="after")
    def _best_of_is_n(self) -> CompletionRequest:
        if self.best_of is not None and self.best_of > self.n:
            raise ValueError("best_of above n is not supported: every completion generated is returned")
        return self

    @field_validator("prompt", mode="wrap")
    @classmethod
    def _prompt(cls, v: Any, handler: ValidatorFunctionWrapHandler) -> Any:
        """One message for whatever is wrong, naming ``prompt`` (not one line per kind of prompt)."""
        try:
            v = handler(v)
        except ValidationError:
            raise ValueError("must be a string, a list of strings, a list of token ids (integers from 0) "
                             "or a list of such lists") from None
        if isinstance(v, list) and not (v and isinstance(v[0], int)):
            if not 1 <= len(v) <= MAX_PROMPTS:
                raise ValueError(f"a list of prompts must hold 1 to {MAX_PROMPTS} prompts")
            if any(len(p) == 0 for p in v):
                raise ValueError("a prompt cannot be empty")
        return v

    def prompts(self) -> list[str | list[int]]:
        """Each prompt, text or token ids: one job each."""
        p = self.prompt
        return [p] if isinstance(p, str) or (p and isinstance(p[0], int)) else list(p)  # type: ignore[arg-type]
