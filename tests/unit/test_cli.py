"""The ``inferq`` command dispatches to the benchmark harness with its own arguments."""

from __future__ import annotations

import pytest

from inferq.cli.main import main


@pytest.mark.parametrize("argv, expect", [
    (["bench", "--help"], "{run,report,gateway,worker,intake,churn,dashboard,console-shot}"),
    (["bench", "gateway", "--help"], "--tokens-per-event"),
    (["bench", "worker", "--help"], "--step-ms"),
    (["bench", "intake", "--help"], "--chat"),
])
def test_inferq_bench_is_the_harness(argv: list[str], expect: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 0
    assert expect in capsys.readouterr().out


def test_error_events_print_type_code_and_message() -> None:
    from inferq.cli.wsclient import error_line
    from inferq.shared.schemas import ErrorEvent

    new = {"type": "error", "seq": 0, "error": {"type": "rate_limit_error", "code": "rate_limit_exceeded",
                                                "message": "slow down", "param": None}}
    old = {"type": "error", "seq": 3, "error": {"type": "worker_lost", "message": "gone"}}  # an older gateway
    assert error_line(ErrorEvent.model_validate(new)) == "rate_limit_error (rate_limit_exceeded): slow down"
    assert error_line(ErrorEvent.model_validate(old)) == "service_unavailable (worker_lost): gone"
