"""A multi-model worker's model going to sleep and waking, in its own process (worker/multi/nap.py,
over a WorkerRuntime around a scripted engine, a Redis of its own), and the engine host's sleep and
wake: vLLM's sleep mode (GPU: ``sleep(level=1)``, ``wake_up()``, the same engine) or, without it
(vLLM's CPU build), the engine stopped and a new one started."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

import pytest
from celery.exceptions import Reject

from inferq.shared import keys
from inferq.shared.schemas import JobStatus, WorkerInfo
from inferq.shared.settings import Settings
from inferq.worker.engine import gpumem
from inferq.worker.engine.host import EngineHost
from inferq.worker.multi.nap import put_to_sleep, wake
from tests.unit.test_engine_death_and_drain import generating, paused
from tests.unit.workerkit import GatedEngine, queued_job, start_runtime
from tests.wait import eventually_async


@dataclass
class SleepyEngine(GatedEngine):
    """The gated engine, with vLLM's sleep-mode calls; ``calls`` records them in order."""

    calls: list[str] = field(default_factory=list)

    async def sleep(self, level: int = 1) -> None:
        self.calls.append(f"sleep {level}")

    async def wake_up(self, tags: list[str] | None = None) -> bool:
        self.calls.append(f"wake_up {','.join(tags or ['all'])}")
        return True

    def shutdown(self) -> None:
        self.calls.append("shutdown")


@dataclass
class Consuming:
    """Celery's consumption of the model's queues, as the sleep and the wake switch it."""

    calls: list[str] = field(default_factory=list)

    def pause(self) -> None:
        self.calls.append("pause")

    def resume(self) -> None:
        self.calls.append("resume")


async def live(r: Any, model: str, wid: str) -> bool:
    return await r.zscore(keys.workers(model), wid) is not None


async def test_sleep_hands_back_after_the_grace_then_sleeps_and_wake_takes_jobs_again(store, own_redis) -> None:
    engine, consuming = SleepyEngine(), Consuming()
    rig = start_runtime(own_redis, engine)
    rt, r = rig.runtime, store.redis
    try:
        [job], runs = await generating(rig, store, 1)
        assert await live(r, "scripted", rt.id)
        napped = await asyncio.to_thread(put_to_sleep, rt, consuming, 0.3)
        assert consuming.calls == ["pause"] and engine.calls == ["sleep 1"]
        assert napped.handed_back == 1 and napped.drain_s >= 0.3
        assert await paused(store, job.id) and rig.sent == [job.id], "paused: it continues where it stopped"
        assert runs[job.id].result(10) is None, "its run wrote no end"
        assert await r.hget(keys.job(job.id), "preemptions") == "1", "a swap's hand-back is no failed attempt"
        assert not await live(r, "scripted", rt.id) and not await r.exists(keys.worker(rt.id))
        with pytest.raises(Reject):  # a message popped now goes back to the queue, unclaimed
            rt.run_job(await queued_job(store, "scripted"))
        await asyncio.sleep(3 * rt.settings.heartbeat_s)  # the heartbeat goes on without registering
        assert not await live(r, "scripted", rt.id)

        slept = rt.engine_id
        await asyncio.to_thread(wake, rt, consuming)
        assert engine.calls == ["sleep 1", "wake_up all"] and consuming.calls == ["pause", "resume"]
        assert await live(r, "scripted", rt.id)
        info = WorkerInfo.model_validate_json(await r.get(keys.worker(rt.id)))
        assert info.engine == rt.engine_id != slept, "a woken engine is a new instance: it holds no old cache"
        if rt.affinity is not None:
            assert rt.affinity.engine == rt.affinity.view.engine == rt.engine_id
        assert rt.heartbeat.reaped == 0, "a wake is not a return from the dead"
        again = await queued_job(store, "scripted")
        rig.run_job(again)
        await eventually_async(lambda: again.id in engine.started, 30, "a job runs after the wake")
    finally:
        rig.stop()


