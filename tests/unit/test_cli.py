"""The ``inferq`` command dispatches to the benchmark harness with its own arguments."""

from __future__ import annotations

import pytest

from inferq.cli.main import main


@pytest.mark.parametrize("argv, expect", [(["bench", "--help"], "{run,report,gateway}"),
                                          (["bench", "gateway", "--help"], "--tokens-per-event")])
def test_inferq_bench_is_the_harness(argv: list[str], expect: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 0
    assert expect in capsys.readouterr().out
