"""The metrics, as a real Prometheus server scrapes them: a gateway of two processes and both
workers of the session stack; jobs over REST, WebSocket and the OpenAI SDK; one 429. Every
counter must move by exactly what the test did, read back through Prometheus' query API."""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml
from openai import OpenAI

from tests.conftest import Stack, free_port, http_ok, inferq_env, spawn
from tests.helpers import fresh_rate_window, submit, wait_status, ws_events
from tests.wait import eventually

pytestmark = pytest.mark.integration
RATE_LIMIT = 5  # submissions a minute: the test makes 5, and a 6th is refused


class Prometheus:
    def __init__(self, base: str) -> None:
        self.base = base

    def query(self, promql: str) -> float | None:
        """An instant query's single value (None: no series)."""
        r = httpx.get(f"{self.base}/api/v1/query", params={"query": promql}, timeout=10)
        r.raise_for_status()
        result = r.json()["data"]["result"]
        assert len(result) <= 1, f"{promql}: {result}"
        return float(result[0]["value"][1]) if result else None

    def targets_up(self) -> int:
        return int(self.query("sum(up)") or 0)

    def scraped_since(self, t: float) -> bool:
        """Every target's last scrape began after ``t`` (a time.time()): its samples, stored with
        that scrape's ``up``, are what the target held after ``t``."""
        oldest = self.query("min(timestamp(up))")
        return oldest is not None and oldest > t


@pytest.fixture(scope="module")
def gateway2(stack: Stack, logdir: Path) -> Iterator[str]:
    """A gateway of two processes (`--workers 2`) on the stack's Redis, with a rate limit."""
    port = free_port()
    env = inferq_env(stack.redis.url, INFERQ_RATE_LIMIT_PER_MINUTE=str(RATE_LIMIT))
    svc = spawn("gateway-2proc", [sys.executable, "-m", "inferq.cli", "api", "--port", str(port), "--workers", "2"],
                env, logdir)
    base = f"http://127.0.0.1:{port}"
    try:
        eventually(lambda: http_ok(f"{base}/readyz"), 60, "the two-process gateway", procs=[svc], interval=0.2)
        yield base
    finally:
        svc.stop()


@pytest.fixture(scope="module")
def prometheus(stack: Stack, gateway2: str, tmp_path_factory: pytest.TempPathFactory,
               logdir: Path) -> Iterator[Prometheus]:
    binary = shutil.which("prometheus")
    assert binary, "prometheus is not installed (make setup installs the Debian package)"
    work = tmp_path_factory.mktemp("prometheus")
    workers = ", ".join(f"'127.0.0.1:{p}'" for p in stack.metrics_ports.values())
    (work / "prometheus.yml").write_text(f"""
global: {{scrape_interval: 1s, scrape_timeout: 1s}}
scrape_configs:
  - job_name: gateway
    static_configs: [{{targets: ['{gateway2.removeprefix("http://")}']}}]
  - job_name: worker
    static_configs: [{{targets: [{workers}]}}]
""")
    port = free_port()
    svc = spawn("prometheus", [binary, f"--config.file={work / 'prometheus.yml'}",
                               f"--storage.tsdb.path={work / 'data'}", f"--web.listen-address=127.0.0.1:{port}"],
                {}, logdir)
    prom = Prometheus(f"http://127.0.0.1:{port}")
    try:
        eventually(lambda: http_ok(f"{prom.base}/-/ready"), 60, "prometheus", procs=[svc], interval=0.2)
        eventually(lambda: prom.targets_up() == 1 + len(stack.metrics_ports), 60, "every target scraped", procs=[svc],
                   interval=0.2)
        yield prom
    finally:
        svc.stop()


QUERIES = {
    "rest_202": 'sum(inferq_http_requests_total{route="/v1/jobs",method="POST",status="202"})',
    "rest_429": 'sum(inferq_http_requests_total{route="/v1/jobs",method="POST",status="429"})',
    "rejected": 'sum(inferq_rejected_total{reason="rate_limit_exceeded"})',
    "ws_tokens": 'sum(inferq_streamed_tokens_total{kind="ws"})',
    "sse_tokens": 'sum(inferq_streamed_tokens_total{kind="sse"})',
    "ttft": "sum(inferq_time_to_first_token_seconds_count)",
    "submitted": "sum(inferq_jobs_submitted_total)",
    "succeeded": 'sum(inferq_jobs_finished_total{status="succeeded"})',
    "claimed": "sum(inferq_worker_jobs_claimed_total)",
    # the real worker's probe agrees with the gateway's tokenizing: prompts and chats go as ids
    "prompts_gateway": 'sum(inferq_prompts_total{tokenized_by="gateway"})',
    "prompts_worker": 'sum(inferq_prompts_total{tokenized_by="worker"})',
    "worker_succeeded": 'sum(inferq_worker_jobs_finished_total{outcome="succeeded"})',
    "vllm_requests": 'sum(vllm:e2e_request_latency_seconds_count{model_name="inferq-tiny"})',
    "vllm_tokens": 'sum(vllm:generation_tokens_total{model_name="inferq-tiny"})',
}


def _values(prom: Prometheus) -> dict[str, float]:
    return {k: prom.query(q) or 0.0 for k, q in QUERIES.items()}


