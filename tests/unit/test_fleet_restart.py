"""The fleet benchmark's restart case: what it reads off the counters it sampled (bench/fleet_restart.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.fleet_restart import Restarter, recovery
from inferq.cli.procs import Procs


def restarter(samples: list[tuple[float, list[tuple[float, float] | None]]], killed_at: float | None,
              ready_at: float | None) -> Restarter:
    r = Restarter(Procs(Path(".")), [1, 2], 1, kill_at_s=killed_at or 0.0, base="http://127.0.0.1:9", tag="fleet")
    r.samples, r.killed_at, r.ready_at = samples, killed_at, ready_at
    return r


def test_the_hit_rate_is_read_window_by_window_and_a_restarted_worker_counts_from_zero() -> None:
    samples = [
        (10.0, [(0.0, 0.0), (0.0, 0.0)]),
        (12.0, [(90.0, 100.0), (45.0, 50.0)]),  # 135 hits of 150
        (14.0, [(180.0, 200.0), None]),  # worker 2 killed: not counted while it does not answer
        (16.0, [(200.0, 300.0), (0.0, 100.0)]),  # started again: its counters from 0, all misses
        (18.0, [(290.0, 400.0), (90.0, 200.0)]),
    ]
    got = restarter(samples, killed_at=13.0, ready_at=15.0).report()
    assert got["windows"] == [(12.0, pytest.approx(0.9)), (14.0, pytest.approx(0.9)),
                              (16.0, pytest.approx(20 / 200)), (18.0, pytest.approx(0.9))]
    assert got["steady"] == pytest.approx(0.9)
    assert got["lowest_after_kill"] == pytest.approx(0.1)
    assert (got["recovered_after_ready_s"], got["recovered_after_kill_s"]) == (3.0, 5.0)


def test_a_rate_that_never_comes_back_says_so() -> None:
    samples = [(10.0, [(0.0, 0.0), (0.0, 0.0)]), (12.0, [(90.0, 100.0), (90.0, 100.0)]),
               (14.0, [(100.0, 200.0), (100.0, 200.0)])]
    got = restarter(samples, killed_at=12.5, ready_at=13.0).report()
    assert got["steady"] == pytest.approx(0.9)
    assert got["recovered_after_ready_s"] is None and got["lowest_after_kill"] == pytest.approx(0.1)


def test_no_kill_no_recovery_figures() -> None:
    got = restarter([(10.0, [(0.0, 0.0), (0.0, 0.0)]), (12.0, [(9.0, 10.0), (9.0, 10.0)])], None, None).report()
    assert got["windows"] == [(12.0, pytest.approx(0.9))] and "steady" not in got


def test_the_steady_rate_leaves_out_the_windows_that_filled_the_caches() -> None:
    windows = [(2.0, 0.1), (4.0, 0.5), (12.0, 0.9), (20.0, 0.92), (22.0, None), (24.0, 0.5), (30.0, 0.85)]
    got = recovery(windows, killed_at=20.0, ready_at=26.0)
    assert got["steady"] == pytest.approx(0.91)
    assert got["lowest_after_kill"] == 0.5
    assert (got["recovered_after_ready_s"], got["recovered_after_kill_s"]) == (4.0, 10.0)
