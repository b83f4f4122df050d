"""LoRA adapters per request on the session stack (its workers serve ``tiny-a`` and ``tiny-b``,
random adapters the suite writes; the gateway allows run-time loads): every endpoint takes an
adapter's name as ``model``, /v1/models lists adapters with their parent, run-time loads reach the
whole fleet, and a bad adapter is refused without harming a worker. That each adapter's text is
vLLM's own is the differential suite's (test_openai_diff.py)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import httpx
import openai
import pytest

from inferq.shared import keys
from inferq.shared.settings import Settings
from inferq.worker.engine.models import tiny_model_dir
from tests.helpers import submit, token_text, wait_status, ws_events
from tests.lora import build_tiny_adapter
from tests.wait import eventually

BASE = "inferq-tiny"
GREEDY = {"max_tokens": 12, "temperature": 0}


@pytest.fixture(scope="module")
def http(stack) -> httpx.Client:
    with stack.http() as c:
        yield c


@pytest.fixture(scope="module")
def client(stack) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{stack.base}/v1", api_key="unused", max_retries=0)


def polled_text(http: httpx.Client, model: str, prompt: str = "def main():") -> dict:
    view = wait_status(http, submit(http, prompt=prompt, model=model, **GREEDY))
    assert view["status"] == "succeeded", view
    return view


def test_models_lists_each_adapter_with_its_parent(http, lora_adapters) -> None:
    cards = {m["id"]: m for m in http.get("/v1/models").json()["data"]}
    for name, folder in lora_adapters.items():
        assert cards[name]["parent"] == BASE and "root" not in cards[name] and str(folder) not in str(cards), cards
        assert cards[name]["max_model_len"] == cards[BASE]["max_model_len"]
        one = http.get(f"/v1/models/{name}")
        assert one.status_code == 200 and one.json()["parent"] == BASE
    assert cards[BASE]["parent"] is None


def test_every_endpoint_runs_the_adapter_it_names(stack, http, client) -> None:
    """REST, WebSocket, chat, completions and the Responses API give an adapter's jobs its text and
    its name; the base model's text differs."""
    rest = polled_text(http, "tiny-a")
    assert rest["model"] == "tiny-a"
    assert rest["text"] != polled_text(http, BASE)["text"]
    events = asyncio.run(ws_events(f"{stack.ws}/v1/generate",
                                   {"prompt": "def main():", "model": "tiny-a", **GREEDY}))
    assert events[0] == {"type": "accepted", "id": events[0]["id"], "model": "tiny-a"}
    assert token_text(events) == rest["text"]
    done = client.completions.create(model="tiny-a", prompt="def main():", **GREEDY)
    assert done.model == "tiny-a" and done.choices[0].text == rest["text"]
    chat = client.chat.completions.create(model="tiny-b", messages=[{"role": "user", "content": "hi"}], **GREEDY)
    streamed = client.chat.completions.create(model="tiny-b", messages=[{"role": "user", "content": "hi"}],
                                              stream=True, **GREEDY)
    chunks = list(streamed)
    assert {c.model for c in chunks} == {"tiny-b"}
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == chat.choices[0].message.content
    resp = client.responses.create(model="tiny-b", input="hi", max_output_tokens=12, temperature=0)
    assert resp.model == "tiny-b" and resp.status in ("completed", "incomplete"), resp  # incomplete: max tokens


def test_a_batch_runs_each_line_on_the_adapter_it_names(client) -> None:
    rows = [{"custom_id": name, "method": "POST", "url": "/v1/completions",
             "body": {"model": name, "prompt": "def main():", **GREEDY}} for name in (BASE, "tiny-a")]
    up = client.files.create(file=("lines.jsonl", "\n".join(map(json.dumps, rows)).encode()), purpose="batch")
    batch = client.batches.create(input_file_id=up.id, endpoint="/v1/completions", completion_window="24h")
    batch = eventually(lambda: client.batches.retrieve(batch.id), 120, "the batch to end",
                       until=lambda b: b.status in ("completed", "failed", "cancelled"))
    assert batch.status == "completed" and batch.request_counts.completed == 2, batch
    out = {(line := json.loads(raw))["custom_id"]: line["response"]["body"]
           for raw in client.files.content(batch.output_file_id).text.splitlines()}
    assert out["tiny-a"]["model"] == "tiny-a" and out[BASE]["model"] == BASE
    direct = client.completions.create(model="tiny-a", prompt="def main():", **GREEDY)
    assert out["tiny-a"]["choices"][0]["text"] == direct.choices[0].text


def test_an_unknown_model_is_404_before_it_is_queued(stack, http) -> None:
    r = stack.redis.client()
    before = r.zcard(keys.QUEUED)
    got = http.post("/v1/jobs", json={"prompt": "x", "model": "tiny-nope"})
    assert got.status_code == 404 and got.json()["error"]["param"] == "model", got.text
    assert http.post("/v1/chat/completions", json={"model": "tiny-nope", "messages": [
        {"role": "user", "content": "x"}]}).status_code == 404
    assert r.zcard(keys.QUEUED) <= before


def test_an_adapter_tokenizes_as_its_base_model(http) -> None:
    a, b = (http.post("/tokenize", json={"model": m, "prompt": "def main():"}) for m in ("tiny-a", BASE))
    assert a.status_code == 200 and a.json()["tokens"] == b.json()["tokens"]


