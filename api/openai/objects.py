"""OpenAI objects the gateway returns: completions, chat completions, their streamed chunks, and
model cards. A streamed chunk's choice sends ``finish_reason`` and ``logprobs`` as null until set,
as OpenAI and vLLM send them."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field, SerializerFunctionWrapHandler, model_serializer

from inferq.shared.schemas import PromptLogprobs, ToolCall, Usage


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "inferq"
    max_model_len: int | None = Field(default=None, description="The context window, as vLLM's server "
                                      "reports it (tokens, prompt and output together).")
    parent: str | None = Field(default=None, description="A LoRA adapter's base model; None for a model.")
    state: Literal["awake", "asleep", "offline"] | None = Field(
        default=None, description="A model's state in the fleet: awake (a worker takes its jobs now), asleep "
        "(multi-model workers hold it asleep: a job waits for a wake, its first event says how long) or offline "
        "(one of INFERQ_MODELS with no worker running: a job waits for one to start). None for an adapter.")
    awake_workers: int | None = Field(default=None, description="Workers holding the model awake.")
    asleep_workers: int | None = Field(default=None, description="Multi-model workers holding it asleep.")


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class TopLogprobOut(BaseModel):
    token: str
    logprob: float
    bytes: list[int]


class ChatTokenLogprob(TopLogprobOut):
    top_logprobs: list[TopLogprobOut]


class ChatLogprobs(BaseModel):
    content: list[ChatTokenLogprob]


class CompletionLogprobs(BaseModel):
    tokens: list[str]
    token_logprobs: list[float | None] = Field(description="null for an echoed prompt's first token.")
    top_logprobs: list[dict[str, float] | None]
    text_offset: list[int]


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None = Field(description="The text; null when the answer is only tool calls.")
    tool_calls: list[ToolCall] | None = None


#: A choice's ``stop_reason``, as vLLM's server answers it.
StopReason = Annotated[str | int | None, Field(description="vLLM's: the stop string or stop token id that "
                                               "ended the choice; null when something else ended it.")]


class ChatChoice(BaseModel):
    index: int
    message: AssistantMessage
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None
    stop_reason: StopReason = None


class ChatCompletion(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage
    prompt_logprobs: PromptLogprobs | None = Field(default=None, description="With `prompt_logprobs`: per "
                                                   "prompt token (the first: null), token id -> "
                                                   "{logprob, rank, decoded_token}, as vLLM returns them.")


class ToolCallDelta(BaseModel):
    """A streamed piece of a call: the first has ``id``, ``type`` and the name; the rest add to
    ``function.arguments``."""

    index: int
    id: str | None = None
    type: Literal["function"] | None = None
    function: dict[str, str]


class Delta(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None
    tool_calls: list[ToolCallDelta] | None = None


class _NullsKept(BaseModel):
    """A choice whose ``finish_reason`` and ``logprobs`` are sent as null until set, as OpenAI and
    vLLM send them, even when the message is dumped with ``exclude_none``."""

    @model_serializer(mode="wrap")
    def _keep_nulls(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        out: dict[str, Any] = handler(self)
        out.setdefault("logprobs", None)
        out.setdefault("finish_reason", None)
        return out


class ChunkChoice(_NullsKept):
    index: int
    delta: Delta
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None = None
    stop_reason: StopReason = None  # in the chunk that ends the choice, when it has one


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChunkChoice]
    usage: Usage | None = None


class TextChoice(_NullsKept):
    index: int
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: str | None = None
    stop_reason: StopReason = None
    prompt_logprobs: PromptLogprobs | None = Field(default=None, description="With `prompt_logprobs` (or "
                                                   "`echo` and `logprobs`): its prompt's, as on a chat "
                                                   "completion.")


class TextCompletion(BaseModel):
    """A whole completion, and (with ``usage`` left out until the end) each streamed chunk."""

    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[TextChoice]
    usage: Usage | None = None