def _quiet(prom: Prometheus, stack: Stack) -> None:
    """No job queued or running anywhere (earlier tests' jobs have ended), as scraped."""
    def idle() -> bool:
        running = prom.query("sum(inferq_worker_jobs_running)")
        queued = prom.query('sum(max without (instance) (inferq_jobs{status="queued"}))')
        return running == 0 and queued == 0
    eventually(idle, 120, "an idle stack", interval=0.5)
    # The counters the test reads as its baseline must hold every change of the earlier tests'
    # jobs, not a scrape taken while the last of them ended: wait for a scrape of every target
    # that began after the stack was seen idle (and still shows it idle).
    seen_idle = time.time()
    eventually(lambda: prom.scraped_since(seen_idle) and idle(), 60,
               "a scrape of every target after the stack was seen idle", interval=0.2)


def test_prometheus_sees_every_counter_move_by_what_was_done(stack: Stack, gateway2: str,
                                                              prometheus: Prometheus) -> None:
    _quiet(prometheus, stack)
    fresh_rate_window(stack.redis.client())
    before = _values(prometheus)
    tokens = 0
    with httpx.Client(base_url=gateway2, timeout=60) as http:
        for i in range(3):  # REST submit-and-poll
            view = wait_status(http, submit(http, prompt=f"metrics {i}", max_tokens=16, temperature=0))
            assert view["status"] == "succeeded"
            tokens += view["usage"]["completion_tokens"]
        events = asyncio.run(ws_events(gateway2.replace("http", "ws") + "/v1/generate",
                                       {"prompt": "metrics ws", "max_tokens": 48, "temperature": 0}))
        ws_tokens = sum(e.get("n_tokens", 0) for e in events if e["type"] == "token")
        assert events[-1]["type"] == "done" and ws_tokens > 0
        client = OpenAI(base_url=f"{gateway2}/v1", api_key="unused", max_retries=0)
        sse_tokens = 0
        for chunk in client.chat.completions.create(
                model="inferq-tiny", messages=[{"role": "user", "content": "metrics sse"}], max_tokens=48,
                temperature=0, stream=True, stream_options={"include_usage": True}):
            if chunk.usage is not None:
                sse_tokens = chunk.usage.completion_tokens
        assert sse_tokens > 0
        refused = http.post("/v1/jobs", json={"prompt": "one too many", "max_tokens": 4})
        assert refused.status_code == 429 and refused.json()["error"]["code"] == "rate_limit_exceeded"
    tokens += ws_tokens + sse_tokens
    expected = {**{k: before[k] for k in QUERIES}, "rest_202": before["rest_202"] + 3,
                "rest_429": before["rest_429"] + 1, "rejected": before["rejected"] + 1,
                "ws_tokens": before["ws_tokens"] + ws_tokens, "sse_tokens": before["sse_tokens"] + sse_tokens,
                "ttft": before["ttft"] + 2, "submitted": before["submitted"] + 5,
                "succeeded": before["succeeded"] + 5, "claimed": before["claimed"] + 5,
                "prompts_gateway": before["prompts_gateway"] + 5,
                "worker_succeeded": before["worker_succeeded"] + 5, "vllm_requests": before["vllm_requests"] + 5,
                "vllm_tokens": before["vllm_tokens"] + tokens}
    eventually(lambda: _values(prometheus), 30, f"every counter to move by what was done: {expected}",
               until=lambda seen: seen == expected, interval=0.5)  # a few scrapes


def test_gauges_and_vllm_metrics_are_labelled(stack: Stack, prometheus: Prometheus) -> None:
    for name in ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc"):
        assert prometheus.query(f'count({name}{{model_name="inferq-tiny"}})') == len(stack.metrics_ports), name
    assert prometheus.query('max(inferq_workers{state="live"})') == len(stack.workers)
    assert prometheus.query("max(inferq_worker_heartbeat_age_seconds)") < 10
    assert prometheus.query("sum(inferq_worker_draining)") == 0
    assert prometheus.query("max(inferq_redis_up)") == 1
    assert prometheus.query('sum(inferq_open_streams)') == 0  # every stream above has closed


def test_dashboard_and_alert_queries_run_on_real_data(stack: Stack, prometheus: Prometheus) -> None:
    """What deploy/ asks of Prometheus parses and, for the series it names, finds them."""
    root = Path(__file__).resolve().parents[2] / "deploy"
    rules = yaml.safe_load((root / "prometheus" / "alerts.yml").read_text())
    dash = json.loads((root / "grafana" / "dashboards" / "inferq.json").read_text())
    exprs = [r["expr"] for g in rules["groups"] for r in g["rules"]] + \
        [t["expr"] for p in dash["panels"] for t in p["targets"]]
    for expr in exprs:
        r = httpx.get(f"{prometheus.base}/api/v1/query", params={"query": expr}, timeout=10)
        assert r.status_code == 200 and r.json()["status"] == "success", (expr, r.text)
        for name in re.findall(r"\b((?:inferq_|vllm:)[a-z_:]+)", expr):
            if name.startswith("vllm:") or name in ("inferq_jobs", "inferq_workers", "inferq_queue_jobs"):
                assert (prometheus.query(f"count({{__name__=\"{name}\"}})") or 0) > 0, name
    for port in stack.metrics_ports.values():  # the worker's readiness probe
        assert httpx.get(f"http://127.0.0.1:{port}/ready", timeout=5).status_code == 200


def test_a_one_process_gateway_exports_its_own_metrics(stack: Stack) -> None:
    """`inferq api` with one process (what `make run` starts) counts in memory and exports it."""
    with httpx.Client(base_url=stack.base, timeout=60) as http:
        assert wait_status(http, submit(http, prompt="one process", max_tokens=2))["status"] == "succeeded"
        body = http.get("/metrics").text
    assert 'inferq_http_requests_total{method="POST",route="/v1/jobs",status="202"}' in body
    assert 'inferq_prompts_total{model="inferq-tiny",tokenized_by="gateway"}' in body