async def test_sleep_waits_for_running_jobs_within_the_grace(store, own_redis) -> None:
    engine, consuming = SleepyEngine(), Consuming()
    rig = start_runtime(own_redis, engine)
    rt = rig.runtime
    try:
        [job], runs = await generating(rig, store, 1)
        sleeping = asyncio.get_running_loop().run_in_executor(None, put_to_sleep, rt, consuming, 30.0)
        await asyncio.sleep(0.3)
        assert not sleeping.done() and engine.calls == [], "the engine sleeps only once its jobs are done"
        rt.host.loop.call_soon_threadsafe(rt.runner.cancel, job.id)  # the job ends (here: cancelled)
        napped = await asyncio.wait_for(sleeping, 30)
        assert napped.handed_back == 0 and rig.sent == [] and engine.calls == ["sleep 1"]
        assert runs[job.id].result(10) is JobStatus.cancelled
    finally:
        rig.stop()


def _host(sleep_mode: str) -> EngineHost:
    s = Settings(models=[{"name": "a"}, {"name": "b"}], sleep_mode=sleep_mode, affinity="off")  # type: ignore[list-item]
    host = EngineHost(s)
    host._thread.start()
    return host


def test_the_host_with_sleep_mode_sleeps_and_wakes_the_same_engine() -> None:
    host = _host("on")
    try:
        host.engine = engine = SleepyEngine()
        assert host.sleep_mode
        host.run(host.sleep())
        assert host.engine is engine and engine.calls == ["sleep 1"]
        host.run(host.wake())
        assert host.engine is engine and engine.calls == ["sleep 1", "wake_up weights", "wake_up kv_cache"]
    finally:
        host.engine = None
        host.stop()


def test_the_weights_wake_early_only_where_they_fit_beside_the_awake_model(monkeypatch) -> None:
    """A wake learns the weights' size (NVML's free memory before and after them); asleep again, the
    weights come back early only with that size and a 2 GiB margin free; the wake then maps the KV
    cache alone. Without a reading (no GPU) nothing is woken early."""
    gib = 2**30
    free: list[int | None] = []
    monkeypatch.setattr(gpumem, "free_bytes", lambda: free.pop(0))
    host = _host("on")
    try:
        host.engine = engine = SleepyEngine()
        host.run(host.sleep())
        assert not host.run(host.wake_weights()), "its weights' size is not known before a wake"
        free[:] = [100 * gib, 86 * gib]
        host.run(host.wake())
        assert host.weights_bytes == 14 * gib and engine.calls[-2:] == ["wake_up weights", "wake_up kv_cache"]
        host.run(host.sleep())
        free[:] = [15 * gib]
        assert not host.run(host.wake_weights()) and engine.calls[-1] == "sleep 1", "14 GiB + 2 do not fit in 15"
        free[:] = [None]
        assert not host.run(host.wake_weights())
        free[:] = [16 * gib]
        assert host.run(host.wake_weights()) and engine.calls[-1] == "wake_up weights"
        host.run(host.wake())
        assert engine.calls[-2:] == ["wake_up weights", "wake_up kv_cache"] and not host.weights_up
        assert free == [], "the wake after an early one reads nothing"
    finally:
        host.engine = None
        host.stop()


def test_the_host_without_sleep_mode_stops_the_engine_and_starts_another(monkeypatch) -> None:
    host = _host("off")
    try:
        host.engine = first = SleepyEngine()
        assert not host.sleep_mode
        host.run(host.sleep())
        assert host.engine is None and first.calls == ["shutdown"]
        started: list[SleepyEngine] = []

        async def create() -> None:
            host.engine = SleepyEngine()
            started.append(host.engine)
        monkeypatch.setattr(host, "_create", create)
        host.run(host.wake())
        assert len(started) == 1 and host.engine is started[0] and first.calls == ["shutdown"]
    finally:
        host.engine = None
        host.stop()
