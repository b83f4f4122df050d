"""bench/classes.py: its configs parse, and each tenant's service over time is counted where its
tokens streamed."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.classes import STACKS, load_config
from bench.classes_tenants import served, service_windows

CONFIGS = sorted((Path(__file__).resolve().parents[2] / "bench" / "configs" / "classes").glob("*.json"))


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_the_classes_config_parses(path: Path) -> None:
    cfg = load_config(path)
    assert cfg.name == path.stem and set(cfg.stacks) <= set(STACKS) and cfg.repeats >= 3
    assert cfg.batch_lines >= 1000 and 0 < cfg.load < 1


def test_tokens_are_spread_over_the_time_they_streamed() -> None:
    spans = [(0.0, 10.0, 100), (5.0, 5.0, 7)]
    assert served(spans, 0.0, 5.0) == pytest.approx(50.0)
    assert served(spans, 5.0, 10.0) == pytest.approx(57.0)


def requests(start: float, n: int, every: float, ttft: float, lat: float, tokens: int) -> dict:
    starts = [start + k * every for k in range(n)]
    return {"start_times": starts, "ttfts": [ttft] * n, "latencies": [lat] * n, "output_lens": [tokens] * n}


def test_windows_slide_over_the_time_both_tenants_ran() -> None:
    heavy = requests(0.0, 12, 10.0, 0.0, 10.0, 1000)  # 100 tokens/s from 0 to 120 s
    light = requests(20.0, 100, 1.0, 0.0, 1.0, 50)  # 50 tokens/s from 20 to 120 s
    got = service_windows({"heavy": heavy, "light": light}, window_s=60.0, step_s=20.0)
    assert got["overlap_s"] == 100.0 and [w["from_s"] for w in got["windows"]] == [0.0, 20.0, 40.0]
    assert got["windows"][0] == {"from_s": 0.0, "heavy": 6000, "light": 3000}
    assert got["ratio_max"] == pytest.approx(2.0)
    assert got["total_tok_s"] == pytest.approx((12000 + 5000) / 120.0)
    weighted = service_windows({"heavy": heavy, "light": light}, 60.0, 20.0, weights={"heavy": 2.0})
    assert weighted["ratio_max"] == pytest.approx(1.0)


def test_windows_counted_as_fair_share_charges_add_the_prompts_at_their_weight() -> None:
    """A light tenant with long prompts: behind on output tokens, level counted as the queue charges
    (a prompt token at half an output token, served at the request's first token)."""
    heavy = requests(0.0, 12, 10.0, 0.0, 10.0, 1000)  # 100 output tokens/s
    light = {**requests(0.0, 120, 1.0, 0.0, 1.0, 50), "input_lens": [100] * 120}  # 50/s, prompts 100 a second
    assert service_windows({"heavy": heavy, "light": light}, 60.0, 20.0)["ratio_max"] == pytest.approx(2.0)
    charged = service_windows({"heavy": heavy, "light": light}, 60.0, 20.0, prompt_weight=0.5)
    assert charged["ratio_max"] == pytest.approx(1.0)
    assert charged["windows"][0] == {"from_s": 0.0, "heavy": 6000, "light": 6000}


def test_a_tenant_that_never_ran_has_no_windows() -> None:
    assert service_windows({"a": requests(0.0, 3, 1.0, 0.0, 1.0, 5), "b": {}}, 60.0, 10.0)["windows"] == []


def test_the_page_tables_come_from_the_summary() -> None:
    from bench.classes import table

    def v(x: float) -> dict[str, float]:
        return {"median": x, "min": x, "max": x}

    run = {"alone_median_ttft_ms": v(20), "alone_p99_ttft_ms": v(50), "alone_median_itl_ms": v(3),
           "alone_p99_itl_ms": v(10), "mixed_median_ttft_ms": v(25), "mixed_p99_ttft_ms": v(60),
           "mixed_median_itl_ms": v(4), "mixed_p99_itl_ms": v(11), "batch_tok_s": v(900), "idle_used": v(0.8)}
    got = table({"stacks": {"classes": run, "fair": {"ratio_max": v(1.1), "total_tok_s": v(1500),
                                                      "light_beside_p90_ttft_ms": v(60),
                                                      "light_solo_p90_ttft_ms": v(40)}}})
    row = ("| classes | 50 (50–50) / 10.0 (10.0–10.0) | 25 (25–25) / 60 (60–60) | 4.0 (4.0–4.0) / 11.0 (11.0–11.0) "
           "| 1.20×, 1.10× | 900 (900–900) | 80 % |")  # against the fleet's own interactive-alone runs
    assert row in got
    assert "| fair | 1.10 (1.10–1.10) / — | 1,500 (1,500–1,500) | 60 (60–60) / 40 (40–40) |" in got


def test_a_client_without_per_request_latencies_gets_them_from_its_token_gaps(tmp_path: Path) -> None:
    import json
    import subprocess
    import sys

    from bench.classes_load import finish_client

    (tmp_path / "old.json").write_text(json.dumps({"ttfts": [0.5, 0.25], "itls": [[0.1, 0.2], []],
                                                   "start_times": [1.0, 2.0], "output_lens": [3, 1]}))
    run = finish_client(subprocess.Popen([sys.executable, "-c", "pass"]), tmp_path, "old", 60)
    assert run["requests"]["latencies"] == pytest.approx([0.8, 0.25])
