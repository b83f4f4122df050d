"""Cache-affine pull on the session stack (two real workers, INFERQ_AFFINITY=prefix, the default):
each turn of a conversation runs on the worker that ran the turn before (the one whose vLLM prefix
cache holds it), whichever worker took it from the queue, and that engine's prefix cache hits; the
fleet's prefix index holds what the engines' KV-cache events said they stored."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import httpx

from tests.helpers import submit, wait_status
from tests.wait import eventually

#: a long shared start (the tiny model's tokenizer was trained on Python's standard library)
SYSTEM = Path(json.__file__).read_text()[:2500]


def prefix_hits(port: int) -> float:
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
    return sum(float(m) for m in re.findall(r"^vllm:prefix_cache_hits_total\{[^}]*\} (\S+)$", text, re.M))


def test_each_turn_runs_where_the_conversation_is_cached(stack) -> None:
    ports = stack.metrics_ports
    with stack.http() as http:
        before = {wid: prefix_hits(port) for wid, port in ports.items()}
        prompt, ran = SYSTEM, []
        for turn in range(4):
            prompt += f"\n# turn {turn}\n"
            view = wait_status(http, submit(http, prompt=prompt, max_tokens=8, temperature=0))
            assert view["status"] == "succeeded", view
            ran.append(view["worker"])
            prompt += view["text"]
        after = {wid: prefix_hits(port) for wid, port in ports.items()}
    assert len(set(ran)) == 1, ran
    holder = ran[0]
    # each follow-up found at least the shared start cached (hundreds of tokens) on that engine
    assert after[holder] - before[holder] >= 3 * 256, (before, after)
    with stack.http() as http:  # and the worker's heartbeat says so (the console's worker panel shows it)
        eventually(lambda: {w["id"]: w["stats"] for w in http.get("/v1/workers").json()}[holder], 10,
                   "the holder's prefix-cache counters", until=lambda s: s["prefix_cache_hits"] >= after[holder])
        engines = {w["id"]: w["engine"] for w in http.get("/v1/workers").json()}
    # the index names the holder's engine, from its engine's KV-cache events (a claim only refreshes
    # entries the events made): the blocks of the shared start are held there
    r = stack.redis.client()
    held = [set(r.zrangebyscore(k, time.time(), "+inf")) for k in r.scan_iter("inferq:kv:*", count=1000)]
    assert sum(engines[holder] in h for h in held) >= 2500 // 64 // 4, (engines, len(held))


def test_the_sessions_benchmark_runs_against_the_stack(stack, tmp_path: Path) -> None:
    """bench/sessions.py's smoke case: a few two-turn sessions on the stack; every follow-up finds
    its session's prefix cached (256 of its 320 tokens: the ideal is 0.8)."""
    from bench.sessions import main

    config = tmp_path / "smoke.json"
    config.write_text(json.dumps({"sessions": 4, "turns": 2, "prefix_tokens": 256, "turn_tokens": 64,
                                  "output_tokens": 4, "repeats": 1}))
    ports = ",".join(str(p) for p in stack.metrics_ports.values())
    assert main([str(config), "--out", str(tmp_path), "--base", stack.base, "--metrics", ports]) == 0
    summary = json.loads((tmp_path / "sessions.json").read_text())["stacks"]["given"]["summary"]
    assert summary["errors"] == 0, summary
    assert summary["follow_up_hit_rate"]["median"] >= 0.7, summary
