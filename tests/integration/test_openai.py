"""The OpenAI-compatible API, driven by the official openai SDK (sync and async) and raw SSE."""

from __future__ import annotations

import json
import time

import httpx
import openai
import pytest

from inferq.shared import keys
from inferq.worker.engine.models import TINY_MAX_LEN
from tests.conftest import ADAPTER_SEEDS
from tests.helpers import LONG_JOB, ran_out_first, wait_status

pytestmark = pytest.mark.integration
MODEL = "inferq-tiny"
CHAT = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Say hi"}]


@pytest.fixture
def client(stack) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{stack.base}/v1", api_key="unused", max_retries=0)


@pytest.fixture
def aclient(stack) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{stack.base}/v1", api_key="unused", max_retries=0)


def test_models_list_and_retrieve(client) -> None:
    assert [m.id for m in client.models.list()] == [MODEL, *ADAPTER_SEEDS]  # the model, then its LoRA adapters
    assert client.models.retrieve(MODEL).id == MODEL
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("nope")


def test_chat_completion(client, stack) -> None:
    r = client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=12, temperature=0,
                                       extra_body={"ignore_eos": True})
    assert r.object == "chat.completion" and r.model == MODEL
    c = r.choices[0]
    assert c.message.role == "assistant" and c.message.content and c.finish_reason == "length"
    assert r.usage.completion_tokens == 12 and r.usage.total_tokens == r.usage.prompt_tokens + 12
    with stack.http() as http:  # the completion is an inferq job too
        job = wait_status(http, r.id)
    assert job["status"] == "succeeded" and job["text"] == c.message.content


def test_chat_stream_matches_non_stream(client) -> None:
    kw = {"model": MODEL, "messages": CHAT, "max_completion_tokens": 16, "temperature": 0, "seed": 1}
    whole = client.chat.completions.create(**kw).choices[0].message.content
    chunks = list(client.chat.completions.create(stream=True, stream_options={"include_usage": True}, **kw))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices) == whole
    assert [ch.choices[0].finish_reason for ch in chunks if ch.choices][-1] in ("stop", "length")
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens >= 1


def test_stream_interval_sends_text_in_pieces_of_that_many_tokens(client, stack) -> None:
    """vLLM's ``stream_interval``: the first token goes at once, then events of at least 4 tokens
    (under load the worker may merge more into one, never fewer), the last with what is left; the
    text is the whole answer's."""
    kw = {"model": MODEL, "messages": CHAT, "max_tokens": 14, "temperature": 0, "extra_body": {"ignore_eos": True}}
    whole = client.chat.completions.create(**kw).choices[0].message.content
    kw["extra_body"] = {"ignore_eos": True, "stream_interval": 4}
    chunks = list(client.chat.completions.create(stream=True, **kw))
    assert "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices) == whole
    log = [json.loads(f["e"]) for _, f in stack.redis.client().xrange(keys.job_log(chunks[0].id))]
    tokens = [e["n_tokens"] for e in log if e["type"] == "token"]
    assert sum(tokens) == 14 and tokens[0] == 1, tokens
    assert all(n >= 4 for n in tokens[1:-1]) and len(tokens) <= 5, tokens  # 1, 4, 4, 4, 1 at most
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(stream=True, **{**kw, "extra_body": {"stream_interval": 0}})
    assert e.value.body["param"] == "stream_interval"


def test_completions_with_prompt_list_and_n(client) -> None:
    r = client.completions.create(model=MODEL, prompt=["def a():", "def b():"], n=2, max_tokens=5,
                                  seed=3, extra_body={"ignore_eos": True})
    assert r.object == "text_completion"
    assert sorted(c.index for c in r.choices) == [0, 1, 2, 3]
    assert all(c.text and c.finish_reason == "length" for c in r.choices)
    assert r.usage.completion_tokens == 20


def test_stop_sequence(client) -> None:
    kw = {"model": MODEL, "prompt": "class A:", "max_tokens": 20, "temperature": 0, "extra_body": {"ignore_eos": True}}
    text = client.completions.create(**kw).choices[0].text
    stop = text[4:7]
    r = client.completions.create(stop=[stop], **kw).choices[0]
    assert r.finish_reason == "stop" and stop not in r.text and text.startswith(r.text)


