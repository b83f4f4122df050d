"""Embeddings through the queue: a worker running the built-in tiny embedding model
(INFERQ_RUNNER=pooling) behind a gateway, against vLLM's own OpenAI server on the same model
(``--runner pooling --convert embed``): the same vectors for the same requests, the same refusals;
the openai SDK (which asks for base64 by default) and LangChain's ``OpenAIEmbeddings``; the Batch
API with ``/v1/embeddings`` lines; and the model's kind enforced both ways.

The embedding fleet has a Redis of its own, so the session stack's model list stays as it is.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from inferq.cli.procs import start_redis
from tests.conftest import Service, ahead, free_port, http_ok, inferq_env, quiet_port, spawn, take
from tests.wait import eventually

pytestmark = pytest.mark.integration
EMBED = "inferq-tiny-embed"
TEXTS = ["The sky is blue", "Grass is green", "def main():"]
# Both run float32 on the same CPU kernels, but a prompt whose prefix is in the prefix cache is
# computed in other pieces than a cold one (seen: up to 1e-3 on one component of a unit vector)
TOL = 5e-3
MIN_COSINE = 0.9999


@dataclass
class EmbedFleet:
    base: str
    procs: list[Any]

    def stop(self) -> None:
        for p in reversed(self.procs):
            p.stop()


@ahead("embed_fleet")
def start_embed_fleet(request: pytest.FixtureRequest) -> EmbedFleet:
    """Redis, a pooling worker on the built-in embedding model, a gateway (not waited for)."""
    logdir = request.getfixturevalue("logdir")
    redis = start_redis(free_port(), logdir, name="redis-embed")
    py = [sys.executable, "-m", "inferq.cli"]
    worker = spawn("worker-embed", [*py, "worker"], inferq_env(redis.url, INFERQ_WORKER_ID="e1",
                                                               INFERQ_RUNNER="pooling"), logdir)
    port = quiet_port()
    gateway = spawn("gateway-embed", [*py, "api", "--port", str(port)], inferq_env(redis.url), logdir)
    return EmbedFleet(f"http://127.0.0.1:{port}", [redis, worker, gateway])


@pytest.fixture(scope="module")
def embed_fleet(request: pytest.FixtureRequest) -> Iterator[str]:
    fleet: EmbedFleet = take("embed_fleet", request)
    try:
        eventually(lambda: http_ok(f"{fleet.base}/v1/workers?model={EMBED}", lambda ws: len(ws) == 1), 300,
                   "the embedding worker", procs=fleet.procs[1:], interval=0.2)
        yield fleet.base
    finally:
        fleet.stop()


@ahead("vllm_embed_server")
def start_vllm_embed_server(request: pytest.FixtureRequest) -> Service:
    """vLLM's OpenAI server on the built-in embedding model, with a worker's engine arguments."""
    from bench.inprocess import engine_args
    from bench.vllm_serve import flags
    from inferq.shared.settings import Settings
    from inferq.worker.engine.models import resolve_model

    settings = {"max_num_seqs": 64, "cpu_kv_cache_gib": 0.5, "runner": "pooling"}
    path = resolve_model(Settings(**settings))
    port = quiet_port()
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--host", "127.0.0.1", "--port", str(port),
           *flags(engine_args({"model_path": path, "settings": settings}))]
    service = spawn("vllm-embed", cmd, {**os.environ, "VLLM_NO_USAGE_STATS": "1"}, request.getfixturevalue("logdir"))
    service.base = f"http://127.0.0.1:{port}"  # type: ignore[attr-defined]
    return service


@pytest.fixture(scope="module")
def vllm_embed(request: pytest.FixtureRequest) -> Iterator[str]:
    service = take("vllm_embed_server", request)
    try:
        eventually(lambda: http_ok(f"{service.base}/health"), 240, "vLLM's embedding server", procs=[service],
                   interval=0.2)
        yield service.base
    finally:
        service.stop()


def shape(body: Any, path: str = "") -> dict[str, str]:
    """Each field's JSON type by its path (list items merged), as a client reads the answer."""
    if isinstance(body, dict):
        return {k: v for key, x in body.items() for k, v in shape(x, f"{path}.{key}").items()} | {path or ".": "object"}
    if isinstance(body, list):
        return {k: v for x in body[:1] for k, v in shape(x, f"{path}[]").items()} | {path: "array"}
    return {path: type(body).__name__}


