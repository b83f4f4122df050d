"""The vllm-bench load client of the harness (bench/vllm_bench.py): its flags on vLLM's versions,
the merge of its processes' per-request data, and where its rows go (references, the report)."""

from __future__ import annotations

import pytest

from bench import cpu, vllm_bench
from bench.config import Level, parse_workload
from bench.metrics import add_ratios, summary_rows
from bench.report import markdown_table

SPEC = vllm_bench.BenchSpec(base="http://127.0.0.1:8000", endpoint="chat", model="m7", tokenizer="/tmp/m7",
                            input_len=250, output_len=256, temperature=0.0, result_dir="/tmp/r", tag="0/1")


def _workload(**extra: object) -> dict:
    return {"name": "w", "num_requests": 4, "targets": ["inprocess"], **extra}


def test_the_client_is_the_targets_else_the_workloads_for_the_openai_targets() -> None:
    w = parse_workload(_workload(client="vllm-bench", targets=[
        "vllm-serve", "inferq-ws", {"kind": "inferq-sse", "name": "sse-h", "client": "harness"},
        {"kind": "vllm-serve", "name": "vllm-serve-4", "api_servers": 4}]))
    assert [w.client_for(t) for t in w.targets] == ["vllm-bench", "harness", "harness", "vllm-bench"]
    assert w.targets[3].api_servers == 4


@pytest.mark.parametrize("target", [{"kind": "inferq-ws", "client": "vllm-bench"},
                                    {"kind": "inferq-sse", "client": "ab"},
                                    {"kind": "inferq-sse", "api_servers": 2},
                                    {"kind": "vllm-serve", "api_servers": 0}])
def test_a_client_or_api_server_count_a_target_cannot_have_is_refused(target: dict) -> None:
    with pytest.raises(ValueError):
        parse_workload(_workload(targets=[target]))


def test_a_closed_level_runs_at_its_clients_and_an_open_one_at_its_rate() -> None:
    closed, _, _ = vllm_bench.pick(vllm_bench.options(SPEC, Level("closed", 128), 512, 7, "f.json"), KNOWN)
    assert closed[closed.index("--max-concurrency") + 1] == "128" and closed[closed.index("--num-prompts") + 1] == "512"
    assert closed[closed.index("--backend") + 1] == "openai-chat"
    assert closed[closed.index("--endpoint") + 1] == "/v1/chat/completions"
    assert closed[closed.index("--percentile-metrics") + 1] == "ttft,tpot,itl,e2el"
    opened, _, _ = vllm_bench.pick(vllm_bench.options(SPEC, Level("open", 2.5), 10, 7, "f.json"), KNOWN)
    assert "--max-concurrency" not in opened and opened[opened.index("--request-rate") + 1] == "2.5"


KNOWN = {a[0] for o in vllm_bench.options(SPEC, Level("closed", 1), 1, 0, "f") for a in o} | {"--burstiness"}


def test_a_flag_an_older_client_lacks_is_replaced_or_left_out_and_a_needed_one_fails() -> None:
    older = KNOWN - {"--temperature", "--random-prefix-len"}
    argv, notes, missing = vllm_bench.pick(vllm_bench.options(SPEC, Level("closed", 4), 8, 0, "f.json"), older)
    assert argv[argv.index("--extra-body") + 1] == '{"temperature": 0.0}' and "--random-prefix-len" not in argv
    assert notes == ["--random-prefix-len: left out", "--temperature: as --extra-body"] and not missing
    _, _, missing = vllm_bench.pick(vllm_bench.options(SPEC, Level("closed", 4), 8, 0, "f.json"),
                                    KNOWN - {"--random-input-len"})
    assert missing == ["--random-input-len"]


def test_every_flag_is_one_the_installed_vllm_bench_serve_takes() -> None:
    serve = pytest.importorskip("vllm.benchmarks.serve")
    parser = vllm_bench._parser(serve)
    argv, notes, missing = vllm_bench.pick(vllm_bench.options(SPEC, Level("closed", 4), 8, 0, "f.json"),
                                           set(parser._option_string_actions))
    assert not notes and not missing
    args = parser.parse_args(argv)
    assert (args.random_input_len, args.random_output_len, args.max_concurrency, args.ignore_eos) == (250, 256, 4, True)
    assert args.save_result and args.save_detailed and args.metric_percentiles == "50,90,99"


def _share(starts: list[float], lat: float, *, lens: list[int] | None = None, duration: float = 1.0) -> dict:
    n = len(starts)
    return {"ttfts": [0.1] * n, "itls": [[0.01] * 3] * n, "output_lens": lens or [4] * n, "input_lens": [16] * n,
            "errors": [""] * n, "latencies": [lat] * n, "start_times": starts, "duration": duration,
            "output_throughput": 10.0}


