"""The benchmark harness end to end on the tiny model.

Asserts only completeness (every target and level present, nothing failed, tokens flowed), never
timings: this machine's speed says nothing about the code. ``make test`` runs a smoke config (one
level, two requests) against the session's running stack (``--base-url``); the test config with
every cheap target, each on a stack or server the harness starts itself, is ``heavy``
(``make test-heavy``).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench.config import Target, load_workload

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = ROOT / "bench" / "configs"

pytestmark = pytest.mark.integration


def test_bench_smoke(tmp_path: Path, stack) -> None:
    doc = run_and_check(CONFIGS / "smoke-test.json", tmp_path / "bench", timeout=300, base_url=stack.base)
    for name in ("inferq-ws", "inferq-sse"):  # where the time to first token went, from the jobs' records
        s = doc["targets"][name]["levels"]["c=2"]["summary"]
        stages = [s[f"{k}_p50"] for k in ("ingest", "queued", "to_first_token", "delivery")]
        assert all(v is not None and v >= 0 for v in stages), (name, stages)


@pytest.mark.heavy  # make test keeps test_bench_smoke; this one is the same run over client processes
def test_bench_smoke_with_the_client_over_processes(tmp_path: Path, stack) -> None:
    raw = json.loads((CONFIGS / "smoke-test.json").read_text())
    config = tmp_path / "smoke-procs.json"
    config.write_text(json.dumps({**raw, "client_processes": 2, "num_requests": 5}))
    doc = run_and_check(config, tmp_path / "bench", timeout=300, base_url=stack.base)
    for name in ("inferq-ws", "inferq-sse"):  # each request ran once, on one of the processes
        runs = doc["targets"][name]["levels"]["c=2"]["runs"]
        seen = [r["index"] for run in runs for r in run["requests"]]
        assert len(seen) == len(set(seen)) == 10, (name, seen)
        assert all(r["job_id"] for run in runs for r in run["requests"]), name


@pytest.mark.heavy  # ~80 s (its own vllm serve); make test drives the gateway with vllm bench serve in test_openai.py
def test_bench_vllm_bench_client_drives_vllm_serve_and_inferq_sse(tmp_path: Path, stack) -> None:
    """vLLM's own load client (vllm bench serve) drives vllm serve and inferq's OpenAI API, each
    level split over two of its processes whose per-request results are merged."""
    raw = json.loads((CONFIGS / "smoke-test.json").read_text())
    config = tmp_path / "vbench.json"
    targets = [{"kind": "vllm-serve", "client": "vllm-bench"},
               {"kind": "inferq-sse", "name": "inferq-sse-vb", "client": "vllm-bench"}]
    config.write_text(json.dumps({**raw, "name": "vbench", "repeats": 1, "num_requests": 4, "client_processes": 2,
                                  "targets": targets}))
    out = tmp_path / "bench"
    doc = run_and_check(config, out, timeout=300, base_url=stack.base)
    for name in ("vllm-serve", "inferq-sse-vb"):
        t = doc["targets"][name]
        assert t["client"] == "vllm-bench" and t["vllm_bench"]["processes"] == 2, t["vllm_bench"]
        s = t["levels"]["c=2"]["summary"]
        assert s["ttft_p50"] > 0 and s["itl_p50"] > 0 and s["tpot_p50"] > 0 and s["e2e_p50"] > 0, s
        assert s["vllm_bench_own_tok_s"] > 0, s  # vLLM's random prompts: the length, give or take re-encoding
        assert all(abs(n - raw["prompt_len"]) <= 3 for n in s["prompt_tokens"]), s["prompt_tokens"]
        run = t["levels"]["c=2"]["runs"][0]  # both processes ran, each request once
        assert len(run["vllm_bench"]["processes"]) == 2, run["vllm_bench"]
        assert sorted(r["index"] for r in run["requests"]) == sorted({r["index"] for r in run["requests"]}), name
        assert len(run["requests"]) == 4 and min(r["start"] for r in run["requests"]) == 0, run["requests"]
    table = (out / "results.md").read_text()
    assert "| vllm-serve | vllm bench serve | c=2 |" in table and "| inferq-sse-vb | vllm bench serve | c=2 |" in table


@pytest.mark.heavy
def test_bench_tiny_end_to_end(tmp_path: Path) -> None:
    run_and_check(CONFIGS / "tiny-test.json", tmp_path / "bench", timeout=420)


def run_and_check(config: Path, out: Path, timeout: float, base_url: str | None = None) -> dict:
    cmd = [sys.executable, "-m", "bench", "run", "--config", str(config), "--out", str(out)]
    proc = subprocess.run([*cmd, *(["--base-url", base_url] if base_url else [])],
                          cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    doc = json.loads((out / "results.json").read_text())
    w = load_workload(config)
    assert set(doc["targets"]) == {t.name for t in w.targets}

    def started(t: Target) -> bool:  # the harness started its stack or server (--base-url: inferq's is running)
        return base_url is None or not t.kind.startswith("inferq")

    for t in w.targets:
        got = doc["targets"][t.name]
        assert got["error"] is None, f"{t.name}: {got['error']}"
        for level in w.levels(t):
            s = got["levels"][level.label]["summary"]
            assert s["requests"] == w.requests_for(t, level) * w.repeats, (t.name, level.label)
            assert len(got["levels"][level.label]["runs"]) == w.repeats == s["repeats"], (t.name, level.label)
            assert s["failed"] == 0, (t.name, level.label, s["errors"])
            assert s["output_tok_s"] > 0 and s["req_s"] > 0, (t.name, level.label)
            assert s["output_tokens"] == s["ok"] * w.output_len, (t.name, level.label)
            if t.kind in ("inferq-ws", "inferq-rest"):
                assert s["queued_p50"] is not None, (t.name, level.label)
            # CPU per token: the stack's, and its busiest thread's outside the engine (only of a stack
            # the harness started: a running one's processes are not in its process tree)
            if t.kind != "inprocess" and started(t):
                whole, busiest = s["cpu_s_per_1k_tokens"], s["busiest_thread_cpu_s_per_1k_tokens"]
                assert whole is not None and busiest is not None and s["busiest_thread"], (t.name, s)
                assert 0 <= busiest <= whole, (t.name, busiest, whole)
                roles = s["cpu_by_role_per_1k_tokens"]  # where it went: every process of the stack named
                want = {"load client", "gateway", "worker", "redis", "engine"} if t.kind.startswith("inferq") \
                    else {"load client", "vllm-serve", "engine"} if t.kind == "vllm-serve" else {"load client"}
                assert want <= set(roles), (t.name, roles)
    throughput, _, rest = (out / "results.md").read_text().partition("CPU per 1,000 streamed tokens")
    cpu_table, _, stages = rest.partition("Where inferq's time to first token went")
    cpu_table, _, roles_table = cpu_table.partition("CPU per 1,000 streamed tokens by role")
    assert throughput.count("| c=") == sum(len(w.levels(t)) for t in w.targets)
    assert cpu_table.count("| c=") == sum(len(w.levels(t)) for t in w.targets if t.kind != "inprocess")
    assert roles_table.count("| c=") == sum(len(w.levels(t)) for t in w.targets if started(t))  # a running stack: none
    staged = [t for t in w.targets if t.kind.startswith("inferq") and w.client_for(t) == "harness"]  # REST too
    assert stages.count("| c=") == sum(len(w.levels(t)) for t in staged)  # vLLM's client sees no job ids
    for t in w.targets:  # every inferq path is compared with each reference that ran
        if t.kind.startswith("inferq"):
            for level in w.levels(t):
                s = doc["targets"][t.name]["levels"][level.label]["summary"]
                for ref in ("inprocess", "vllm-serve"):
                    if any(r.kind == ref for r in w.targets):
                        assert s["throughput_vs_" + ref.replace("-", "_")] > 0, (t.name, ref)
    return doc


def test_gateway_alone_bench_delivers_every_token(tmp_path: Path) -> None:
    out = tmp_path / "gateway.json"
    proc = subprocess.run([sys.executable, "-m", "bench", "gateway", "--rates", "1000,2000", "--jobs", "4",
                           "--seconds", "1", "--tokens-per-event", "2", "--out", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    doc = json.loads(out.read_text())
    assert [r["offered_tok_s"] for r in doc["results"]] == [1000, 2000]
    for r in doc["results"]:
        assert r["tokens"] == r["expected_tokens"] > 0, r  # nothing lost or duplicated on the way
        assert r["gateway_cpu_s"] > 0 and r["latency_ms"]["p50"] >= 0, r


@pytest.mark.heavy  # a worker of its own (make lint type-checks the bench's calls into the worker)
def test_intake_bench_takes_in_every_job_of_each_wave(tmp_path: Path) -> None:
    out = tmp_path / "intake.json"
    proc = subprocess.run([sys.executable, "-m", "bench", "intake", "--jobs", "6", "--waves", "2", "--tokens", "3",
                           "--step-ms", "5", "--chat", "--ids", "--env", "INFERQ_GIL_SWITCH_INTERVAL_MS=2",
                           "--out", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    doc = json.loads(out.read_text())
    assert [w["wave"] for w in doc["waves"]] == [1, 2] and doc["ids"]
    assert doc["worker_env"] == {"INFERQ_GIL_SWITCH_INTERVAL_MS": "2"}
    for w in doc["waves"]:  # every job of the wave ran to its end
        assert w["succeeded"] == 6, w
        assert 0 <= w["queued_p50_ms"] <= w["queued_p90_ms"] <= w["queued_max_ms"], w
        assert w["claim_to_first_p50_ms"] is not None and w["claim_to_first_p50_ms"] >= 0, w


@pytest.mark.parametrize("client", ["sse", pytest.param("ws", marks=pytest.mark.heavy)])
def test_churn_bench_streams_every_request_and_says_where_its_first_token_went(tmp_path: Path, client: str) -> None:
    out = tmp_path / "churn.json"
    proc = subprocess.run([sys.executable, "-m", "bench", "churn", "--client", client, "--clients", "4",
                           "--requests", "8", "--tokens", "4", "--step-ms", "5", "--out", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    doc = json.loads(out.read_text())
    assert doc["client"] == client and doc["ok"] == doc["requests"] == 8  # each with its 4 tokens
    assert doc["out_tok_s"] > 0 and doc["gateway_cpu_s"] > 0
    assert all(doc["ms_p50"][k] is not None and doc["ms_p50"][k] >= 0
               for k in ("ingest", "queued", "to_first_token")), doc