def vectors(body: dict[str, Any]) -> list[list[float]]:
    import base64
    from array import array

    out = []
    for d in sorted(body["data"], key=lambda d: d["index"]):
        e = d["embedding"]
        if isinstance(e, str):
            a = array("f")
            a.frombytes(base64.b64decode(e))
            e = a.tolist()
        out.append(e)
    return out


def plain_vectors(base: str) -> list[list[float]]:
    """The vectors of TEXTS as ``encoding_format: float`` gives them."""
    return vectors(httpx.post(f"{base}/v1/embeddings", json={"model": EMBED, "input": TEXTS}, timeout=120).json())


def gap(a: list[list[float]], b: list[list[float]]) -> float:
    """The largest difference between two lists of vectors (inf if their shapes differ)."""
    if [len(x) for x in a] != [len(y) for y in b]:
        return math.inf
    return max((abs(p - q) for x, y in zip(a, b, strict=True) for p, q in zip(x, y, strict=True)), default=0.0)


def close(a: list[list[float]], b: list[list[float]]) -> bool:
    """The same vectors within float32 noise: each component within TOL, each pair's cosine at
    least MIN_COSINE."""
    def cos(x: list[float], y: list[float]) -> float:
        return math.fsum(p * q for p, q in zip(x, y, strict=True)) / math.sqrt(
            math.fsum(p * p for p in x) * math.fsum(q * q for q in y))

    return gap(a, b) <= TOL and all(cos(x, y) >= MIN_COSINE for x, y in zip(a, b, strict=True))


CASES: dict[str, dict[str, Any]] = {
    "one text": {"input": "The sky is blue"},
    "texts": {"input": TEXTS},
    "token ids": {"input": [1882, 306, 77, 91, 338]},
    "lists of token ids": {"input": [[1882, 306, 77], [91, 338]]},
    "base64": {"input": TEXTS, "encoding_format": "base64"},
    "dimensions 64": {"input": TEXTS, "dimensions": 64},
    "truncate_prompt_tokens": {"input": TEXTS, "truncate_prompt_tokens": 3},
    "no special tokens": {"input": TEXTS, "add_special_tokens": False},
    "no activation": {"input": TEXTS[:1], "use_activation": False},
}
REFUSED: dict[str, dict[str, Any]] = {
    "dimensions not a Matryoshka size": {"input": "x", "dimensions": 100},
    "input over the context window": {"input": "x " * 9000},
    "token id out of vocabulary": {"input": [1, 99999]},
    "empty input list": {"input": []},
    "unknown model": {"model": "nope", "input": "x"},
}


def test_embeddings_are_vllm_serves_vectors(embed_fleet: str, vllm_embed: str) -> None:
    """Each request answers as ``vllm serve`` answers it: status, the answer's fields and their JSON
    types, the usage, and the vectors (within float32 noise)."""
    with httpx.Client(base_url=embed_fleet, timeout=120) as ours, \
            httpx.Client(base_url=vllm_embed, timeout=120) as theirs:
        for case, body in CASES.items():
            a, b = (c.post("/v1/embeddings", json={"model": EMBED, **body}) for c in (ours, theirs))
            assert a.status_code == b.status_code == 200, (case, a.text, b.text[:300])
            ja, jb = a.json(), b.json()
            assert shape(ja) == shape(jb), case
            assert ja["model"] == jb["model"] == EMBED and ja["usage"] == jb["usage"], (case, ja["usage"], jb["usage"])
            assert close(vectors(ja), vectors(jb)), (case, gap(vectors(ja), vectors(jb)))
        for case, body in REFUSED.items():
            a, b = (c.post("/v1/embeddings", json={"model": EMBED, **body}) for c in (ours, theirs))
            assert a.status_code == b.status_code and a.status_code in (400, 404), (case, a.text, b.text[:300])
            assert a.json()["error"]["message"], case


