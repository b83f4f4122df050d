"""The gateway tokenizes a job's prompt and sends the token ids with the job where its tokenizing is
the worker's (shared/prompt_probe.py). The built-in model's real tokenizers on both sides
(``tokenizers`` and the gateway's template renderer; transformers as vLLM's worker uses it), a
real redis-server for the queue."""

from __future__ import annotations

import json
import shutil
import threading
import time
import uuid
from base64 import b64decode
from functools import partial
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from inferq.api.metrics import PROMPTS
from inferq.api.prompt_ids import GatewayTokenizer, Published, gateway_tokenizer, tokenize
from inferq.api.service import JobService
from inferq.shared import keys
from inferq.shared.celery_app import make_celery
from inferq.shared.errors import ContextLengthExceeded, InvalidRequest
from inferq.shared.prompt_probe import CHAT, PROMPT, digests
from inferq.shared.schemas import JobMessage, JobRequest, WorkerInfo
from inferq.shared.settings import Settings
from inferq.shared.store import JobStore
from inferq.worker.engine.encode import encode_request
from inferq.worker.engine.models import CHAT_TEMPLATE, tiny_model_dir
from inferq.worker.engine.tokenizer_files import TTL_S, files_of, publish
from inferq.worker.jobs.prepare import Preparer
from tests.unit.workerkit import GatedEngine, start_runtime
from tests.wait import eventually_async

CHAT_TURNS = [{"role": "system", "content": "Be brief.", "name": "ops"}, {"role": "user", "content": "Hi  there\n"},
              {"role": "assistant", "content": "Hello! 東京?"}, {"role": "user", "content": "naïve café 🙂"}]

REQUESTS = [
    JobRequest(prompt="The sky is blue"),
    JobRequest(prompt="  leading spaces, tabs\tand\r\nnew lines; ΔΩ 🙂 <s> {{ x }} " * 20),
    JobRequest(messages=CHAT_TURNS),
    JobRequest(messages=CHAT_TURNS[1:2], instructions="Answer in French."),
    JobRequest(messages=CHAT_TURNS, add_generation_prompt=False),
]


@pytest.fixture(scope="module")
def folder() -> Path:
    return tiny_model_dir(Settings())


@pytest.fixture(scope="module")
def hf(folder: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(folder))


def info(folder: Path, probe: dict[str, str], max_model_len: int = 8192) -> WorkerInfo:
    now = time.time()
    return WorkerInfo(id="w", model="m", host="h", pid=1, max_model_len=max_model_len, max_num_seqs=4,
                      tokenizer=str(folder), prompt_probe=probe, started_at=now, last_seen=now)


def test_the_gateway_makes_the_workers_token_ids_in_every_form_it_takes(folder: Path, hf: Any) -> None:
    worker = digests(partial(encode_request, hf))
    gateway = gateway_tokenizer(str(folder))
    assert gateway is not None and set(worker) == {PROMPT, CHAT} and gateway.probe == worker
    for req in REQUESTS:
        assert gateway.encode(req) == encode_request(hf, req), req


def _other_template(folder: Path, to: Path) -> Path:
    """The model's tokenizer with a chat template of its own: the gateway renders chat unlike the worker."""
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(folder / name, to / name)
    (to / "chat_template.jinja").write_text("[chat]" + CHAT_TEMPLATE)
    return to


