"""vLLM's pooling extras on an embedding model, through the queue: ``/pooling`` (the pooler's
output, here the embedding), ``/score`` and ``/rerank`` (the cosine similarity of embeddings, as
``vllm serve`` scores with a bi-encoder). Each request is one embedding job of all its texts;
the scores are computed by the gateway from the job's vectors. Cross-encoder (classification)
models are not served here.
"""

from __future__ import annotations

import math
import time
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from inferq.api.openai.embeddings import EmbeddingRequest, EmbeddingUsage, Vectors
from inferq.shared.errors import InvalidRequest
from inferq.shared.keys import MODEL_NAME_PATTERN
from inferq.shared.pooling import MAX_EMBED_INPUTS, EmbedInputs, unpack_vector
from inferq.shared.schemas import NO_CONTROL_CHARS, JobRequest

Texts = str | Annotated[list[str], Field(min_length=1, max_length=MAX_EMBED_INPUTS)]


class PoolingRequest(EmbeddingRequest):
    """``/pooling``: as ``/v1/embeddings``, and ``task`` (``embed``, the model's pooling task)."""

    task: Literal["embed"] | None = None


class PoolingData(BaseModel):
    index: int
    object: Literal["pooling"] = "pooling"
    data: list[float] | str


class PoolingList(BaseModel):
    id: str
    object: Literal["list"] = "list"
    created: int
    model: str
    data: list[PoolingData]
    usage: EmbeddingUsage


class _Scoring(BaseModel):
    model_config = ConfigDict(extra="forbid")
    model: str | None = Field(default=None, min_length=1, max_length=256, pattern=MODEL_NAME_PATTERN)
    user: str | None = Field(default=None, max_length=256, pattern=NO_CONTROL_CHARS)
    truncate_prompt_tokens: int | None = Field(default=None, ge=-1)
    use_activation: bool | None = None
    max_tokens_per_query: int = Field(default=0, ge=0, description="Each query cut to its first N tokens "
                                      "before it is embedded (as vLLM's); 0: not cut.")
    max_tokens_per_doc: int = Field(default=0, ge=0, description="Each document cut to its first N tokens "
                                    "before it is embedded (as vLLM's; Cohere's rerank option); 0: not cut.")

    def pairs(self) -> tuple[list[str], list[str]]:
        raise NotImplementedError

    def job(self) -> JobRequest:
        """One embedding job: the first texts, then the second ones."""
        first, second = self.pairs()
        if len(first) > 1 and len(first) != len(second):
            raise InvalidRequest(f"the inputs pair 1:1, 1:N or N:N; got {len(first)}:{len(second)}",
                                 param="text_2")
        if len(first) + len(second) > MAX_EMBED_INPUTS:
            raise InvalidRequest(f"at most {MAX_EMBED_INPUTS} texts in all", param="text_2")
        cut = [self.max_tokens_per_query] * len(first) + [self.max_tokens_per_doc] * len(second)
        inputs = EmbedInputs(texts=[*first, *second], truncate_prompt_tokens=self.truncate_prompt_tokens,
                             use_activation=self.use_activation, text_max_tokens=cut if any(cut) else None)
        return JobRequest(embed=inputs, model=self.model, user=self.user)


def _listed(x: Texts) -> list[str]:
    return [x] if isinstance(x, str) else list(x)


class ScoreRequest(_Scoring):
    """``/score``: ``text_1`` against ``text_2`` (or ``queries`` against ``documents``)."""

    text_1: Texts | None = None
    text_2: Texts | None = None
    queries: Texts | None = None
    documents: Texts | None = None

    @model_validator(mode="before")
    @classmethod
    def _one_naming(cls, data: Any) -> Any:
        if isinstance(data, dict) and "queries" in data and "text_1" not in data:
            data = {**data, "text_1": data.pop("queries"), "text_2": data.pop("documents", None)}
        return data

    @model_validator(mode="after")
    def _both(self) -> ScoreRequest:
        if self.text_1 is None or self.text_2 is None:
            raise ValueError("give text_1 and text_2 (or queries and documents)")
        return self

    def pairs(self) -> tuple[list[str], list[str]]:
        assert self.text_1 is not None and self.text_2 is not None
        return _listed(self.text_1), _listed(self.text_2)


