"""``/readyz`` (open to anyone, keys or not) while Redis is down: a generic answer; the detail (the
Redis address, the error) goes to the gateway's log only."""

from __future__ import annotations

import logging
import signal
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from inferq.api.app import create_app
from inferq.cli import procs
from inferq.shared.settings import Settings


def test_readyz_with_redis_down_tells_nothing_about_redis(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    server = procs.start_redis(procs.free_port(), tmp_path, name="redis-readyz")
    settings = Settings(redis_url=server.url, api_keys="sk-readyz", served_model_name="readyz-model")
    try:
        with TestClient(create_app(settings)) as client:
            up = client.get("/readyz")
            assert (up.status_code, up.json()) == (503, {"status": "unavailable", "redis": "ok",
                                                         "model": "readyz-model", "workers": 0})
            server.stop(signal.SIGKILL)
            with caplog.at_level(logging.WARNING, logger="inferq.api.routes.health"):
                down = client.get("/readyz")
                health = client.get("/health")
    finally:
        server.stop(signal.SIGKILL)
    assert down.status_code == 503
    assert down.json() == {"status": "unavailable", "redis": "unreachable", "model": "readyz-model"}
    assert (health.status_code, health.content) == (503, b"")
    detail = [r.getMessage() for r in caplog.records if r.name == "inferq.api.routes.health"]
    assert detail and str(server.port) in detail[0], detail  # the operator still learns where and why