def test_load_and_unload_at_run_time_reach_the_whole_fleet(stack, http, tmp_path: Path) -> None:
    folder = build_tiny_adapter(tmp_path / "tiny-c", tiny_model_dir(Settings()), seed=3)
    got = http.post("/v1/load_lora_adapter", json={"lora_name": "tiny-c", "lora_path": str(folder)})
    assert got.status_code == 200 and got.text == "Success: LoRA adapter 'tiny-c' added successfully."
    try:
        again = http.post("/v1/load_lora_adapter", json={"lora_name": "tiny-c", "lora_path": str(folder)})
        assert again.status_code == 400 and again.json()["error"]["code"] == "adapter_exists"
        assert "tiny-c" in {m["id"] for m in http.get("/v1/models").json()["data"]}
        view = polled_text(http, "tiny-c")
        assert view["model"] == "tiny-c" and view["text"] != polled_text(http, "tiny-a")["text"]
        # /v1/workers is what the heartbeats last said: the load shows at the next beat
        workers = eventually(lambda: http.get("/v1/workers").json(), 15, "a worker to list the adapter",
                             until=lambda ws: any("tiny-c" in w["adapters"] for w in ws))
        assert all(w["max_loras"] >= 1 for w in workers)
    finally:  # the stack is shared by the session: never leave the adapter behind for other tests
        gone = http.post("/v1/unload_lora_adapter", json={"lora_name": "tiny-c"})
    assert gone.status_code == 200 and gone.text == "Success: LoRA adapter 'tiny-c' removed successfully."
    eventually(lambda: http.post("/v1/jobs", json={"prompt": "x", "model": "tiny-c"}).status_code, 10,
               "jobs for the unloaded adapter to be refused", until=lambda status: status == 404)
    assert http.post("/v1/unload_lora_adapter", json={"lora_name": "tiny-c"}).status_code == 404
    eventually(lambda: http.get("/v1/workers").json(), 15, "the workers to drop the adapter",
               until=lambda ws: all("tiny-c" not in w["adapters"] for w in ws))


def test_an_adapter_the_engine_refuses_is_400_and_harms_no_worker(http, tmp_path: Path) -> None:
    """A missing folder, a malformed config, a rank above INFERQ_MAX_LORA_RANK: the load is refused
    with the engine's reason and the name stays free; the workers go on serving."""
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "adapter_config.json").write_text("{not json")
    too_big = build_tiny_adapter(tmp_path / "rank64", tiny_model_dir(Settings()), seed=4, rank=64)
    for name, path in (("tiny-missing", tmp_path / "nothing"), ("tiny-broken", broken), ("tiny-rank", too_big)):
        got = http.post("/v1/load_lora_adapter", json={"lora_name": name, "lora_path": str(path)})
        assert got.status_code == 400, got.text
        error = got.json()["error"]
        assert error["code"] == "adapter_load_failed" and error["param"] == "lora_path" and name in error["message"]
        assert http.post("/v1/jobs", json={"prompt": "x", "model": name}).status_code == 404
    assert polled_text(http, BASE)["status"] == "succeeded"
    assert polled_text(http, "tiny-b")["status"] == "succeeded"


def test_a_deleted_adapter_fails_its_job_not_the_fleet(stack, http, tmp_path: Path) -> None:
    """Load an adapter, use it, delete its folder, load more adapters than an engine keeps (every
    worker loads each: the engines drop it), then ask for it again: the job fails with the reason
    (the worker loads an adapter the engine may have dropped through add_lora, and refuses a folder
    that is gone), instead of the engine loading it itself and dying, and the job, handed back,
    killing the next worker too."""
    base = tiny_model_dir(Settings())
    names = ["tiny-del", *(f"tiny-o{i}" for i in range(5))]  # the engines keep INFERQ_MAX_LORAS (4)
    workers = {w["id"] for w in http.get("/v1/workers").json()}
    folders = {name: build_tiny_adapter(tmp_path / name, base, seed=20 + i) for i, name in enumerate(names)}
    try:
        assert http.post("/v1/load_lora_adapter", json={"lora_name": "tiny-del", "lora_path": str(folders["tiny-del"])}
                         ).status_code == 200
        assert polled_text(http, "tiny-del")["status"] == "succeeded"
        for path in folders["tiny-del"].iterdir():
            path.unlink()
        folders["tiny-del"].rmdir()
        for name in names[1:]:
            assert http.post("/v1/load_lora_adapter", json={"lora_name": name, "lora_path": str(folders[name])}
                             ).status_code == 200
        view = wait_status(http, submit(http, prompt="def main():", model="tiny-del", **GREEDY))
        assert view["status"] == "failed" and view["error"]["code"] == "adapter_load_failed", view
        assert "is gone" in view["error"]["message"]
        assert polled_text(http, BASE)["status"] == "succeeded"
        assert polled_text(http, "tiny-o0")["status"] == "succeeded"
        assert {w["id"] for w in http.get("/v1/workers").json()} == workers  # no worker died and came back
    finally:  # the stack is shared by the session
        for name in names:
            http.post("/v1/unload_lora_adapter", json={"lora_name": name})