def test_chat_logprobs(client) -> None:
    # Greedy, so the outcome is fixed. A byte-fallback token (part of a UTF-8 character) shows as
    # "\ufffd" in the text but as "" on its own, so the join is compared without those.
    r = client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=5, logprobs=True, top_logprobs=3,
                                       temperature=0)
    content = r.choices[0].logprobs.content
    assert len(content) == r.usage.completion_tokens
    assert "".join(t.token for t in content) == r.choices[0].message.content.replace("\ufffd", "")
    for t in content:
        assert t.logprob <= 0 and len(t.top_logprobs) == 3
        assert max(x.logprob for x in t.top_logprobs) >= t.logprob - 1e-4


def test_completion_logprobs(client) -> None:
    r = client.completions.create(model=MODEL, prompt="x =", max_tokens=4, logprobs=2)
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 4
    # the 2 most likely tokens and, as vLLM gives it, the sampled one (when it is not among them)
    assert lp.text_offset[0] == 0 and all(len(t) in (2, 3) for t in lp.top_logprobs)
    assert all(tok in top for tok, top in zip(lp.tokens, lp.top_logprobs, strict=True))


def test_json_schema_response_parses(client) -> None:
    schema = {"type": "object", "additionalProperties": False, "required": ["answer", "score"],
              "properties": {"answer": {"type": "string", "enum": ["yes", "no"]},
                             "score": {"type": "integer", "minimum": 0, "maximum": 9}}}
    r = client.chat.completions.create(
        model=MODEL, messages=CHAT, max_tokens=40,
        response_format={"type": "json_schema", "json_schema": {"name": "verdict", "schema": schema}})
    data = json.loads(r.choices[0].message.content)
    assert data["answer"] in ("yes", "no") and 0 <= data["score"] <= 9


def test_json_object_mode(client) -> None:
    r = client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=200, seed=5,
                                       response_format={"type": "json_object"})
    if r.choices[0].finish_reason == "stop":  # a random model may run out of tokens mid-object
        assert isinstance(json.loads(r.choices[0].message.content), dict)
    else:
        assert r.choices[0].message.content.startswith("{")


@pytest.mark.parametrize(("kwargs", "exc", "param"), [
    ({"temperature": 9}, openai.BadRequestError, "temperature"),
    ({"max_tokens": 0}, openai.BadRequestError, "max_tokens"),
    ({"n": 100}, openai.BadRequestError, "n"),
    ({"top_logprobs": 50, "logprobs": True}, openai.BadRequestError, "top_logprobs"),
    ({"logit_bias": {"one": 5}}, openai.BadRequestError, "logit_bias"),
    ({"extra_body": {"continue_final_message": True}}, openai.BadRequestError, "continue_final_message"),
    ({"stream": True, "extra_body": {"prompt_logprobs": 1}}, openai.BadRequestError, "prompt_logprobs"),
    ({"max_tokens": TINY_MAX_LEN + 1}, openai.BadRequestError, "max_tokens"),  # over the context
    ({"model": "no-such-model"}, openai.NotFoundError, "model"),
    ({"stream": True, "stream_options": {"include_usage": True, "continuous_usage_stats": True}},
     openai.BadRequestError, "stream_options.continuous_usage_stats"),
])
def test_bad_requests_raise_the_sdk_exception(client, kwargs, exc, param) -> None:
    body = {"model": MODEL, "messages": CHAT, **kwargs}
    with pytest.raises(exc) as e:
        client.chat.completions.create(**body)
    assert e.value.body["param"] == param, e.value.body


def test_what_vllm_refuses_in_the_worker_is_a_400_not_a_500(client) -> None:
    """Combinations vLLM refuses (min_tokens above max_tokens) are the client's mistake: a 400 naming
    the field (the fuzz suite found a 500 here; the gateway now refuses this one before queueing)."""
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=4, extra_body={"min_tokens": 400_000_000})
    assert "min_tokens" in e.value.body["message"] and e.value.body["param"] == "min_tokens"


def test_message_name_travels_with_the_job(client, stack) -> None:
    """The worker builds the prompt from the job's messages; their names are kept for the template."""
    messages = [{"role": "user", "content": "Say hi", "name": "alice"}, {"role": "user", "content": "hi"}]
    r = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=2)
    assert r.choices[0].finish_reason in ("stop", "length")
    assert json.loads(stack.redis.client().hget(keys.job(r.id), "request"))["messages"] == messages


def tokenized(stack, **body) -> dict:
    with stack.http() as http:
        return http.post("/tokenize", json={"model": MODEL, **body}).json()


