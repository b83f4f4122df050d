"""``/readyz`` and ``/readyz/gateway`` (open to anyone, keys or not) while Redis is down: a generic
answer; the detail (the Redis address, the error) goes to the gateway's log only."""

from __future__ import annotations

import logging
import signal
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from inferq.api.app import create_app
from inferq.cli import procs
from inferq.shared.settings import Settings
from tests.procs import free_port


def test_readyz_with_redis_down_tells_nothing_about_redis(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    server = procs.start_redis(free_port(), tmp_path, name="redis-readyz")
    settings = Settings(redis_url=server.url, api_keys="sk-readyz", served_model_name="readyz-model")
    try:
        with TestClient(create_app(settings)) as client:
            up = client.get("/readyz")
            assert (up.status_code, up.json()) == (503, {"status": "unavailable", "redis": "ok",
                                                         "model": "readyz-model", "workers": 0})
            gateway_up = client.get("/readyz/gateway")  # workers not counted: the gateway can queue
            assert (gateway_up.status_code, gateway_up.json()) == (200, {"status": "ready", "redis": "ok"})
            server.stop(signal.SIGKILL)
            with caplog.at_level(logging.WARNING, logger="inferq.api.routes.health"):
                down = client.get("/readyz")
                health = client.get("/health")
                gateway_down = client.get("/readyz/gateway")
    finally:
        server.stop(signal.SIGKILL)
    assert down.status_code == 503
    assert down.json() == {"status": "unavailable", "redis": "unreachable", "model": "readyz-model"}
    assert (health.status_code, health.content) == (503, b"")
    assert (gateway_down.status_code, gateway_down.json()) == (503, {"status": "unavailable", "redis": "unreachable"})
    detail = [r.getMessage() for r in caplog.records if r.name == "inferq.api.routes.health"]
    assert detail and all(str(server.port) in d for d in detail), detail  # the operator still learns where and why
    assert any(d.startswith("gateway not ready") for d in detail), detail
