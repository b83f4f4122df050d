"""A worker process sets the GIL switch interval before Celery starts consuming."""

from __future__ import annotations

import sys

from inferq.shared.settings import Settings
from inferq.worker import main


def test_consume_sets_the_switch_interval_first(monkeypatch) -> None:
    from inferq.worker import tasks

    seen: list[float] = []
    monkeypatch.setattr(tasks.app, "worker_main", lambda argv: seen.append(sys.getswitchinterval()))
    before = sys.getswitchinterval()
    try:
        main.consume(Settings(gil_switch_interval_ms=0.25), 4, "WARNING")
    finally:
        sys.setswitchinterval(before)
    assert seen == [0.00025]
