"""vLLM's ``stop_reason``: the stop string or stop token id that ended a choice, from the engine's
output (worker/jobs/outputs.py) through the job's ``done`` event to the choices of a chat or text
completion, whole or streamed (in the chunk that ends the choice); null when nothing of the kind
ended it."""

from __future__ import annotations

import json

from bench.standin import Out, ScriptedTokenizer, Step
from inferq.api.openai import Collector, chat_response, completion_response
from inferq.api.openai.chunks import chat_chunks, completion_chunks
from inferq.api.openai.params import ChatCompletionRequest, CompletionRequest
from inferq.shared.schemas import ChoiceEnd, DoneEvent, JobStatus, TokenEvent, Usage
from inferq.shared.store import JobStore
from inferq.worker.jobs.outputs import OutputEvents, Progress
from inferq.worker.jobs.prompt import PromptReturn
from tests.unit.test_store_and_hub import claimed_job, running_hub

CHAT = {"messages": [{"role": "user", "content": "hi"}], "n": 3, "temperature": 1}
COMPLETION = {"prompt": "hi", "n": 3, "temperature": 1}


def done_event() -> DoneEvent:
    """What a worker sends for three choices: stopped by a string, by a token id, by length."""
    progress = Progress(prompt_tokens=1)
    events = OutputEvents(progress, PromptReturn([1], None, None, ScriptedTokenizer()), ScriptedTokenizer(), None,
                          Sink())
    events.feed(Step([Out(0, "a", [5], finish_reason="stop", stop_reason="\n"),
                      Out(1, "b", [6], finish_reason="stop", stop_reason=7),
                      Out(2, "c", [8], finish_reason="length")]))
    _, done = progress.end(JobStatus.succeeded, None)
    assert isinstance(done, DoneEvent)
    return DoneEvent.model_validate_json(done.model_dump_json(exclude_none=True))  # as the log keeps it


class Sink:
    def emit(self, event: TokenEvent) -> None:
        pass

    def extend(self, index: int, text: str, n_tokens: int) -> bool:
        return False


def test_the_engines_stop_reason_reaches_the_answers() -> None:
    done = done_event()
    assert [c.stop_reason for c in done.choices] == ["\n", 7, None]
    for body, make in ((CHAT, chat_response), (COMPLETION, completion_response)):
        c = Collector(3)
        c.feed(done)
        if make is chat_response:
            answer = chat_response("job-1", "m", ChatCompletionRequest.model_validate(body), c.out)
        else:
            answer = completion_response("job-1", "m", CompletionRequest.model_validate(body), [c.out])
        choices = json.loads(answer.model_dump_json())["choices"]
        assert [ch["stop_reason"] for ch in choices] == ["\n", 7, None]  # null sent, as vLLM sends it
        assert [ch["finish_reason"] for ch in choices] == ["stop", "stop", "length"]


async def test_a_stream_sends_the_stop_reason_in_the_chunk_that_ends_the_choice(store: JobStore, unit_redis) -> None:
    async with running_hub(unit_redis.url, store) as hub:
        job = await claimed_job(store)
        assert await store.append([(job, 1, TokenEvent(seq=1, text="a", n_tokens=1))]) == [True]
        usage = Usage(prompt_tokens=1, completion_tokens=1, total_tokens=2)
        done = DoneEvent(seq=2, finish_reason="stop", usage=usage,
                         choices=[ChoiceEnd(index=0, finish_reason="stop", stop_reason="\n")])
        assert await store.finish(job, "w", 1, done, status=JobStatus.succeeded, usage=usage,
                                  finish_reason="stop") is JobStatus.succeeded
        chat = ChatCompletionRequest.model_validate({**CHAT, "n": 1, "stream": True})
        completion = CompletionRequest.model_validate({**COMPLETION, "n": 1, "stream": True})
        for payloads in ([p async for p in chat_chunks(hub, job, "m", chat)],
                         [p async for p in completion_chunks(hub, [job], "m", completion)]):
            choices = [ch for p in payloads[:-1] for ch in json.loads(p.data)["choices"]]
            assert [(ch["finish_reason"], ch.get("stop_reason")) for ch in choices][-1] == ("stop", "\n")
            assert all(ch.get("stop_reason") is None for ch in choices[:-1])
