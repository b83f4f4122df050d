"""A worker process sets the GIL switch interval before Celery starts consuming, and gives Celery one
thread per job slot and per slot of the interactive reserve."""

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
        main.consume(Settings(gil_switch_interval_ms=0.25), 4, 0, "WARNING")
    finally:
        sys.setswitchinterval(before)
    assert seen == [0.00025]


def test_celery_gets_a_thread_per_slot_and_per_reserved_slot(monkeypatch) -> None:
    from inferq.worker import tasks

    argv: list[list[str]] = []
    monkeypatch.setattr(tasks.app, "worker_main", argv.append)
    before = sys.getswitchinterval()
    try:
        main.consume(Settings(), 8, 2, "WARNING")
    finally:
        sys.setswitchinterval(before)
    assert "--concurrency=10" in argv[0]


def test_the_reserve_is_on_top_of_the_engines_sequences_only_with_classes() -> None:
    assert Settings(max_num_seqs=8).reserve == 6 and Settings(max_num_seqs=8).engine_max_num_seqs == 14
    assert [Settings(max_num_seqs=n).reserve for n in (1, 32, 128, 256)] == [2, 12, 32, 64]
    assert Settings(max_num_seqs=8, interactive_reserve=5).engine_max_num_seqs == 13
    off = Settings(max_num_seqs=8, interactive_reserve=5, service_classes=False)
    assert off.reserve == 0 and off.engine_max_num_seqs == 8


def test_celerys_per_task_lines_show_at_debug_only(monkeypatch) -> None:
    import logging

    from inferq.worker import tasks

    monkeypatch.setattr(tasks.app, "worker_main", lambda argv: None)
    loggers = [logging.getLogger(n) for n in main.CELERY_TASK_LOGGERS]
    before = sys.getswitchinterval(), [lg.level for lg in loggers]
    try:
        main.consume(Settings(), 4, 0, "INFO")
        assert [lg.getEffectiveLevel() for lg in loggers] == [logging.WARNING] * 2
        for lg in loggers:
            lg.setLevel(logging.NOTSET)
        main.consume(Settings(), 4, 0, "DEBUG")
        assert [lg.level for lg in loggers] == [logging.NOTSET] * 2
    finally:
        sys.setswitchinterval(before[0])
        for lg, level in zip(loggers, before[1], strict=True):
            lg.setLevel(level)
