"""Pooling jobs on the wire: what an embedding job asks of a worker that runs a pooling model
(``INFERQ_RUNNER=pooling``), and how its vectors come back (float32, base64, in input order)."""

from __future__ import annotations

import base64
import sys
from array import array
from collections.abc import Sequence
from typing import Annotated

from pydantic import BaseModel, Field, model_validator

from inferq.shared.errors import InvalidRequest

#: Inputs one embedding request may carry (OpenAI's limit).
MAX_EMBED_INPUTS = 2048


class EmbedInputs(BaseModel):
    """An embedding job: each input (a text, or token ids) embedded on its own, as vLLM's
    ``/v1/embeddings`` does them."""

    texts: list[str] | None = Field(default=None, min_length=1, max_length=MAX_EMBED_INPUTS)
    token_ids: list[Annotated[list[Annotated[int, Field(ge=0)]], Field(min_length=1)]] | None = Field(
        default=None, min_length=1, max_length=MAX_EMBED_INPUTS)
    dimensions: int | None = Field(default=None, ge=1, description="Matryoshka size to cut each vector to "
                                   "(models that declare matryoshka_dimensions).")
    truncate_prompt_tokens: int | None = Field(default=None, ge=-1, description="Keep only the first N "
                                               "tokens of each input (-1: the context window).")
    add_special_tokens: bool = Field(default=True, description="Texts: the tokenizer adds its special "
                                     "tokens (BOS) as vLLM's embeddings do.")
    use_activation: bool | None = Field(default=None, description="Normalize the vectors (None: the "
                                        "model's pooler decides, normally yes).")
    text_max_tokens: list[Annotated[int, Field(ge=0)]] | None = Field(
        default=None, description="Texts: each cut to its first N tokens (without special tokens) before it "
        "is embedded, at the character where its N-th token ends, 0: not cut (vLLM's rerank and score "
        "max_tokens_per_query, max_tokens_per_doc).")

    @model_validator(mode="after")
    def _one_form(self) -> EmbedInputs:
        if (self.texts is None) == (self.token_ids is None):
            raise ValueError("give exactly one of 'texts' or 'token_ids'")
        if self.text_max_tokens is not None and len(self.text_max_tokens) != len(self.texts or ()):
            raise ValueError("text_max_tokens needs 'texts', one limit for each")
        return self

    def __len__(self) -> int:
        return len(self.texts or self.token_ids or ())


def check_task(tasks: Sequence[str], embedding: bool, model: str) -> None:
    """An embedding job for a model whose workers serve no embeddings, or a generation job for an
    embedding model, is refused naming ``model``. ``tasks``: what the model's workers serve (none
    known: let the engine decide)."""
    if not tasks:
        return
    if embedding and "embed" not in tasks:
        raise InvalidRequest(f"the model {model!r} does not serve embeddings (it serves: {', '.join(tasks)})",
                             param="model", code="model_task_unsupported")
    if not embedding and "generate" not in tasks:
        raise InvalidRequest(f"the model {model!r} is an embedding model: it does not generate text (use "
                             "/v1/embeddings)", param="model", code="model_task_unsupported")


def unpack_vector(packed: str) -> list[float]:
    """The float values of a vector as the wire carries it: its float32 values, little-endian, in
    base64, as OpenAI's ``encoding_format: base64`` (the worker packs it:
    ``inferq.worker.jobs.pooling.pack_vector``)."""
    a = array("f")
    a.frombytes(base64.b64decode(packed))
    if sys.byteorder == "big":
        a.byteswap()
    return a.tolist()
