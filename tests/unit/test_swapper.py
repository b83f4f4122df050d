"""A multi-model worker's supervisor (worker/multi/swapper.py) over fake model processes and a Redis of
its own: what its heartbeat publishes (standby sets, its description), a swap's order and records,
the claim that keeps two workers from waking one model, and its exit when a model's process dies."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from inferq.shared import keys
from inferq.shared.schemas import SwapperInfo, WorkerInfo
from inferq.shared.settings import Settings
from inferq.worker.multi import policy
from inferq.worker.multi.procs import ModelProc
from inferq.worker.multi.swapper import Swapper

CALLS: list[str] = []


class FakeProc(ModelProc):
    """A model's process that answers at once (no process, no engine)."""

    exitcode: int | None = None
    started = False
    fits = True  # its weights fit beside the awake model (wake_weights)
    nap_s = 0.0  # how long its sleep takes

    def spawn(self, park: bool) -> None:
        CALLS.append(f"spawn {self.name}{' parked' if park else ''}")

    async def start(self, timeout_s: float) -> float:
        CALLS.append(f"start {self.name}")
        self.started, self.state, self.started_s = True, "awake", 2.0
        self.phases = {"process": 0.0, "setup": 0.1, "engine": 1.8, "consumer": 0.1}
        now = time.time()
        self.info = WorkerInfo(id=self.worker_id, model=self.name, host="h", pid=1, max_model_len=64, max_num_seqs=4,
                               started_at=now, last_seen=now)
        return 2.0

    async def sleep(self, grace_s: float, timeout_s: float) -> dict[str, Any]:
        CALLS.append(f"sleep {self.name}")
        await asyncio.sleep(self.nap_s)
        self.state = "asleep"
        return {"drain_s": 0.1, "sleep_s": 0.2, "handed_back": 1}

    async def wake_weights(self, timeout_s: float) -> bool:
        CALLS.append(f"weights {self.name}")
        return self.fits

    async def wake(self, timeout_s: float) -> float:
        CALLS.append(f"wake {self.name}")
        self.state = "awake"
        self.wakes.append(0.3)
        return 0.3

    def alive(self) -> bool:
        return self.started

    def died(self) -> bool:
        return self.exitcode is not None


def swapper(url: str, wid: str, **extra: Any) -> Swapper:
    s = Settings(redis_url=url, worker_id=wid, models=[{"name": "ma"}, {"name": "mb"}],  # type: ignore[list-item]
                 heartbeat_s=0.1, **{"swap_check_s": 0.05, "sleep_mode": "off", **extra})
    sw = Swapper(s, "INFO", lambda *_: None)
    sw.models = [FakeProc(m.spec, m.worker_id, m.swapper_id, 0, m.main, "INFO") for m in sw.models]
    sw.by_name = {m.name: m for m in sw.models}
    return sw


async def test_a_swap_sleeps_then_wakes_and_the_heartbeat_holds_the_rest_in_standby(r, own_redis) -> None:
    sw = swapper(own_redis, "sw-a")
    sw.redis = r
    CALLS.clear()
    await sw.beat()  # before anything is awake: both models can be woken here
    assert set(await r.zrange(keys.standby("ma"), 0, -1)) == {"sw-a"} == set(await r.zrange(keys.standby("mb"), 0, -1))
    assert {"ma", "mb"} <= set(await r.zrange(keys.MODELS, 0, -1))

    await sw._swap(policy.Swap("ma", "start"))
    await sw._swap(policy.Swap("mb", "idle"))
    await sw._swap(policy.Swap("ma", "idle"))
    assert CALLS == ["start ma", "sleep ma", "start mb", "sleep mb", "wake ma"]
    assert sw.awake is not None and sw.awake.name == "ma" and not await r.exists(keys.waking("ma"))
    await sw.beat()
    assert await r.zrange(keys.standby("ma"), 0, -1) == [] and await r.zrange(keys.standby("mb"), 0, -1) == ["sw-a"]
    info = SwapperInfo.model_validate_json(await r.get(keys.swapper("sw-a")))
    assert info.awake == "ma" and info.swaps == 3 and [s.to_model for s in info.recent] == ["ma", "mb", "ma"]
    assert [s.cold for s in info.recent] == [True, True, False] and info.recent[-1].handed_back == 1
    slot = info.slot("mb")
    assert slot is not None and slot.state == "asleep" and slot.info is not None and slot.eta_s == 2.0
    stats = await r.hgetall(keys.SWAP_STATS)
    assert stats["cold|ma"] == "1" and stats["cold|mb"] == "1" and stats["n|ma"] == "1"
    assert stats["le|ma|120"] == "1"


