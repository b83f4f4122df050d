"""Streamed chunks from a template (api/openai/chunk_template.py) are byte for byte the models' dump."""

from __future__ import annotations

import pytest

from inferq.api.openai.chunk_template import TextTemplate
from inferq.api.openai.objects import ChatCompletionChunk, ChunkChoice, Delta, TextChoice, TextCompletion


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


@pytest.mark.parametrize("build", [chat, completion])
def test_a_workers_plain_token_events_splice_to_the_models_own_json(build) -> None:
    """The text of plain token events, as a worker writes them, joined (a reader that is behind)
    and spliced into the chunk as JSON: the same bytes as dumping the chunk of the joined text."""
    from inferq.api.frames import PlainToken, frame, merged
    from inferq.shared.schemas import TokenEvent

    t = TextTemplate(build)
    for i, text in enumerate(TEXTS):
        pieces = [text, TEXTS[-1 - i], "", 'q"\\']
        frames = [frame(TokenEvent(seq=s, index=1, text=p, n_tokens=1).model_dump_json(exclude_none=True))
                  for s, p in enumerate(pieces, 1)]
        (one,) = merged(frames)
        assert isinstance(one, PlainToken) and (one.seq, one.index, one.n_tokens) == (4, 1, 4)
        assert one.text == "".join(pieces), repr(text)
        assert t.fill_json(one.text_json) == build(one.text).model_dump_json(exclude_none=True), repr(text)


def test_sse_events_are_written_as_sse_starlette_writes_them() -> None:
    from sse_starlette import ServerSentEvent

    from inferq.api.sse import Payload
    from inferq.api.sse import encode as _encoded

    for data, event in [('{"a":"b"}', None), ("[DONE]", None), ('{"x":1}', "response.created"),
                        ("two\nlines", None), ("cr\rlf\r\n", "e"), ("x", "bad\nname")]:
        assert _encoded(Payload(data, event=event)) == ServerSentEvent(data, event=event, sep="\n").encode()
