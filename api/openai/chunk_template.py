"""Streamed chunks from a template: the JSON of a chunk model with its text left open.

Every token of an OpenAI stream is a chunk that differs from the last only in its text. Building
and dumping the pydantic models for each one (a chunk, its choice with the serializer that keeps
nulls, its delta) was a tenth of a gateway's CPU streaming SSE; the chunk is instead dumped once
per stream and completion with a marker for its text, and each token's JSON is the text spliced
in. Text a worker's event already holds as JSON (:class:`~inferq.api.frames.PlainToken`) is
spliced as it is: pydantic wrote it, and pydantic escapes a string the same in any model. Other
text takes the template when it is ASCII (``json.dumps`` and pydantic escape it alike, which the
unit tests check character by character) and goes through the models otherwise.
"""

from __future__ import annotations

import json
from collections.abc import Callable

from pydantic import BaseModel

_MARK = "INFERQ_CHUNK_TEXT_7f3a9c"


class TextTemplate:
    """``fill(text)``: ``build(text).model_dump_json(exclude_none=True)``, without building it."""

    __slots__ = ("build", "head", "tail")

    def __init__(self, build: Callable[[str], BaseModel]) -> None:
        self.build = build
        self.head, self.tail = build(_MARK).model_dump_json(exclude_none=True).split(f'"{_MARK}"')

    def fill_json(self, text_json: str) -> str:
        """The chunk of a text given as pydantic's JSON of it, without the quotes."""
        return f'{self.head}"{text_json}"{self.tail}'

    def fill(self, text: str) -> str:
        if text.isascii():
            return self.head + json.dumps(text, ensure_ascii=False) + self.tail
        return self.build(text).model_dump_json(exclude_none=True)
