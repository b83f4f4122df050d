"""LoRA adapters' plumbing without an engine: the settings that name them, the ids every frontend
agrees on, an engine's adapters loaded once and refused cleanly (a scripted engine), the fleet's
registry in Redis (a real one) as gateways resolve and change it and as workers answer loads."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from inferq.api.adapters import Adapters, LoadAdapterRequest, UnloadAdapterRequest
from inferq.api.service import JobService
from inferq.shared import keys
from inferq.shared.errors import InvalidRequest, NotFound
from inferq.shared.schemas import AdapterCommand, AdapterInfo, AdapterRef, AdapterReply, WorkerInfo
from inferq.shared.settings import Settings
from inferq.worker.engine import fleet_adapters
from inferq.worker.engine.adapters import AdapterLoadFailed, EngineAdapters, lora_id

pytest.importorskip("vllm")  # LoRARequest


class ScriptedEngine:
    """add_lora / remove_lora as AsyncLLM has them; paths under ``bad`` fail as vLLM's do."""

    def __init__(self) -> None:
        self.added: list[str] = []
        self.removed: list[int] = []

    async def add_lora(self, req) -> bool:
        await asyncio.sleep(0.01)
        self.added.append(req.lora_name)
        if req.lora_path.startswith("/bad"):
            raise Exception("Call to add_lora method failed: Worker failed with error 'Loading lora x failed: No "
                            "adapter found for /bad', please check the stack trace above for the root cause")
        return True

    async def remove_lora(self, lora_id: int) -> bool:
        self.removed.append(lora_id)
        return True


def test_settings_name_adapters_by_folder_and_by_pair(tmp_path: Path) -> None:
    for name in ("one", "two"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "adapter_config.json").write_text("{}")
    (tmp_path / "not-an-adapter").mkdir()
    s = Settings(lora_dir=tmp_path, lora_modules=" three=/x/3 , two=/y/2")
    assert s.lora_adapters == {"one": str(tmp_path / "one"), "two": "/y/2", "three": "/x/3"}
    assert s.lora_enabled and not Settings().lora_enabled and Settings(enable_lora=True).lora_enabled
    for bad in ("nopath", "a b=/x", "inferq-tiny=/x", "=/x"):
        with pytest.raises(ValueError):
            Settings(lora_modules=bad).lora_adapters  # noqa: B018


def test_an_adapters_id_is_the_same_everywhere_and_differs_by_path() -> None:
    assert lora_id("a", "/p") == lora_id("a", "/p") > 0
    assert len({lora_id("a", "/p"), lora_id("a", "/q"), lora_id("b", "/p")}) == 3


async def test_an_engine_loads_an_adapter_once_however_many_jobs_ask() -> None:
    engine, adapters = ScriptedEngine(), EngineAdapters(enabled=True)
    adapters.engine = engine
    reqs = await asyncio.gather(*(adapters.request(AdapterRef(name="a", path="/a")) for _ in range(5)))
    assert engine.added == ["a"] and len({id(r) for r in reqs}) == 1
    await adapters.request(AdapterRef(name="b", path="/b"))
    await adapters.request(AdapterRef(name="a", path="/a"))
    assert adapters.loaded() == ["b", "a"]  # least recently used first
    assert await adapters.unload("a") and engine.removed == [lora_id("a", "/a")] and adapters.loaded() == ["b"]
    assert not await adapters.unload("a")


async def test_a_refused_adapter_raises_its_reason_and_is_tried_again_next_time() -> None:
    engine, adapters = ScriptedEngine(), EngineAdapters(enabled=True)
    adapters.engine = engine
    for _ in range(2):
        with pytest.raises(AdapterLoadFailed) as e:
            await adapters.request(AdapterRef(name="x", path="/bad"))
        assert e.value.message == "adapter 'x' could not be loaded: Worker failed with error 'Loading lora x " \
                                  "failed: No adapter found for /bad'"
        assert e.value.status == 400 and e.value.param == "model"
    assert engine.added == ["x", "x"] and adapters.loaded() == []
    off = EngineAdapters(enabled=False)
    with pytest.raises(AdapterLoadFailed, match="LoRA off"):
        await off.request(AdapterRef(name="x", path="/x"))


