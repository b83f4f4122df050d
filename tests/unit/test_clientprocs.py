"""How a level's requests are shared out among the load client's processes."""

from __future__ import annotations

from bench.clientprocs import shares
from bench.config import Level


def test_a_closed_level_gives_each_process_its_clients_and_their_requests() -> None:
    reqs = [(i, f"body {i}") for i in range(10)]
    got = shares(Level("closed", 4.0), reqs, 3)  # client slots 0..3 -> processes 0, 1, 2, 0
    assert [lv.value for lv, _ in got] == [2.0, 1.0, 1.0]
    assert [[i for i, _ in mine] for _, mine in got] == [[0, 3, 4, 7, 8], [1, 5, 9], [2, 6]]


def test_every_request_goes_to_exactly_one_process() -> None:
    reqs = [(i, None) for i in range(37)]
    for level in (Level("closed", 1.0), Level("closed", 8.0), Level("closed", 64.0), Level("open", 9.0)):
        got = shares(level, reqs, 4)
        assert sorted(i for _, mine in got for i, _ in mine) == list(range(37)), level
        assert all(mine for _, mine in got), level  # a process with nothing to do gets no level


def test_one_client_runs_in_one_process_and_an_open_rate_is_split() -> None:
    assert [(lv, len(m)) for lv, m in shares(Level("closed", 1.0), [(0, 0), (1, 1)], 4)] == [(Level("closed", 1.0), 2)]
    got = shares(Level("open", 8.0), [(i, 0) for i in range(8)], 4)
    assert [lv.value for lv, _ in got] == [2.0] * 4