async def test_ids_go_with_a_job_only_where_the_workers_probe_agrees(folder: Path, hf: Any, tmp_path: Path) -> None:
    worker = digests(partial(encode_request, hf))
    prompt, chat = REQUESTS[1], REQUESTS[2]
    n, ids = await tokenize(prompt, info(folder, worker))
    assert ids == encode_request(hf, prompt) and n == len(ids)
    n, ids = await tokenize(chat, info(folder, worker))
    assert ids == encode_request(hf, chat) and n == len(ids)

    elsewhere = info(_other_template(folder, tmp_path), worker)  # this gateway's template is not the workers'
    assert gateway_tokenizer(elsewhere.tokenizer).probe[CHAT] != worker[CHAT]
    assert await tokenize(chat, elsewhere) == (None, None)  # not even counted
    assert (await tokenize(prompt, elsewhere))[1] == encode_request(hf, prompt)  # plain prompts still agree

    n, ids = await tokenize(prompt, info(folder, {}))  # a worker that announces no probe: counted, not sent
    assert ids is None and n == len(encode_request(hf, prompt))
    tools = JobRequest(messages=CHAT_TURNS, tools=[{"type": "function", "function": {"name": "f"}}])
    assert await tokenize(tools, info(folder, worker)) == (None, None)  # tools: the worker renders them
    assert await tokenize(JobRequest(prompt_token_ids=[5, 6]), info(folder, worker)) == (2, None)
    assert await tokenize(prompt, info(tmp_path / "none", worker)) == (None, None)  # no tokenizer here
    hub = info(Path("org/model"), worker)  # the worker loaded a Hub id: INFERQ_TOKENIZER_PATH's folder
    assert (await tokenize(chat, hub, str(folder)))[1] == encode_request(hf, chat)
    assert await tokenize(chat, hub, str(tmp_path)) == (None, None)  # that folder's template differs


async def test_a_template_that_refuses_some_turns_still_agrees_and_refuses_them_at_the_gateway(
        folder: Path, tmp_path: Path) -> None:
    """Many templates refuse a system turn (Mistral's) or stamp today's date (Llama's
    ``strftime_now``): the probe agrees all the same, and what the template refuses is a 400
    naming ``messages`` before anything is queued."""
    from transformers import AutoTokenizer

    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(folder / name, tmp_path / name)
    (tmp_path / "chat_template.jinja").write_text(
        "{% if messages[0]['role'] == 'system' %}{{ raise_exception('no system turn') }}{% endif %}"
        "[{{ strftime_now('%Y') }}|{{ messages | tojson(indent=1, sort_keys=true) }}]" + CHAT_TEMPLATE)
    hf = AutoTokenizer.from_pretrained(str(tmp_path))
    worker = digests(partial(encode_request, hf))
    assert CHAT in worker and gateway_tokenizer(str(tmp_path)).probe == worker
    chat = JobRequest(messages=CHAT_TURNS[1:])
    assert (await tokenize(chat, info(tmp_path, worker)))[1] == encode_request(hf, chat)
    with pytest.raises(InvalidRequest) as e:
        await tokenize(JobRequest(messages=CHAT_TURNS), info(tmp_path, worker))
    assert e.value.param == "messages" and "no system turn" in e.value.message