async def test_a_gateway_registers_refuses_a_taken_name_and_unloads(r) -> None:
    got = []

    async def listen() -> None:
        async with r.pubsub(ignore_subscribe_messages=True) as ps:
            await ps.subscribe(keys.ADAPTER_CHANNEL)
            async for raw in ps.listen():
                got.append(AdapterCommand.model_validate_json(raw["data"]))

    listener = asyncio.create_task(listen())
    await asyncio.sleep(0.1)
    adapters = Adapters(Settings(), r)
    text = await adapters.load(LoadAdapterRequest(lora_name="ga", lora_path="/p1"), "m", live_workers=0)
    assert text == "Success: LoRA adapter 'ga' added successfully."
    assert (await adapters.get("ga")).path == "/p1" and (await adapters.get("ga")).source == "runtime"
    with pytest.raises(InvalidRequest, match="already been loaded"):
        await adapters.load(LoadAdapterRequest(lora_name="ga", lora_path="/p2"), "m", live_workers=0)
    await adapters.load(LoadAdapterRequest(lora_name="ga", lora_path="/p2", load_inplace=True), "m", live_workers=0)
    assert (await adapters.get("ga")).path == "/p2"
    assert "removed" in await adapters.unload(UnloadAdapterRequest(lora_name="ga"))
    assert await adapters.get("ga") is None
    with pytest.raises(NotFound):
        await adapters.unload(UnloadAdapterRequest(lora_name="ga"))
    await asyncio.sleep(0.2)
    listener.cancel()
    assert [(c.op, c.adapter.path) for c in got] == [("unload", "/p1"), ("unload", "/p2")]


async def test_a_load_waits_for_a_worker_and_a_refusal_frees_the_name(r) -> None:
    """The gateway's load and a worker's handling of it, over real pub/sub."""
    engine, engine_adapters = ScriptedEngine(), EngineAdapters(enabled=True)
    engine_adapters.engine = engine
    worker = asyncio.create_task(fleet_adapters.listen(r, engine_adapters, "m", "w1"))
    await asyncio.sleep(0.1)
    adapters = Adapters(Settings(lora_load_timeout_s=10), r)
    await adapters.load(LoadAdapterRequest(lora_name="good", lora_path="/ok"), "m", live_workers=1)
    assert engine_adapters.loaded() == ["good"]
    with pytest.raises(InvalidRequest) as e:
        await adapters.load(LoadAdapterRequest(lora_name="bad", lora_path="/bad"), "m", live_workers=1)
    assert e.value.code == "adapter_load_failed" and "No adapter found for /bad" in e.value.message
    assert await adapters.get("bad") is None
    await adapters.unload(UnloadAdapterRequest(lora_name="good"))
    await asyncio.sleep(0.2)
    assert engine_adapters.loaded() == []
    worker.cancel()


async def test_a_worker_answers_only_loads_for_its_model(r) -> None:
    engine_adapters = EngineAdapters(enabled=True)
    engine_adapters.engine = ScriptedEngine()
    cmd = AdapterCommand(op="load", adapter=AdapterInfo(name="z", parent="other", path="/z"), reply_to="inferq:t:z")
    await fleet_adapters.handle(r, engine_adapters, "m", "w1", cmd)
    assert await r.llen("inferq:t:z") == 0
    await fleet_adapters.handle(r, engine_adapters, "other", "w1", cmd)
    assert AdapterReply.model_validate_json(await r.lpop("inferq:t:z")) == AdapterReply(worker="w1")
    assert await r.ttl("inferq:t:z") > 0 or await r.exists("inferq:t:z") == 0


async def test_a_submission_resolves_an_adapter_to_its_base_models_queue(r) -> None:
    now = time.time()
    await r.set(keys.worker("wm"), WorkerInfo(id="wm", model="base-m", host="h", pid=1, max_model_len=64,
                                              max_num_seqs=4, started_at=now, last_seen=now).model_dump_json())
    await r.zadd(keys.workers("base-m"), {"wm": now})
    await fleet_adapters.register(r, "base-m", {"ad-1": "/a1"})
    svc = JobService(Settings(), r, None, None)  # type: ignore[arg-type]  (resolving needs Redis only)
    model, info, adapter = await svc.resolve("ad-1")
    assert (model, info.id, adapter) == ("base-m", "wm", AdapterRef(name="ad-1", path="/a1"))
    assert (await svc.resolve("base-m"))[2] is None
    with pytest.raises(NotFound):
        await svc.resolve("ad-2")