def test_requests_that_meet_each_get_their_own_answer(embed_fleet: str, vllm_embed: str) -> None:
    """One-input requests of one client sent together (which a gateway may answer from jobs they share:
    api/embed_coalesce.py) each get what ``vllm serve`` gives that request alone: its vectors, its usage;
    one over the context window among them gets its own 400, naming its own input, and the rest are
    answered."""
    texts = [f"sentence {i}: " + "the sky is blue " * (1 + i % 5) for i in range(24)]
    bodies: list[dict[str, Any]] = [{"model": EMBED, "input": t} for t in texts]
    bodies[7] = {"model": EMBED, "input": "x " * 9000}
    bodies[11] = {"model": EMBED, "input": texts[11], "encoding_format": "base64"}

    async def send(base: str) -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=base, timeout=120) as c:
            return await asyncio.gather(*(c.post("/v1/embeddings", json=b) for b in bodies))

    ours, theirs = asyncio.run(send(embed_fleet)), asyncio.run(send(vllm_embed))
    for i, (a, b) in enumerate(zip(ours, theirs, strict=True)):
        assert a.status_code == b.status_code == (400 if i == 7 else 200), (i, a.text[:300], b.text[:300])
        if i == 7:
            assert "input 0 has" in a.json()["error"]["message"], a.text
            continue
        ja, jb = a.json(), b.json()
        assert ja["usage"] == jb["usage"] and len(ja["data"]) == 1, (i, ja["usage"], jb["usage"])
        assert close(vectors(ja), vectors(jb)), (i, gap(vectors(ja), vectors(jb)))


POOLING_CASES: dict[str, tuple[str, dict[str, Any]]] = {
    "pooling": ("/pooling", {"input": TEXTS}),
    "score 1:N": ("/score", {"text_1": "The sky", "text_2": TEXTS}),
    "score N:N": ("/score", {"text_1": TEXTS, "text_2": TEXTS[::-1]}),
    "score queries/documents": ("/score", {"queries": "The sky", "documents": TEXTS}),
    "rerank": ("/rerank", {"query": "The sky", "documents": TEXTS}),
    "rerank top_n": ("/v1/rerank", {"query": "The sky", "documents": TEXTS, "top_n": 2}),
    # what Cohere-style clients send: LiteLLM always return_documents (null too), the cohere SDK
    # max_tokens_per_doc; vLLM cuts with max_tokens_per_*, ignores max_chunks_per_doc and rank_fields
    "rerank return_documents null": ("/rerank", {"query": "The sky", "documents": TEXTS, "return_documents": None}),
    "rerank Cohere fields": ("/v1/rerank", {"query": "The sky", "documents": TEXTS, "return_documents": True,
                                            "max_tokens_per_doc": 512, "max_chunks_per_doc": 4,
                                            "rank_fields": ["text"]}),
    "rerank max_tokens_per_doc cuts": ("/rerank", {"query": "The sky is", "documents": TEXTS, "max_tokens_per_doc": 2}),
    "score max_tokens_per_query cuts": ("/score", {"text_1": "The sky is blue today", "text_2": TEXTS,
                                                   "max_tokens_per_query": 2}),
}
POOLING_REFUSED: dict[str, tuple[str, dict[str, Any]]] = {
    "score 2:3": ("/score", {"text_1": TEXTS[:2], "text_2": TEXTS}),
    "rerank no documents": ("/rerank", {"query": "x", "documents": []}),
}


