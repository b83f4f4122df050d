"""Streamed chunks from a template (api/chunk_template.py) are byte for byte the models' dump."""

from __future__ import annotations

import pytest

from inferq.api.chunk_template import TextTemplate
from inferq.api.openai_schemas import ChatCompletionChunk, ChunkChoice, Delta, TextChoice, TextCompletion


def chat(text: str) -> ChatCompletionChunk:
    return ChatCompletionChunk(id="job-1", created=1700000000, model="m \"q\"", choices=[
        ChunkChoice(index=2, delta=Delta(content=text))])


def completion(text: str) -> TextCompletion:
    return TextCompletion(id="job-1", created=1700000000, model="m", choices=[TextChoice(index=3, text=text)])


TEXTS = [chr(c) for c in range(128)] + ["", " hello", 'say "hi"\n', "back\\slash", "</script>", "\t\r\x00\x1f\x7f",
                                        "naïve", "日本語", "😀 emoji", "\u2028line", "a" * 5000]


@pytest.mark.parametrize("build", [chat, completion])
def test_every_text_fills_to_the_models_own_json(build) -> None:
    t = TextTemplate(build)
    for text in TEXTS:
        assert t.fill(text) == build(text).model_dump_json(exclude_none=True), repr(text)


def test_the_template_keeps_the_nulls_openai_sends() -> None:
    assert '"logprobs":null' in TextTemplate(chat).fill("x") and '"finish_reason":null' in TextTemplate(chat).fill("x")
