"""``/v1/responses`` through the official openai SDK: a response, its stream, a follow-up with
``previous_response_id``, ``background`` with polling, a stream resumed with ``starting_after``
(the job's replayable log), cancel, and refusals naming the field."""

from __future__ import annotations

import openai
import pytest

from tests.helpers import LONG_JOB
from tests.wait import eventually

pytestmark = pytest.mark.integration
MODEL = "inferq-tiny"


@pytest.fixture
def client(stack) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{stack.base}/v1", api_key="unused", max_retries=0)


def test_a_response_with_instructions(client) -> None:
    r = client.responses.create(model=MODEL, input="Say hi", instructions="Be brief.", max_output_tokens=8,
                                temperature=0, metadata={"run": "1"})
    assert r.id.startswith("resp_") and r.object == "response" and r.model == MODEL
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"  # 8 tokens, no EOS
    assert r.output_text and r.output[0].content[0].type == "output_text"
    assert r.usage.output_tokens == 8 and r.usage.input_tokens > 0
    assert r.instructions == "Be brief." and r.metadata == {"run": "1"}
    again = client.responses.retrieve(r.id)
    assert again.output_text == r.output_text and again.status == r.status
    # the instructions reached the model: the same input without them is a shorter prompt
    bare = client.responses.create(model=MODEL, input="Say hi", max_output_tokens=8, temperature=0)
    assert bare.usage.input_tokens < r.usage.input_tokens


def test_the_stream_adds_up_to_the_response(client) -> None:
    events = list(client.responses.create(model=MODEL, input="Count", max_output_tokens=12, temperature=0,
                                          stream=True))
    kinds = [e.type for e in events]
    assert kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]
    # 12 tokens and no EOS: cut at max_output_tokens, which OpenAI streams as response.incomplete
    assert kinds[-4:] == ["response.output_text.done", "response.content_part.done", "response.output_item.done",
                          "response.incomplete"]
    assert events[-2].item.status == "incomplete" and events[-1].response.status == "incomplete"
    assert [e.sequence_number for e in events] == list(range(len(events)))
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    final = events[-1].response
    assert text == final.output_text == events[-4].text and final.usage.output_tokens == 12
    assert client.responses.retrieve(final.id).output_text == text


def test_previous_response_id_continues_the_conversation(client) -> None:
    first = client.responses.create(model=MODEL, input="My name is Ada.", max_output_tokens=6, temperature=0)
    second = client.responses.create(model=MODEL, input="What is my name?", previous_response_id=first.id,
                                     max_output_tokens=6, temperature=0)
    alone = client.responses.create(model=MODEL, input="What is my name?", max_output_tokens=6, temperature=0)
    assert second.previous_response_id == first.id
    assert client.responses.retrieve(second.id).previous_response_id == first.id  # kept with the response
    # the first turn and its answer are in the prompt
    assert second.usage.input_tokens > alone.usage.input_tokens + first.usage.output_tokens
    unknown = "resp_" + "0" * 32
    with pytest.raises(openai.NotFoundError) as e:
        client.responses.create(model=MODEL, input="x", previous_response_id=unknown)
    assert e.value.body["param"] == "previous_response_id" and unknown in e.value.body["message"], e.value.body


def test_background_then_poll_and_resume_the_stream(client) -> None:
    r = client.responses.create(model=MODEL, input="Tell a story", max_output_tokens=40, temperature=0,
                                background=True)
    assert r.status in ("queued", "in_progress") and r.background is True
    assert client.responses.retrieve(r.id).background is True
    got = eventually(lambda: client.responses.retrieve(r.id), 120, f"response {r.id} to end", interval=0.1,
                     until=lambda got: got.status not in ("queued", "in_progress"))
    assert got.status == "incomplete" and got.usage.output_tokens == 40 and got.background is True
    whole = list(client.responses.retrieve(r.id, stream=True))
    assert "".join(e.delta for e in whole if e.type == "response.output_text.delta") == got.output_text
    cut = whole[6].sequence_number
    rest = list(client.responses.retrieve(r.id, stream=True, starting_after=cut))
    assert [e.sequence_number for e in rest] == [e.sequence_number for e in whole[7:]]
    assert [e.type for e in rest] == [e.type for e in whole[7:]]


def test_cancel_a_background_response(client) -> None:
    """The cancel answers the response as it stopped (queued or running when it came); cancelling
    it again answers the same; a response that ended otherwise, or was not a background one, is a
    400 naming it, as OpenAI's."""
    r = client.responses.create(model=MODEL, input="Go on", max_output_tokens=LONG_JOB, background=True)
    cancelled = client.responses.cancel(r.id)  # long before its end
    assert cancelled.status == "cancelled" and cancelled.background is True
    assert client.responses.retrieve(r.id).status == "cancelled"
    assert client.responses.cancel(r.id).status == "cancelled"
    running = client.responses.create(model=MODEL, input="Go on", max_output_tokens=LONG_JOB, background=True)
    eventually(lambda: client.responses.retrieve(running.id), 60, f"response {running.id} to start", interval=0.05,
               until=lambda got: got.status != "queued")
    stopped = client.responses.cancel(running.id)
    assert stopped.status == "cancelled" and stopped.output[0].status == "incomplete"
    assert client.responses.retrieve(running.id).status == "cancelled"
    done = client.responses.create(model=MODEL, input="Hi", max_output_tokens=2)
    short = client.responses.create(model=MODEL, input="Hi", max_output_tokens=2, background=True)
    short = eventually(lambda: client.responses.retrieve(short.id), 60, f"response {short.id} to end",
                       interval=0.1, until=lambda got: got.status not in ("queued", "in_progress"))
    for ended, says in ((done, "background"), (short, "already ended")):
        with pytest.raises(openai.BadRequestError) as e:
            client.responses.cancel(ended.id)
        assert e.value.body["param"] == "response_id" and says in e.value.body["message"], e.value.body
        assert client.responses.retrieve(ended.id).status == ended.status  # left as it was


@pytest.mark.parametrize("kwargs, param", [
    ({"tools": [{"type": "function", "name": "f", "parameters": {}}]}, "tools"),
    ({"max_output_tokens": 0}, "max_output_tokens"),
    ({"text": {"format": {"type": "json_object"}}}, "text"),
    ({"extra_body": {"unknown_field": 1}}, "unknown_field"),
])
def test_what_is_not_served_is_a_400_naming_it(client, kwargs, param) -> None:
    with pytest.raises(openai.BadRequestError) as e:
        client.responses.create(model=MODEL, input="x", **kwargs)
    assert param in (e.value.body or {}).get("param", "") + str(e.value.body), e.value.body


def test_an_unknown_response_is_404(client) -> None:
    with pytest.raises(openai.NotFoundError) as e:
        client.responses.retrieve("resp_" + "f" * 32)
    assert e.value.body["param"] == "response_id" and "resp_" + "f" * 32 in e.value.body["message"]
    with pytest.raises(openai.NotFoundError):
        client.responses.cancel("resp_" + "f" * 32)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve("not-a-response")