def test_completion_prompts_of_token_ids(client, stack) -> None:
    """Token ids are the prompt as the engine sees it: the same greedy text as the string they
    encode, one job per list, and as many prompt tokens as ids."""
    ids = tokenized(stack, prompt="def f(x):")["tokens"]
    kw = {"model": MODEL, "max_tokens": 6, "temperature": 0, "extra_body": {"ignore_eos": True}}
    text = client.completions.create(prompt="def f(x):", **kw).choices[0].text
    one = client.completions.create(prompt=ids, **kw)
    assert one.choices[0].text == text and one.usage.prompt_tokens == len(ids)
    r = client.completions.create(prompt=[ids, ids[:2]], **kw)
    assert [c.index for c in r.choices] == [0, 1] and r.choices[0].text == text
    assert r.usage.prompt_tokens == len(ids) + 2 and r.usage.completion_tokens == 12
    streamed = client.completions.create(prompt=[ids], stream=True, **kw)
    assert "".join(c.choices[0].text for c in streamed if c.choices) == text


@pytest.mark.parametrize("prompt", [[[1, 2], [3, 10**6]], [5, -1]])
@pytest.mark.parametrize("stream", [False, True])
def test_a_bad_token_id_is_a_400_naming_prompt(client, prompt, stream) -> None:
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=MODEL, prompt=prompt, max_tokens=3, stream=stream)
    assert e.value.body["param"] == "prompt", e.value.body


def test_echo_puts_the_prompt_and_its_logprobs_first(client, stack) -> None:
    kw = {"model": MODEL, "prompt": "def f(x):", "max_tokens": 4, "temperature": 0, "extra_body": {"ignore_eos": True}}
    plain = client.completions.create(**kw).choices[0].text
    r = client.completions.create(echo=True, logprobs=1, **kw)
    c, n = r.choices[0], len(tokenized(stack, prompt="def f(x):")["tokens"])
    assert c.text == "def f(x):" + plain and r.usage.prompt_tokens == n and r.usage.completion_tokens == 4
    lp = c.logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == n + 4
    assert "".join(lp.tokens) == c.text and lp.text_offset[n] == len("def f(x):")
    # the prompt's first token has no log-prob (nothing comes before it); every other token has one
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    assert all(x is not None and x <= 0 for x in lp.token_logprobs[1:])
    streamed = client.completions.create(echo=True, stream=True, **kw)
    assert "".join(ch.choices[0].text for ch in streamed if ch.choices) == c.text


def test_logit_bias_steers_sampling(client, stack) -> None:
    with stack.http() as http:
        token = http.post("/detokenize", json={"model": MODEL, "tokens": [306]}).json()["prompt"]
    r = client.completions.create(model=MODEL, prompt="def f(x):", max_tokens=4, temperature=0,
                                  logit_bias={"306": 100}, extra_body={"ignore_eos": True})
    assert r.choices[0].text == token * 4
    with pytest.raises(openai.BadRequestError) as e:  # the engine's own check
        client.completions.create(model=MODEL, prompt="x", max_tokens=2, logit_bias={"99999": 1})
    assert e.value.body["param"] == "logit_bias"


def test_prompt_logprobs_as_vllm_returns_them(client, stack) -> None:
    ids = tokenized(stack, prompt="def f(x):")["tokens"]
    r = client.completions.create(model=MODEL, prompt=ids, max_tokens=2, extra_body={"prompt_logprobs": 2})
    plp = r.choices[0].model_extra["prompt_logprobs"]
    assert len(plp) == len(ids) == r.usage.prompt_tokens and plp[0] is None
    for tid, pos in zip(ids[1:], plp[1:], strict=True):  # the prompt's token at each position, and the 2 most likely
        assert str(tid) in pos and 2 <= len(pos) <= 3, pos
        assert all(v["logprob"] <= 0 and v["rank"] >= 1 and isinstance(v["decoded_token"], str)
                   for v in pos.values())
    chat = client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=2,
                                          extra_body={"prompt_logprobs": 0})
    plp = chat.model_extra["prompt_logprobs"]
    assert len(plp) == chat.usage.prompt_tokens and all(len(pos) == 1 for pos in plp[1:])


def test_continue_final_message_leaves_the_last_turn_open(client, stack) -> None:
    messages = [*CHAT, {"role": "assistant", "content": "Hello"}]
    closed = tokenized(stack, messages=messages, add_generation_prompt=False)["count"]
    r = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=2, extra_body={
        "continue_final_message": True, "add_generation_prompt": False})
    assert r.choices[0].message.content is not None
    assert r.usage.prompt_tokens < closed  # the assistant's turn was not closed: the model continues it