def numbers(body: Any) -> list[float]:
    """Every float of an answer in order of its fields (vectors, scores), for a tolerant compare."""
    if isinstance(body, dict):
        return [x for k in sorted(body) if k not in ("created", "id") for x in numbers(body[k])]
    if isinstance(body, list):
        return [x for v in body for x in numbers(v)]
    return [body] if isinstance(body, float) else []


def test_pooling_score_and_rerank_are_vllm_serves(embed_fleet: str, vllm_embed: str) -> None:
    """vLLM's pooling extras on an embedding model answer as ``vllm serve``: the pooler's output,
    each pair's cosine similarity, the documents in the same order with the same scores."""
    with httpx.Client(base_url=embed_fleet, timeout=120) as ours, \
            httpx.Client(base_url=vllm_embed, timeout=120) as theirs:
        for case, (path, body) in POOLING_CASES.items():
            a, b = (c.post(path, json={"model": EMBED, **body}) for c in (ours, theirs))
            assert a.status_code == b.status_code == 200, (case, a.text, b.text[:300])
            ja, jb = a.json(), b.json()
            assert shape(ja) == shape(jb) and ja["usage"] == jb["usage"], (case, ja, jb)
            x, y = numbers(ja), numbers(jb)
            assert len(x) == len(y) and max(abs(p - q) for p, q in zip(x, y, strict=True)) <= TOL, case
            if "results" in ja:
                assert [r["index"] for r in ja["results"]] == [r["index"] for r in jb["results"]], case
        for case, (path, body) in POOLING_REFUSED.items():
            a, b = (c.post(path, json={"model": EMBED, **body}) for c in (ours, theirs))
            assert a.status_code == b.status_code == 400, (case, a.text, b.text[:300])
        # the cut cases really cut: fewer tokens embedded than without the option
        for case, option in (("rerank max_tokens_per_doc cuts", "max_tokens_per_doc"),
                             ("score max_tokens_per_query cuts", "max_tokens_per_query")):
            path, body = POOLING_CASES[case]
            whole = {k: v for k, v in body.items() if k != option}
            cut, full = (ours.post(path, json={"model": EMBED, **b}).json()["usage"]["prompt_tokens"]
                         for b in (body, whole))
            assert cut < full, (case, cut, full)
        # return_documents false leaves the documents out (vLLM ignores the field and sends them)
        got = ours.post("/rerank", json={"model": EMBED, "query": "x", "documents": TEXTS, "return_documents": False})
        assert got.status_code == 200 and [r["document"] for r in got.json()["results"]] == [None] * len(TEXTS)


def test_matryoshka_sizes_and_normalization(embed_fleet: str) -> None:
    """Vectors are unit length (the pooler normalizes), at the model's size or the size asked for,
    and a cut vector is the full one's head, normalized again (within float32 noise, as ``close``)."""
    with httpx.Client(base_url=embed_fleet, timeout=120) as c:
        full = vectors(c.post("/v1/embeddings", json={"model": EMBED, "input": TEXTS}).json())
        cut = vectors(c.post("/v1/embeddings", json={"model": EMBED, "input": TEXTS, "dimensions": 32}).json())
    assert [len(v) for v in full] == [256] * 3 and [len(v) for v in cut] == [32] * 3
    for f, k in zip(full, cut, strict=True):
        assert abs(math.fsum(x * x for x in f) - 1) < 1e-4 and abs(math.fsum(x * x for x in k) - 1) < 1e-4
        norm = math.sqrt(math.fsum(x * x for x in f[:32]))
        # the two requests may be computed in other pieces (prefix cache, batch): float32 noise
        assert close([[x / norm for x in f[:32]]], [k])
    assert full[0] != full[1]  # different texts, different vectors


