"""``/v1/embeddings``: the OpenAI request, its job (one job per request: its inputs are embedded
together on one worker that runs a pooling model, INFERQ_RUNNER=pooling), and the answer made of
the job's ``done`` event. As ``vllm serve`` takes it: ``input`` a text, texts, token ids or lists
of token ids; ``encoding_format`` ``float`` or ``base64`` (float32, little-endian: what the
openai SDK asks for by default); ``dimensions`` for a model with Matryoshka sizes; vLLM's extras
``truncate_prompt_tokens``, ``add_special_tokens`` and ``use_activation``. Chat-form inputs
(``messages``) are not taken.
"""

from __future__ import annotations

import time
from typing import Annotated, Any, Literal, TypeGuard, TypeVar, cast

from pydantic import BaseModel, ConfigDict, Field

from inferq.api.frames import PlainToken
from inferq.api.streams import StreamHub
from inferq.shared.errors import Conflict, error_from
from inferq.shared.keys import MODEL_NAME_PATTERN
from inferq.shared.pooling import MAX_EMBED_INPUTS, EmbedInputs, unpack_vector
from inferq.shared.schemas import NO_CONTROL_CHARS, JobRequest
from inferq.shared.store import Event

T = TypeVar("T")

TokenIds = Annotated[list[Annotated[int, Field(ge=0)]], Field(min_length=1)]


class EmbeddingRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    input: str | Annotated[list[str], Field(min_length=1, max_length=MAX_EMBED_INPUTS)] | TokenIds | Annotated[
        list[TokenIds], Field(min_length=1, max_length=MAX_EMBED_INPUTS)] = Field(
        description=f"A text, texts, token ids, or lists of token ids: at most {MAX_EMBED_INPUTS} inputs.")
    model: str | None = Field(default=None, min_length=1, max_length=256, pattern=MODEL_NAME_PATTERN)
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = Field(default=None, ge=1)
    user: str | None = Field(default=None, max_length=256, pattern=NO_CONTROL_CHARS)
    truncate_prompt_tokens: int | None = Field(default=None, ge=-1)
    add_special_tokens: bool = True
    use_activation: bool | None = None

    def inputs(self) -> EmbedInputs:
        """The job's inputs: texts, or lists of token ids."""
        x = self.input
        if isinstance(x, str):
            return self._inputs(texts=[x])
        if _all_of(x, int):  # one input of token ids
            return self._inputs(token_ids=[x])
        if _all_of(x, str):
            return self._inputs(texts=x)
        return self._inputs(token_ids=cast(list[list[int]], x))

    def _inputs(self, texts: list[str] | None = None, token_ids: list[list[int]] | None = None) -> EmbedInputs:
        return EmbedInputs(texts=texts, token_ids=token_ids, dimensions=self.dimensions,
                           truncate_prompt_tokens=self.truncate_prompt_tokens,
                           add_special_tokens=self.add_special_tokens, use_activation=self.use_activation)


def _all_of(items: list[Any], kind: type[T]) -> TypeGuard[list[T]]:
    return all(isinstance(v, kind) for v in items)


def embedding_job(req: EmbeddingRequest) -> JobRequest:
    """The job of an embeddings request: all of its inputs, embedded on one worker."""
    return JobRequest(embed=req.inputs(), model=req.model, user=req.user)


class Embedding(BaseModel):
    object: Literal["embedding"] = "embedding"
    index: int
    embedding: list[float] | str


class EmbeddingUsage(BaseModel):
    prompt_tokens: int
    total_tokens: int
    completion_tokens: int = 0
    prompt_tokens_details: None = None
    completion_tokens_details: None = None


class EmbeddingList(BaseModel):
    id: str
    object: Literal["list"] = "list"
    created: int
    model: str
    data: list[Embedding]
    usage: EmbeddingUsage


class Vectors(BaseModel):
    """What an embedding job produced: its packed vectors, in input order, and its prompt tokens."""

    packed: list[str]
    prompt_tokens: int
    tokens: list[int] | None = None  # per input, where the worker said them


def vectors_of(ev: Event | PlainToken) -> Vectors | None:
    """The job's vectors if ``ev`` is its end (None for any other event); its error raised if it
    failed, or was cancelled before its inputs were embedded."""
    if ev.type == "error":
        raise error_from(ev.error)
    if ev.type != "done":
        return None
    if ev.embeddings is None:
        raise Conflict("the job was cancelled before its inputs were embedded", code="job_cancelled")
    return Vectors(packed=ev.embeddings, prompt_tokens=ev.usage.prompt_tokens, tokens=ev.embedding_tokens)


async def collect_vectors(hub: StreamHub, job_id: str) -> Vectors:
    """The job's vectors, once it ends; its error raised if it fails."""
    async for ev in hub.events(job_id):
        if (got := vectors_of(ev)) is not None:
            return got
    raise Conflict(f"job {job_id} ended without its vectors", code="job_cancelled")


def embedding_response(job_id: str, model: str, req: EmbeddingRequest, got: Vectors) -> EmbeddingList:
    """The OpenAI answer: each vector as floats, or as the base64 of its float32 values."""
    as_floats = req.encoding_format == "float"
    return EmbeddingList(
        id=job_id, created=int(time.time()), model=model,
        data=[Embedding(index=i, embedding=unpack_vector(p) if as_floats else p) for i, p in enumerate(got.packed)],
        usage=EmbeddingUsage(prompt_tokens=got.prompt_tokens, total_tokens=got.prompt_tokens))