async def test_only_one_worker_wakes_a_model_at_a_time(r, own_redis) -> None:
    a, b = swapper(own_redis, "sw-1"), swapper(own_redis, "sw-2")
    a.redis = b.redis = r
    await r.set(keys.waking("mb"), "sw-1", px=5000)  # sw-1 is waking it
    CALLS.clear()
    await b._swap(policy.Swap("mb", "waiting"))
    assert CALLS == [] and b.awake is None
    got = await __import__("inferq.worker.multi.demand", fromlist=["read"]).read(
        r, {"ma": "sw-2.ma", "mb": "sw-2.mb"}, 5.0, "sw-2")
    assert got["mb"].awake_elsewhere == 1, "a model being woken counts as served"


async def test_the_worker_stops_when_a_model_process_dies(own_redis) -> None:
    sw = swapper(own_redis, "sw-d")
    CALLS.clear()
    run = asyncio.create_task(sw.run())
    await asyncio.sleep(0.5)
    assert sw.awake is not None and sw.awake.name == "ma"  # started: the first model, nothing queued
    assert not any(c.startswith("spawn") for c in CALLS), "no process spawned ahead without sleep mode"
    assert sw.recent[0].cold and sw.recent[0].phases["engine"] == 1.8, "a cold start says where its time went"
    sw.by_name["ma"].exitcode = 4  # type: ignore[attr-defined]
    assert await asyncio.wait_for(run, 30) == 4


async def test_wake_first_wakes_the_other_model_before_the_awake_one_sleeps(r, own_redis) -> None:
    sw = swapper(own_redis, "sw-w", swap_wake_first=True)
    sw.redis = r
    CALLS.clear()
    await sw._swap(policy.Swap("ma", "start"))
    await sw._swap(policy.Swap("mb", "idle"))  # a first start waits for the other's sleep (memory)
    await sw._swap(policy.Swap("ma", "idle"))
    assert CALLS == ["start ma", "sleep ma", "start mb", "wake ma", "sleep mb"]
    last = sw.recent[-1]
    assert (last.from_model, last.to_model, last.cold) == ("mb", "ma", False)
    assert last.sleep_s == 0.2 and last.handed_back == 1, "the sleep that came after is recorded with the swap"


async def test_with_sleep_mode_the_weights_come_back_while_the_other_model_sleeps(r, own_redis) -> None:
    """INFERQ_SWAP_OVERLAP: the woken model's weights are asked back at the same time as the awake
    model's sleep (not for a first start, nor without sleep mode); the record says whether they fit."""
    sw = swapper(own_redis, "sw-o", sleep_mode="on")
    sw.redis = r
    sw.by_name["mb"].nap_s = 0.5  # type: ignore[attr-defined]
    CALLS.clear()
    await sw._swap(policy.Swap("ma", "start"))
    await sw._swap(policy.Swap("mb", "idle"))
    await sw._swap(policy.Swap("ma", "idle"))
    assert CALLS == ["start ma", "sleep ma", "start mb", "weights ma", "sleep mb", "wake ma"]
    estimate = sw.by_name["ma"].wake_estimate()
    assert estimate is not None and estimate >= 0.4, "what a job waits for a wake: the other's sleep (0.5 s) too"
    assert [s.overlapped for s in sw.recent] == [False, False, True]
    sw.by_name["mb"].fits = False  # type: ignore[attr-defined]
    await sw._swap(policy.Swap("mb", "idle"))
    assert CALLS[-3:] == ["weights mb", "sleep ma", "wake mb"] and not sw.recent[-1].overlapped

    off = swapper(own_redis, "sw-p", sleep_mode="on", swap_overlap=False)
    off.redis = r
    CALLS.clear()
    for to in ("ma", "mb", "ma"):
        await off._swap(policy.Swap(to, "idle"))
    assert "weights ma" not in CALLS and CALLS[-2:] == ["sleep mb", "wake ma"]


async def test_a_kick_ends_the_wait_for_the_next_demand_check(own_redis) -> None:
    """Told that a job waits for one of its models, the supervisor reads its demand at once, not at
    its next INFERQ_SWAP_CHECK_S; the kick is spent by that read."""
    sw = swapper(own_redis, "sw-k", swap_check_s=10)
    sw.kick.set()
    await asyncio.wait_for(sw._until_next_check(), 5)
    assert not sw.kick.is_set()
    sw.stop.set()  # and a stop ends it too
    await asyncio.wait_for(sw._until_next_check(), 5)


async def test_with_sleep_mode_every_model_process_is_spawned_ahead_at_start(own_redis) -> None:
    """INFERQ_SWAP_PRESPAWN (unset: on with sleep mode): each model's process is spawned, parked, as the
    worker starts, before any swap; set off, none is."""
    for extra, spawned in (({"sleep_mode": "on"}, True), ({"sleep_mode": "on", "swap_prespawn": False}, False),
                           ({"swap_prespawn": True}, True)):
        sw = swapper(own_redis, "sw-s", **extra)
        CALLS.clear()
        run = asyncio.create_task(sw.run())
        await asyncio.sleep(0.5)
        sw.stop.set()
        assert await asyncio.wait_for(run, 30) == 0
        assert (CALLS[:2] == ["spawn ma parked", "spawn mb parked"]) is spawned, (extra, CALLS)
        assert CALLS[2 if spawned else 0] == "start ma"
