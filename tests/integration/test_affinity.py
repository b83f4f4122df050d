"""Cache-affine pull on the session stack (two real workers, INFERQ_AFFINITY=prefix, the default):
each turn of a conversation runs on the worker that ran the turn before (the one whose vLLM prefix
cache holds it), whichever worker took it from the queue, and that engine's prefix cache hits."""

from __future__ import annotations

import json
import re
from pathlib import Path

import httpx

from tests.helpers import submit, wait_status

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