def test_the_processes_results_merge_into_one_level_over_the_window_of_all_requests() -> None:
    a = vllm_bench.share_results([(0, None), (2, None)], _share([100.0, 100.5], 1.0), expected=4)
    b = vllm_bench.share_results([(1, None), (3, None)], _share([100.2, 101.0], 1.0, lens=[4, 3]), expected=4)
    results, wall, how = vllm_bench.merge([(a, _share([100.0, 100.5], 1.0)), (b, _share([100.2, 101.0], 1.0))])
    assert [r.index for r in results] == [0, 1, 2, 3] and wall == pytest.approx(2.0) and "start" in how
    assert [round(r.start, 3) for r in results] == [0.0, 0.2, 0.5, 1.0]
    assert [r.ok for r in results] == [True, True, True, False] and "expected 4" in (results[3].error or "")
    assert results[0].e2e == 1.0 and results[0].chunks == 4 and results[0].prompt_tokens == 16


def test_without_start_times_the_window_is_the_longest_process_duration() -> None:
    old = {k: v for k, v in _share([0.0, 0.0], 1.0, duration=3.0).items() if k not in ("start_times", "latencies")}
    rs = vllm_bench.share_results([(0, None), (1, None)], old, expected=4)
    _, wall, how = vllm_bench.merge([(rs, old), (rs[:0], dict(old, duration=2.5))])
    assert wall == 3.0 and "duration" in how and rs[0].e2e == pytest.approx(0.1 + 0.03)


def test_a_failed_request_is_counted_with_its_error() -> None:
    data = _share([1.0, 1.1], 1.0)
    data["errors"], data["output_lens"] = ["", "Traceback: connection reset"], [4, 0]
    rs = vllm_bench.share_results([(5, None), (6, None)], data, expected=4)
    assert [r.ok for r in rs] == [True, False] and rs[1].error == "Traceback: connection reset"


class _Tok:  # a tokenizer with one special token (BOS) and a chat template of 5 tokens
    def num_special_tokens_to_add(self) -> int:
        return 1

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return [0] * len(text.split())

    def apply_chat_template(self, messages: list, tokenize: bool, add_generation_prompt: bool) -> str:
        return "a b c " + messages[0]["content"] + " d e"


def test_chat_prompts_leave_room_for_the_template() -> None:
    assert vllm_bench.random_input_len(_Tok(), 256, chat=False) == 256
    assert vllm_bench.random_input_len(_Tok(), 256, chat=True) == 256 - 5 + 1


def _target(kind: str, client: str, tok_s: float, **extra: object) -> dict:
    summary = {"output_tok_s": tok_s, "ok": 1, "ttft_p50": 0.1}
    return {"kind": kind, "client": client, **extra, "levels": {"c=1": {"mode": "closed", "value": 1.0,
                                                                        "summary": summary}}}


def test_inferq_is_compared_with_one_api_server_then_the_same_client() -> None:
    targets = {"vllm-serve-4": _target("vllm-serve", "vllm-bench", 400.0, api_servers=4),
               "vllm-serve-h": _target("vllm-serve", "harness", 50.0, api_servers=1),
               "vllm-serve": _target("vllm-serve", "vllm-bench", 100.0, api_servers=1),
               "inferq-sse": _target("inferq-sse", "vllm-bench", 120.0),
               "inferq-ws": _target("inferq-ws", "harness", 100.0)}
    add_ratios(targets)
    sse, ws = (targets[n]["levels"]["c=1"]["summary"] for n in ("inferq-sse", "inferq-ws"))
    assert sse["reference_vllm_serve"] == "vllm-serve" and sse["throughput_vs_vllm_serve"] == pytest.approx(1.2)
    assert ws["reference_vllm_serve"] == "vllm-serve-h" and ws["throughput_vs_vllm_serve"] == pytest.approx(2.0)


def test_the_table_names_each_rows_client() -> None:
    targets = {"vllm-serve-4": _target("vllm-serve", "vllm-bench", 400.0, api_servers=4),
               "inferq-ws": {**_target("inferq-ws", "harness", 100.0)}, "old": {"kind": "inferq-sse", "levels": {}}}
    for t in targets.values():
        for lv in t["levels"].values():
            lv["summary"].update(dict.fromkeys(("failed", "req_s", "ttft_p99", "itl_p50", "itl_p99", "e2e_p50",
                                                "e2e_p99", "queued_p50")))
    rows = summary_rows(targets)
    assert [(r["target"], r["client"], r.get("api_servers")) for r in rows] == [
        ("vllm-serve-4", "vllm-bench", 4), ("inferq-ws", "harness", None)]
    table = markdown_table({"summary": rows})
    assert "| vllm-serve-4 | vllm bench serve | c=1 |" in table and "| inferq-ws | harness | c=1 |" in table


def test_vllm_serves_api_servers_are_not_the_engine() -> None:
    assert cpu._is_engine("VLLM::EngineCor") and cpu._is_engine("VLLM::Worker")
    assert not cpu._is_engine("VLLM::APIServer") and not cpu._is_engine("python")


def test_vllm_serve_targets_that_differ_only_in_their_client_share_one_server() -> None:
    from bench.runner import _same_server

    w = parse_workload(_workload(targets=["vllm-serve", {"kind": "vllm-serve", "name": "vb", "client": "vllm-bench"},
                                          {"kind": "vllm-serve", "name": "vllm-serve-4", "api_servers": 4},
                                          "inferq-ws", {"kind": "inferq-sse", "client": "vllm-bench"}]))
    a, vb, four, ws, sse = w.targets
    assert _same_server(a, vb) and not _same_server(a, four) and _same_server(ws, sse) and not _same_server(a, ws)
