"""Scale to zero and back, against a real gateway with no worker at all.

The gateway's container runs as deploy/k8s/gateway.yaml runs it (its command, the ConfigMap's
settings, API keys on), with a real Redis. Every probe the manifests and docker-compose.yml give
the gateway must answer 200 there: a gateway that is not ready without workers leaves the Service
with no endpoint once KEDA has taken the workers to zero, nothing can be queued, and the workers
never come back. And a job queued there, at any priority, must be seen by the ScaledObject's
triggers as KEDA reads them (a Redis list's length, the Prometheus query on the gateway's metrics)
above their activation thresholds: that is what wakes the workers from zero.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
import yaml
from prometheus_client.parser import text_string_to_metric_families

from inferq.cli.procs import Proc, http_ok
from inferq.shared import keys
from tests.procs import free_port
from tests.unit.test_deploy import ROOT, _config, _one
from tests.wait import eventually

KEY = "sk-zero-workers"
PROBES = ("startupProbe", "livenessProbe", "readinessProbe")


def _container() -> dict[str, Any]:
    [c] = _one("Deployment", "gateway")["spec"]["template"]["spec"]["containers"]
    return c


def _command(port: int) -> list[str]:
    """The container's command, on this venv's ``inferq``, bound to loopback at ``port``."""
    cmd = list(_container()["command"])
    assert cmd[0] == "inferq"
    cmd[0] = str(Path(sys.executable).parent / "inferq")
    cmd[cmd.index("--host") + 1] = "127.0.0.1"
    cmd[cmd.index("--port") + 1] = str(port)
    return cmd


@pytest.fixture(scope="module")
def gateway(own_redis: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("INFERQ_")}
    folder = tmp_path_factory.mktemp("gateway-zero")
    (folder / "keys").write_text(f"{KEY} operator priority=0-9\n")  # a key that may queue at every priority
    env.update(_config(), INFERQ_REDIS_URL=own_redis, INFERQ_API_KEYS_FILE=str(folder / "keys"),
               PYTHONUNBUFFERED="1")
    log = folder / "gateway.log"
    gw = Proc("gateway-zero-workers", _command(port), env, log)
    base = f"http://127.0.0.1:{port}"
    try:
        eventually(lambda: http_ok(f"{base}/healthz"), 60, "the gateway", procs=[gw], interval=0.2)
        yield base
    finally:
        gw.stop()


def _gateway_probes() -> list[tuple[str, str]]:
    """(where, path) of every HTTP probe of the gateway: Kubernetes' and the compose healthcheck's."""
    c = _container()
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    command_port = int(c["command"][c["command"].index("--port") + 1])
    found = []
    for kind in PROBES:
        if kind in c:
            get = c[kind]["httpGet"]
            assert ports.get(get["port"], get["port"]) == command_port, (kind, get)
            found.append((f"k8s {kind}", get["path"]))
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]["api"]
    [url] = re.findall(r"http://127\.0\.0\.1:8000(/[^'\"]*)", " ".join(compose["healthcheck"]["test"]))
    found.append(("compose healthcheck", url))
    return found


def test_every_gateway_probe_passes_with_zero_workers(gateway: str) -> None:
    probes = _gateway_probes()
    assert {where for where, _ in probes} >= {"k8s livenessProbe", "k8s readinessProbe", "compose healthcheck"}
    for where, path in probes:
        r = httpx.get(gateway + path, timeout=10)  # no key: a kubelet sends none
        assert r.status_code == 200, (where, path, r.status_code, r.text)
    # /readyz keeps its meaning for clients: no worker serves the model yet
    assert httpx.get(f"{gateway}/readyz", timeout=10).json()["workers"] == 0


def _prometheus_value(query: str, metrics_text: str) -> float:
    """The trigger's query over one gateway's scrape: ``sum(max without (instance, pod) (M{model="X"}))``
    is, for one target, the sum of M's series with that model."""
    shape = re.fullmatch(r'sum\(max without \(instance, pod\) \((\w+)\{model="([^"]+)"\}\)\)', query)
    assert shape, f"a query this test cannot evaluate: {query}"
    metric, model = shape.groups()
    return sum(s.value for fam in text_string_to_metric_families(metrics_text) for s in fam.samples
               if s.name == metric and s.labels.get("model") == model)


@pytest.mark.parametrize("priority", list(keys.PRIORITIES))
def test_a_job_queued_with_zero_workers_activates_the_scaler(gateway: str, own_redis: str, priority: int) -> None:
    triggers = _one("ScaledObject", "worker")["spec"]["triggers"]
    lists = [t["metadata"] for t in triggers if t["type"] == "redis"]
    [prom] = [t["metadata"] for t in triggers if t["type"] == "prometheus"]
    r = redis.Redis.from_url(own_redis, decode_responses=True)
    r.flushdb()
    assert all(r.llen(t["listName"]) == 0 for t in lists)
    auth = {"Authorization": f"Bearer {KEY}"}
    sent = httpx.post(f"{gateway}/v1/jobs", headers=auth, timeout=30,
                      json={"prompt": "wake up", "max_tokens": 1, "priority": priority})
    assert sent.status_code == 202, sent.text
    active = [t["listName"] for t in lists if r.llen(t["listName"]) > int(t.get("activationListLength", 0))]
    assert active, f"no redis trigger sees the job; it sits in {list(r.keys('inferq.q.*'))}"
    scraped = httpx.get(f"{gateway}/metrics", timeout=30).text
    assert _prometheus_value(prom["query"], scraped) > float(prom.get("activationThreshold", 0))
    httpx.delete(f"{gateway}/v1/jobs/{sent.json()['id']}", headers=auth, timeout=30)