class RerankRequest(_Scoring):
    """``/rerank``: ``documents`` ordered by their score against ``query``, the best ``top_n``; and
    the fields Cohere-style clients send (LiteLLM always sends ``return_documents``)."""

    query: str
    documents: Texts
    top_n: int = Field(default=0, ge=0)
    return_documents: bool | None = Field(default=None, description="false: the results leave each "
                                          "document out (null); true or unset: each result holds it, as vLLM's.")
    max_chunks_per_doc: int | None = Field(default=None, ge=1, description="Accepted and ignored, as vLLM "
                                           "ignores it: a document longer than the context is refused, or cut "
                                           "with max_tokens_per_doc, never split into chunks.")
    rank_fields: list[str] | None = Field(default=None, max_length=64, description="Accepted and ignored, as "
                                          "vLLM ignores it: documents are texts, not records with fields.")

    def pairs(self) -> tuple[list[str], list[str]]:
        return [self.query], _listed(self.documents)


def cosines(got: Vectors, n_first: int) -> list[float]:
    """The score of each pair: the first texts' vectors (one for all, or one each) against the
    second ones'."""
    vs = [unpack_vector(p) for p in got.packed]
    first, second = vs[:n_first], vs[n_first:]
    if len(first) == 1:
        first = first * len(second)

    def cos(a: list[float], b: list[float]) -> float:
        norm = math.sqrt(math.fsum(x * x for x in a) * math.fsum(y * y for y in b))
        return math.fsum(x * y for x, y in zip(a, b, strict=True)) / max(norm, 1e-8)

    return [cos(a, b) for a, b in zip(first, second, strict=True)]


def usage(got: Vectors) -> EmbeddingUsage:
    return EmbeddingUsage(prompt_tokens=got.prompt_tokens, total_tokens=got.prompt_tokens)


def pooling_response(job_id: str, model: str, req: PoolingRequest, got: Vectors) -> PoolingList:
    floats = req.encoding_format == "float"
    return PoolingList(id=job_id, created=int(time.time()), model=model, usage=usage(got),
                       data=[PoolingData(index=i, data=unpack_vector(p) if floats else p)
                             for i, p in enumerate(got.packed)])


class ScoreData(BaseModel):
    index: int
    object: Literal["score"] = "score"
    score: float


class ScoreList(BaseModel):
    id: str
    object: Literal["list"] = "list"
    created: int
    model: str
    data: list[ScoreData]
    usage: EmbeddingUsage


def score_response(job_id: str, model: str, req: ScoreRequest, got: Vectors) -> ScoreList:
    scores = cosines(got, len(req.pairs()[0]))
    return ScoreList(id=job_id, created=int(time.time()), model=model, usage=usage(got),
                     data=[ScoreData(index=i, score=s) for i, s in enumerate(scores)])


class RerankDocument(BaseModel):
    text: str
    multi_modal: None = None


class RerankResult(BaseModel):
    index: int
    document: RerankDocument | None
    relevance_score: float


class RerankUsage(BaseModel):
    prompt_tokens: int
    total_tokens: int


class RerankList(BaseModel):
    id: str
    model: str
    usage: RerankUsage
    results: list[RerankResult]


def rerank_response(job_id: str, model: str, req: RerankRequest, got: Vectors) -> RerankList:
    docs = _listed(req.documents)
    shown = req.return_documents is not False
    results = sorted((RerankResult(index=i, document=RerankDocument(text=d) if shown else None, relevance_score=s)
                      for i, (d, s) in enumerate(zip(docs, cosines(got, 1), strict=True))),
                     key=lambda r: r.relevance_score, reverse=True)
    return RerankList(id=job_id, model=model, results=results[:req.top_n or len(results)],
                      usage=RerankUsage(prompt_tokens=got.prompt_tokens, total_tokens=got.prompt_tokens))
