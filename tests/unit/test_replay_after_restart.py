"""A job that restarted after sending text, replayed from its log once it ended: the OpenAI streams
(chat, completions, Responses) follow the restart to the attempt that counts and end as the job
did, where they used to end `restarted` with the lost attempt's text. A reader that passed a lost
attempt's text on while it ran still sees the restart (a stream cannot take text back)."""

from __future__ import annotations

import json

from inferq.api.openai import responses as rs
from inferq.api.openai.chunks import chat_chunks, completion_chunks
from inferq.api.openai.params import ChatCompletionRequest, CompletionRequest
from inferq.shared.schemas import DoneEvent, JobStatus, TokenEvent, Usage
from inferq.shared.store import JobStore
from tests.unit.test_store_and_hub import claimed_job, running_hub

CHAT = ChatCompletionRequest.model_validate({"messages": [{"role": "user", "content": "hi"}], "stream": True})
COMPLETION = CompletionRequest.model_validate({"prompt": "hi", "stream": True})


async def restarted_then_done(store: JobStore) -> str:
    """A job whose first attempt streamed "lost " and was lost; its second made "kept", then ended."""
    job = await claimed_job(store)
    assert await store.append([(job, 1, TokenEvent(seq=1, text="lost "))]) == [True]
    assert await store.requeue(job, "w", 1, "worker_lost", max_attempts=3) == "requeued"  # seq 2: restart
    claim = await store.claim(job, "w2")
    assert claim is not None and claim.attempt == 2 and claim.last_seq == 2
    assert await store.append([(job, 2, TokenEvent(seq=3, text="kept", n_tokens=1))]) == [True]
    usage = Usage(prompt_tokens=1, completion_tokens=1, total_tokens=2)
    done = DoneEvent(seq=4, finish_reason="stop", usage=usage)
    choices = [{"index": 0, "text": "kept", "finish_reason": "stop"}]
    assert await store.finish(job, "w2", 2, done, status=JobStatus.succeeded, usage=usage, choices=choices,
                              finish_reason="stop") is JobStatus.succeeded
    return job


def texts(payloads: list, key: str) -> str:
    out = ""
    for p in payloads[:-1]:
        for c in json.loads(p.data)["choices"]:
            out += (c.get("delta") or {}).get("content") or "" if key == "chat" else c.get("text") or ""
    return out


async def test_a_replayed_chat_and_completion_stream_follow_the_restart(store, unit_redis) -> None:
    async with running_hub(unit_redis.url, store) as hub:
        job = await restarted_then_done(store)
        chat = [p async for p in chat_chunks(hub, job, "m", CHAT)]
        assert chat[-1].data == "[DONE]" and chat[-1].error is None
        assert texts(chat, "chat") == "kept"
        completion = [p async for p in completion_chunks(hub, [job], "m", COMPLETION)]
        assert completion[-1].data == "[DONE]" and texts(completion, "completion") == "kept"


async def test_a_replayed_response_stream_follows_the_restart(store, unit_redis) -> None:
    async with running_hub(unit_redis.url, store) as hub:
        job = await restarted_then_done(store)
        rec = await store.get(job)

        async def final() -> dict:
            return rs.response(await store.get(job))

        events = [json.loads(p.data) for p in [p async for p in rs.stream_events(hub, rec, -1, final)]]
        assert events[-1]["type"] == "response.completed", events[-1]
        deltas = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
        assert deltas == "kept" and events[-1]["response"]["output"][0]["content"][0]["text"] == "kept"
        assert [e["sequence_number"] for e in events] == list(range(len(events)))


async def test_a_live_reader_that_sent_the_lost_text_still_sees_the_restart(store, unit_redis) -> None:
    """The restart comes in a batch of its own after the lost attempt's text went out."""
    async with running_hub(unit_redis.url, store) as hub:
        job = await claimed_job(store)
        await store.append([(job, 1, TokenEvent(seq=1, text="lost "))])
        stream = chat_chunks(hub, job, "m", CHAT)
        first = await anext(stream)
        assert "lost" in first.data
        assert await store.requeue(job, "w", 1, "worker_lost", max_attempts=3) == "requeued"
        rest = [p async for p in stream]
        assert rest[-1].last and rest[-1].error is not None and rest[-1].error.code == "restarted"
