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


def test_tokenize_round_trip_and_refusals(redis_server) -> None:
    with app(redis_server.url) as c:
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


def test_without_a_tokenizer_it_is_503(redis_server, tmp_path: Path) -> None:
    with app(redis_server.url, tokenizer_path=tmp_path) as c:
        r = c.post("/tokenize", json={"prompt": "x"})
        assert (r.status_code, r.json()["error"]["code"]) == (503, "tokenizer_unavailable")
