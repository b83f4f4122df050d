"""A job's prompt is tokenized on the thread Celery gave the job, while the engine loop claims it,
and whatever tokenizing raised ends the job after its claim, naming the field."""

from __future__ import annotations

import threading
from typing import Any

from bench.standin import Out, ScriptedTokenizer, Step
from inferq.shared.schemas import JobStatus
from inferq.shared.store import JobStore
from tests.unit.workerkit import queued_job, start_runtime


class OneStepEngine:
    """Every request gets one token and ends."""

    async def generate(self, prompt: Any, params: Any, request_id: str, **_: Any) -> Any:
        yield Step([Out(0, "x", [1], finish_reason="length")], finished=True)


class WatchedTokenizer(ScriptedTokenizer):
    """Notes the thread that tokenizes; refuses chat messages (as a template that raises does)."""

    def __init__(self) -> None:
        self.threads: list[str] = []

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        self.threads.append(threading.current_thread().name)
        return super().encode(text, add_special_tokens)

    def apply_chat_template(self, messages: Any, **_: Any) -> str:
        raise ValueError("this template takes no system message")


async def test_the_prompt_is_tokenized_on_the_jobs_own_thread(r, own_redis) -> None:
    rig = start_runtime(own_redis, OneStepEngine())
    tok = rig.runtime.host.tokenizer = WatchedTokenizer()
    store = JobStore(r, 120)
    try:
        job = await queued_job(store, "scripted", prompt="one two three")
        assert rig.run_job(job).result(30) == JobStatus.succeeded
        rec = await store.get(job.id)
        assert rec.status is JobStatus.succeeded and rec.usage.prompt_tokens == 3
        assert tok.threads and all(t.startswith("celery-like") for t in tok.threads), tok.threads
    finally:
        rig.stop()


async def test_a_prompt_that_cannot_be_tokenized_fails_its_job_after_the_claim(r, own_redis) -> None:
    rig = start_runtime(own_redis, OneStepEngine())
    rig.runtime.host.tokenizer = WatchedTokenizer()
    store = JobStore(r, 120)
    try:
        job = await queued_job(store, "scripted", prompt=None, messages=[{"role": "user", "content": "hi"}])
        assert rig.run_job(job).result(30) == JobStatus.failed
        rec = await store.get(job.id)
        assert rec.status is JobStatus.failed and rec.attempt == 1 and rec.worker == rig.runtime.id
        assert rec.error is not None and rec.error.param == "messages"
        assert "template refused" in rec.error.message
    finally:
        rig.stop()
