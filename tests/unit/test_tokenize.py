"""``/tokenize`` and ``/detokenize`` in the gateway (the built-in model's tokenizer, a real
redis-server): a round trip gives the prompt back, and what cannot be served says why. The
differential suite checks the ids against vLLM's own server."""

from __future__ import annotations

import uuid
from pathlib import Path

from fastapi.testclient import TestClient

from inferq.api.app import create_app
from inferq.shared.settings import Settings


def app(url: str, **settings: object) -> TestClient:
    return TestClient(create_app(Settings(redis_url=url, served_model_name=f"tok-{uuid.uuid4().hex[:6]}",
                                          **settings)))


def test_tokenize_round_trip_and_refusals(unit_redis) -> None:
    with app(unit_redis.url) as c:
        model = c.app.state.settings.model_name
        tok = c.post("/tokenize", json={"model": model, "prompt": "The sky is blue"})
        assert tok.status_code == 200, tok.text
        body = tok.json()
        assert body["count"] == len(body["tokens"]) > 0 and body["max_model_len"] is None  # no live worker
        back = c.post("/detokenize", json={"tokens": body["tokens"]})
        assert back.json() == {"prompt": "The sky is blue"}
        other = c.post("/tokenize", json={"model": "other", "prompt": "x"})
        assert (other.status_code, other.json()["error"]["code"]) == (404, "model_not_found")
        bad = c.post("/detokenize", json={"tokens": [-1]})
        assert (bad.status_code, bad.json()["error"]["param"]) == (400, "tokens")


def test_without_a_tokenizer_it_is_503(unit_redis, tmp_path: Path) -> None:
    with app(unit_redis.url, tokenizer_path=tmp_path) as c:
        r = c.post("/tokenize", json={"prompt": "x"})
        assert (r.status_code, r.json()["error"]["code"]) == (503, "tokenizer_unavailable")


def test_chat_messages_are_rendered_as_the_worker_renders_them(unit_redis) -> None:
    """The gateway's template rendering gives the text the worker's tokenizer gives (transformers'
    apply_chat_template on the same folder), so /tokenize counts what the engine will see."""
    from transformers import AutoTokenizer

    from inferq.api.chat_template import load
    from inferq.worker.engine.models import tiny_model_dir

    folder = tiny_model_dir(Settings())
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
                {"role": "assistant", "content": "", "tool_calls": [
                    {"id": "c1", "type": "function", "function": {"name": "f", "arguments": {"x": 1}}}]},
                {"role": "tool", "content": "42", "tool_call_id": "c1"}]
    hf = AutoTokenizer.from_pretrained(str(folder))
    for gen in (True, False):
        assert load(folder).render(messages, gen, None) == hf.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=gen)
    with app(unit_redis.url) as c:
        r = c.post("/tokenize", json={"messages": messages[:2]})
        assert r.status_code == 200, r.text
        text = hf.apply_chat_template(messages[:2], tokenize=False, add_generation_prompt=True)
        assert r.json()["tokens"] == hf.encode(text, add_special_tokens=False)
        bad = c.post("/tokenize", json={"messages": []})
        assert bad.status_code == 400 and "messages" in bad.text


def test_a_gateway_without_the_models_folder_tokenizes_with_what_a_live_worker_published(
        unit_redis, tmp_path: Path) -> None:
    """A gateway on another host (INFERQ_TOKENIZER_PATH unreadable, the worker's folder too) answers
    /tokenize and /detokenize with the tokenizer a live worker published in Redis."""
    import asyncio
    import time

    from transformers import AutoTokenizer

    from inferq.shared import keys
    from inferq.shared.redis import make_redis
    from inferq.shared.schemas import WorkerInfo
    from inferq.worker.engine.models import tiny_model_dir
    from inferq.worker.engine.tokenizer_files import files_of, publish

    hf = AutoTokenizer.from_pretrained(str(tiny_model_dir(Settings())))
    with app(unit_redis.url, tokenizer_path=tmp_path) as c:
        model = c.app.state.settings.model_name
        assert c.post("/tokenize", json={"prompt": "x"}).status_code == 503  # no worker yet

        async def register() -> None:
            r = make_redis(unit_redis.url)
            key = await publish(r, files_of(hf))
            now = time.time()
            info = WorkerInfo(id="w-elsewhere", model=model, host="other", pid=1, max_model_len=512, max_num_seqs=4,
                              tokenizer="/nowhere/on/this/host", tokenizer_files=key, started_at=now, last_seen=now)
            await r.set(keys.worker(info.id), info.model_dump_json())
            await r.zadd(keys.workers(model), {info.id: now})
            await r.aclose()

        asyncio.run(register())
        r = c.post("/tokenize", json={"prompt": "The sky is blue"})
        assert r.status_code == 200, r.text
        assert r.json()["tokens"] == hf.encode("The sky is blue") and r.json()["max_model_len"] == 512
        chat = [{"role": "user", "content": "Hi"}]
        r = c.post("/tokenize", json={"messages": chat})
        text = hf.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
        assert r.status_code == 200 and r.json()["tokens"] == hf.encode(text, add_special_tokens=False), r.text
        back = c.post("/detokenize", json={"tokens": hf.encode("blue sky", add_special_tokens=False)})
        assert back.json() == {"prompt": "blue sky"}


def test_token_strings_and_a_continued_final_message_as_vllms_server_answers_them(unit_redis) -> None:
    """``return_token_strs`` answers each id's token string (the tokenizer's own, as vLLM's
    ``convert_ids_to_tokens``); ``continue_final_message`` leaves the last message open, as
    transformers' apply_chat_template cuts it, and cannot go with ``add_generation_prompt``."""
    from transformers import AutoTokenizer

    from inferq.api.chat_template import load
    from inferq.worker.engine.models import tiny_model_dir

    folder = tiny_model_dir(Settings())
    hf = AutoTokenizer.from_pretrained(str(folder))
    turns = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello the"}]
    cont = hf.apply_chat_template(turns, tokenize=False, add_generation_prompt=False, continue_final_message=True)
    assert load(folder).render(turns, False, None, continue_final_message=True) == cont
    assert cont.endswith("Hello the")
    with app(unit_redis.url) as c:
        r = c.post("/tokenize", json={"prompt": "The sky is blue", "return_token_strs": True})
        assert r.status_code == 200, r.text
        assert r.json()["token_strs"] == hf.convert_ids_to_tokens(r.json()["tokens"])
        assert c.post("/tokenize", json={"prompt": "x"}).json()["token_strs"] is None
        r = c.post("/tokenize", json={"messages": turns, "continue_final_message": True,
                                      "add_generation_prompt": False, "return_token_strs": True})
        assert r.status_code == 200, r.text
        assert r.json()["tokens"] == hf.encode(cont, add_special_tokens=False)
        assert r.json()["token_strs"] == hf.convert_ids_to_tokens(r.json()["tokens"])
        for both in ({"add_generation_prompt": True}, {}):  # the default adds a generation prompt
            bad = c.post("/tokenize", json={"messages": turns, "continue_final_message": True, **both})
            assert (bad.status_code, bad.json()["error"]["param"]) == (400, "continue_final_message"), bad.text