def test_openai_sdk_and_langchain_get_the_same_vectors(embed_fleet: str) -> None:
    """The openai SDK (base64 on the wire by default, decoded by the SDK) and LangChain's
    ``OpenAIEmbeddings`` get the vectors that ``encoding_format: float`` returns."""
    from langchain_openai import OpenAIEmbeddings
    from openai import OpenAI

    plain = plain_vectors(embed_fleet)
    sdk = OpenAI(base_url=f"{embed_fleet}/v1", api_key="unused", max_retries=0)
    got = sdk.embeddings.create(model=EMBED, input=TEXTS)
    assert close([d.embedding for d in got.data], plain) and got.usage.prompt_tokens > 0
    assert close([sdk.embeddings.create(model=EMBED, input=TEXTS[0], encoding_format="float").data[0].embedding],
                 plain[:1])
    # LangChain tokenizes with tiktoken unless told not to (an OpenAI-only tokenizer, a download)
    lc = OpenAIEmbeddings(model=EMBED, base_url=f"{embed_fleet}/v1", api_key="unused",  # type: ignore[arg-type]
                          check_embedding_ctx_length=False, max_retries=0)
    assert close(lc.embed_documents(TEXTS), plain)
    assert close([lc.embed_query(TEXTS[1])], plain[1:2])


def test_a_batch_of_embedding_lines(embed_fleet: str) -> None:
    """``/v1/embeddings`` as a batch endpoint: each line's body is the endpoint's answer (the same
    vectors), and a line the endpoint refuses gets its error."""
    from openai import OpenAI

    sdk = OpenAI(base_url=f"{embed_fleet}/v1", api_key="unused", max_retries=0)
    lines = [{"custom_id": f"r{i}", "method": "POST", "url": "/v1/embeddings",
              "body": {"model": EMBED, "input": TEXTS[i % 3], "encoding_format": "float"}} for i in range(6)]
    lines.append({"custom_id": "bad", "method": "POST", "url": "/v1/embeddings",
                  "body": {"model": EMBED, "input": "x", "dimensions": 100}})
    f = sdk.files.create(file=("in.jsonl", "\n".join(map(json.dumps, lines)).encode()), purpose="batch")
    batch = sdk.batches.create(input_file_id=f.id, endpoint="/v1/embeddings", completion_window="24h")
    done = eventually(lambda: sdk.batches.retrieve(batch.id), 120, "the batch to end",
                      until=lambda b: b.status in ("completed", "failed", "expired", "cancelled"), interval=0.5)
    assert done.status == "completed" and done.request_counts.completed == 6 and done.request_counts.failed == 1
    out = {o["custom_id"]: o for o in map(json.loads, sdk.files.content(done.output_file_id).text.splitlines())}
    err = {o["custom_id"]: o for o in map(json.loads, sdk.files.content(done.error_file_id).text.splitlines())}
    plain = plain_vectors(embed_fleet)
    for i in range(6):
        body = out[f"r{i}"]["response"]["body"]
        assert out[f"r{i}"]["response"]["status_code"] == 200
        assert close(vectors(body), [plain[i % 3]]), gap(vectors(body), [plain[i % 3]])
    assert err["bad"]["response"]["status_code"] == 400


def test_each_model_does_only_its_own_kind(embed_fleet: str, stack) -> None:
    """An embedding model refuses text generation, and a generation model refuses embeddings, with
    a 400 naming ``model`` (before the job is queued: the gateway knows the model's workers)."""
    with httpx.Client(base_url=embed_fleet, timeout=60) as c:
        r = c.post("/v1/chat/completions", json={"model": EMBED, "messages": [{"role": "user", "content": "hi"}]})
        assert r.status_code == 400 and r.json()["error"]["param"] == "model", r.text
        assert r.json()["error"]["code"] == "model_task_unsupported"
    with httpx.Client(base_url=stack.base, timeout=60) as c:
        r = c.post("/v1/embeddings", json={"model": "inferq-tiny", "input": "hi"})
        assert r.status_code == 400 and r.json()["error"]["param"] == "model", r.text