async def test_async_client_chat_and_stream(aclient) -> None:
    r = await aclient.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=6)
    assert r.choices[0].message.content
    stream = await aclient.completions.create(model=MODEL, prompt="import", max_tokens=6, stream=True,
                                              extra_body={"ignore_eos": True})
    pieces = [c.choices[0].text async for c in stream if c.choices]
    assert len("".join(pieces)) > 0


def test_sse_disconnect_cancels_the_job(stack) -> None:
    body = {"model": MODEL, "messages": CHAT, "max_tokens": LONG_JOB, "stream": True, "ignore_eos": True}
    with httpx.Client(base_url=stack.base, timeout=30) as http:
        for _ in range(3):  # a try where the job ran out before the close is run again (ran_out_first)
            with http.stream("POST", "/v1/chat/completions", json=body) as r:
                job_id = r.headers["x-inferq-job-id"]
                lines = r.iter_lines()
                got = [next(lines) for _ in range(6)]
                assert any(x.startswith("data: {") for x in got)
                closing_at = time.time()
            view = wait_status(http, job_id, timeout=60)
            if ran_out_first(view, closing_at):
                continue
            assert view["status"] == "cancelled", {k: view[k] for k in ("status", "finish_reason", "usage", "error")}
            assert view["usage"]["completion_tokens"] < LONG_JOB
            return
    pytest.fail("in 3 tries, the job always finished before the stream closed")


def test_raw_sse_framing(stack) -> None:
    body = {"model": MODEL, "prompt": "a", "max_tokens": 3, "stream": True, "ignore_eos": True}
    with httpx.Client(base_url=stack.base, timeout=30) as http:
        r = http.post("/v1/completions", json=body)
    assert r.headers["content-type"].startswith("text/event-stream")
    data = [x[len("data: "):] for x in r.text.splitlines() if x.startswith("data: ")]
    assert data[-1] == "[DONE]" and all(json.loads(d)["object"] == "text_completion" for d in data[:-1])


def test_a_job_refused_before_its_first_token_is_an_http_error_streamed_or_not(stack) -> None:
    """Only the worker can count a chat template, so the job fails there; a stream's response waits
    for the job's first event, so it too is a plain 400 with the error body, as vLLM answers."""
    body = {"model": MODEL, "messages": [{"role": "user", "content": "word " * TINY_MAX_LEN}], "max_tokens": 500}
    with httpx.Client(base_url=stack.base, timeout=60) as http:
        plain = http.post("/v1/chat/completions", json=body)
        streamed = http.post("/v1/chat/completions", json={**body, "stream": True})
    assert plain.status_code == 400 and plain.json()["error"]["code"] == "context_length_exceeded", plain.text
    assert streamed.status_code == 400 and streamed.headers["content-type"].startswith("application/json")
    assert streamed.json() == plain.json()
    client = openai.OpenAI(base_url=f"{stack.base}/v1", api_key="unused", max_retries=0)
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(**{**body, "stream": True})
    assert refused.value.code == "context_length_exceeded"


VLLM_BENCH = """
import argparse, sys
from vllm.benchmarks.serve import add_cli_args, main
if __name__ == "__main__":
    p = argparse.ArgumentParser(); add_cli_args(p); main(p.parse_args(sys.argv[1:]))
"""


def test_vllm_bench_serve_runs_clean_against_the_gateway(stack, tmp_path) -> None:
    """`vllm bench serve --backend openai-chat`, as shipped with vLLM, with zero failed requests."""
    import subprocess
    import sys

    with stack.http() as http:
        tokenizer = http.get("/v1/workers").json()[0]["tokenizer"]
    cmd = [sys.executable, "-c", VLLM_BENCH, "--backend", "openai-chat", "--base-url", stack.base,
           "--endpoint", "/v1/chat/completions", "--model", MODEL, "--tokenizer", tokenizer,
           "--dataset-name", "random", "--random-input-len", "32", "--random-output-len", "16",
           "--num-prompts", "24", "--ignore-eos", "--save-result", "--result-dir", str(tmp_path),
           "--result-filename", "bench.json"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    result = json.loads((tmp_path / "bench.json").read_text())
    assert result["completed"] == 24 and result["failed"] == 0
    assert result["total_output_tokens"] == 24 * 16