async def test_a_long_prompt_is_tokenized_off_the_event_loop_to_the_same_ids(folder: Path, hf: Any,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    from inferq.api import prompt_ids as mod

    threads: list[str] = []
    encode = GatewayTokenizer.encode

    def spy(self: GatewayTokenizer, req: JobRequest) -> list[int]:
        threads.append(threading.current_thread().name)
        return encode(self, req)

    monkeypatch.setattr(GatewayTokenizer, "encode", spy)
    req = JobRequest(prompt="word " * (mod.INLINE_CHARS // 5 + 1))
    n, ids = await tokenize(req, info(folder, digests(partial(encode_request, hf))))
    assert ids == encode_request(hf, req) and threads[-1] != "MainThread"
    await tokenize(REQUESTS[0], info(folder, {}))
    assert threads[-1] == "MainThread"


async def _queued_message(r: Any, model: str) -> JobMessage:
    raw = json.loads((await r.lrange(keys.queue_lists(model)[5], 0, -1))[0])
    body = json.loads(b64decode(raw["body"]))
    return JobMessage.model_validate_json(body[0][0])


async def test_submit_sends_the_ids_with_the_job_and_refuses_a_chat_prompt_past_the_window(
        own_redis: str, r: Any, folder: Path, hf: Any) -> None:
    model = f"pid-{uuid.uuid4().hex[:6]}"
    settings = Settings(redis_url=own_redis, served_model_name=model)
    service = JobService(settings, r, JobStore(r, 120), make_celery(settings))
    worker = info(folder, digests(partial(encode_request, hf)), max_model_len=64).model_copy(update={"model": model})
    await r.set(keys.worker(worker.id), worker.model_dump_json())
    await r.zadd(keys.workers(model), {worker.id: time.time()})

    counted = PROMPTS.labels(model, "gateway")
    rec = await service.submit(JobRequest(messages=CHAT_TURNS[1:2], max_tokens=4))
    msg = await _queued_message(r, model)
    assert msg.id == rec.id and msg.prompt_ids == encode_request(hf, rec.request)
    assert counted._value.get() == 1 and PROMPTS.labels(model, "worker")._value.get() == 0
    assert rec.message().prompt_ids is None  # a job re-sent from its record is tokenized by the worker

    with pytest.raises(ContextLengthExceeded) as e:  # the gateway counts chat prompts now
        await service.submit(JobRequest(messages=[{"role": "user", "content": "many words " * 40}], max_tokens=4))
    assert "prompt alone has" in e.value.message and e.value.param == "messages"


def test_the_worker_runs_the_gateways_ids_as_they_are_checked_against_the_vocabulary() -> None:
    class Refuses:
        def encode(self, *a: Any, **k: Any) -> list[int]:
            raise AssertionError("the worker tokenized a prompt the gateway had tokenized")

    runner = Preparer(SimpleNamespace(tokenizer=Refuses(), vocab_size=10))  # type: ignore[arg-type]
    msg = JobMessage(id="job-1", model="m", request=JobRequest(prompt="a b c"), created_at=0.0, prompt_ids=[3, 4])
    assert runner.prompt_ids(msg) == [3, 4]
    with pytest.raises(InvalidRequest) as e:
        runner.prompt_ids(msg.model_copy(update={"prompt_ids": [3, 10]}))
    assert e.value.param == "prompt"


async def test_a_gateway_without_the_models_folder_uses_what_the_worker_published(r: Any, hf: Any) -> None:
    """A gateway on another host: the worker's tokenizer comes from Redis, loaded in the background
    (the first request goes without it), and its ids are the worker's."""
    key = await publish(r, files_of(hf))
    assert key == await publish(r, files_of(hf))  # the same files, the same key
    worker = digests(partial(encode_request, hf))
    elsewhere = info(Path("org/model"), worker).model_copy(update={"tokenizer_files": key})
    published = Published(r)
    assert published.get(key) is None  # loading
    await eventually_async(lambda: published.get(key) is not None, 30, "the published tokenizer loaded")
    tok = published.get(key)
    assert tok.probe == worker
    for req in REQUESTS:
        assert tok.encode(req) == encode_request(hf, req), req
        n, ids = await tokenize(req, elsewhere, None, tok)
        assert ids == encode_request(hf, req) and n == len(ids)

    missing = Published(r)
    assert missing.get("inferq:tokenizer:none") is None
    await eventually_async(lambda: "inferq:tokenizer:none" in missing._failed, 30, "the missing key noted")
    assert missing.get("inferq:tokenizer:none") is None and not missing._loading  # not looked for at once


async def test_a_worker_publishes_its_tokenizer_and_its_heartbeat_keeps_it(r: Any, own_redis: str, hf: Any) -> None:
    rig = start_runtime(own_redis, GatedEngine(), tokenizer=hf)
    try:
        raw = await r.get(keys.worker(rig.runtime.id))
        key = WorkerInfo.model_validate_json(raw).tokenizer_files
        assert key and (await r.hgetall(key)) == files_of(hf)
        await r.expire(key, 5)
        await eventually_async(lambda: _ttl_over(r, key, 60), 10, "a heartbeat refreshed the files' TTL")
        assert await r.ttl(key) <= TTL_S
    finally:
        rig.stop()


async def _ttl_over(r: Any, key: str, seconds: int) -> bool:
    return await r.ttl(key) > seconds
