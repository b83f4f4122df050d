"""LoRA adapters' plumbing without an engine: the settings that name them, ids unique in the fleet,
an engine's adapters loaded once, refused cleanly and held as the engine holds them (a scripted
engine), the fleet's registry in Redis (a real one) as gateways resolve and change it (and who may)
and as workers answer loads."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from inferq.api.adapters import Adapters, LoadAdapterRequest, UnloadAdapterRequest
from inferq.api.auth import read_keys_file
from inferq.api.service import JobService
from inferq.shared import keys
from inferq.shared.adapters import AdapterRegistry
from inferq.shared.errors import Forbidden, InvalidRequest, NotFound
from inferq.shared.schemas import AdapterCommand, AdapterInfo, AdapterRef, AdapterReply, WorkerInfo
from inferq.shared.settings import Settings
from inferq.worker.engine import fleet_adapters
from inferq.worker.engine.adapters import AdapterLoadFailed, EngineAdapters, lora_id
from tests.wait import eventually_async

pytest.importorskip("vllm")  # LoRARequest


class ScriptedEngine:
    """add_lora / remove_lora / list_loras as AsyncLLM has them; a path with ``bad`` in it fails as
    vLLM's do. Like vLLM's, it holds at most ``capacity`` adapters, dropping the least recently added."""

    def __init__(self, capacity: int = 8) -> None:
        self.added: list[str] = []
        self.removed: list[int] = []
        self.held: dict[int, str] = {}
        self.capacity = capacity

    async def add_lora(self, req) -> bool:
        await asyncio.sleep(0.01)
        self.added.append(req.lora_name)
        if "bad" in req.lora_path:
            raise Exception("Call to add_lora method failed: Worker failed with error 'Loading lora x failed: No "
                            "adapter found for /bad', please check the stack trace above for the root cause")
        self.held.pop(req.lora_int_id, None)
        self.held[req.lora_int_id] = req.lora_name
        while len(self.held) > self.capacity:
            del self.held[next(iter(self.held))]
        return True

    async def remove_lora(self, lora_id: int) -> bool:
        self.removed.append(lora_id)
        self.held.pop(lora_id, None)
        return True

    async def list_loras(self) -> set[int]:
        return set(self.held)


def ref(name: str, path: str | Path, id: int = 0) -> AdapterRef:
    return AdapterRef(name=name, path=str(path), id=id)


async def subscribed(r, channel: str, n: int = 1) -> None:
    """Wait until ``n`` clients listen on ``channel``."""
    await eventually_async(lambda: r.pubsub_numsub(channel), 10, f"{n} listeners on {channel}",
                           until=lambda got: got and got[0][1] >= n)


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


async def test_adapter_ids_are_unique_by_construction(r) -> None:
    """Ids come from the registry's counter: two names never share one (crc32 of name and path could
    be made to collide in seconds), a replaced adapter gets a new one, and a worker's own adapter keeps
    its id while the registry holds it with the same folder."""
    registry = AdapterRegistry(r)
    a = (await registry.put(AdapterInfo(name="a", parent="m", path="/p"), "settings")).info
    b = (await registry.put(AdapterInfo(name="b", parent="m", path="/p"), "settings")).info
    again = await registry.put(AdapterInfo(name="a", parent="m", path="/p"), "settings")
    assert again.outcome == "kept" and again.info.id == a.id and len({a.id, b.id}) == 2 and min(a.id, b.id) > 0
    moved = await registry.put(AdapterInfo(name="a", parent="m", path="/q"), "settings")
    assert moved.outcome == "put" and moved.info.id not in (a.id, b.id) and moved.replaced.path == "/p"
    assert lora_id(ref("a", "/p", id=7)) == 7
    assert lora_id(ref("a", "/p")) == lora_id(ref("a", "/p")) != lora_id(ref("a", "/q"))  # an older registry's


async def test_an_engine_loads_an_adapter_once_however_many_jobs_ask(tmp_path: Path) -> None:
    engine, adapters = ScriptedEngine(), EngineAdapters(enabled=True, capacity=4)
    adapters.engine = engine
    reqs = await asyncio.gather(*(adapters.request(ref("a", tmp_path, 1)) for _ in range(5)))
    assert engine.added == ["a"] and len({id(r) for r in reqs}) == 1
    await adapters.request(ref("b", tmp_path, 2))
    await adapters.request(ref("a", tmp_path, 1))
    assert adapters.loaded() == ["b", "a"]  # least recently used first
    assert await adapters.unload("a") and engine.removed == [1] and adapters.loaded() == ["b"]
    assert not await adapters.unload("a")


async def test_what_an_engine_holds_is_what_it_reports(tmp_path: Path) -> None:
    """The engine keeps max_cpu_loras adapters: this side says no more than that (it used to list
    every adapter ever loaded), forgets what the engine says it dropped, and loads such an adapter
    through add_lora again (which fails cleanly for a deleted folder, instead of the engine loading it
    itself and dying)."""
    engine, adapters = ScriptedEngine(capacity=2), EngineAdapters(enabled=True, capacity=2)
    adapters.engine = engine
    for i, name in enumerate(("a", "b", "c")):
        await adapters.request(ref(name, tmp_path, i + 1))
    assert adapters.loaded() == ["b", "c"] and set(engine.held.values()) == {"b", "c"}
    engine.held.pop(2)  # the engine dropped b on its own
    await adapters.sync()
    assert adapters.loaded() == ["c"]
    await adapters.request(ref("b", tmp_path, 2))
    assert engine.added[-1] == "b"
    gone = tmp_path / "gone"
    gone.mkdir()
    await adapters.request(ref("g", gone, 9))
    await adapters.request(ref("x", tmp_path, 10))
    await adapters.request(ref("y", tmp_path, 11))  # g dropped
    gone.rmdir()
    calls = len(engine.added)
    with pytest.raises(AdapterLoadFailed, match="is gone"):
        await adapters.request(ref("g", gone, 9))
    assert len(engine.added) == calls  # refused before the engine is asked


async def test_a_gateway_registers_refuses_a_taken_name_and_unloads(r) -> None:
    got = []

    async def listen() -> None:
        async with r.pubsub(ignore_subscribe_messages=True) as ps:
            await ps.subscribe(keys.ADAPTER_CHANNEL)
            async for raw in ps.listen():
                got.append(AdapterCommand.model_validate_json(raw["data"]))

    listener = asyncio.create_task(listen())
    await subscribed(r, keys.ADAPTER_CHANNEL)
    adapters = Adapters(Settings(), r)
    text = await adapters.load(LoadAdapterRequest(lora_name="ga", lora_path="/p1"), "m", live_workers=0)
    assert text == "Success: LoRA adapter 'ga' added successfully."
    first = await adapters.get("ga")
    assert first.path == "/p1" and first.source == "runtime" and first.id > 0
    with pytest.raises(InvalidRequest, match="already been loaded"):
        await adapters.load(LoadAdapterRequest(lora_name="ga", lora_path="/p2"), "m", live_workers=0)
    await adapters.load(LoadAdapterRequest(lora_name="ga", lora_path="/p2", load_inplace=True), "m", live_workers=0)
    assert (await adapters.get("ga")).path == "/p2" and (await adapters.get("ga")).id != first.id
    assert "removed" in await adapters.unload(UnloadAdapterRequest(lora_name="ga"))
    assert await adapters.get("ga") is None
    with pytest.raises(NotFound):
        await adapters.unload(UnloadAdapterRequest(lora_name="ga"))
    await eventually_async(lambda: len(got), 10, "both unloads published", until=lambda n: n >= 2)
    listener.cancel()
    assert [(c.op, c.adapter.path) for c in got] == [("unload", "/p1"), ("unload", "/p2")]


async def test_a_key_manages_only_the_adapters_it_loaded(r) -> None:
    """Key B can neither replace (load_inplace) nor unload key A's adapter; an operator key can."""
    adapters = Adapters(Settings(), r)
    await adapters.load(LoadAdapterRequest(lora_name="a1", lora_path="/a"), "m", 0, owner="key-a", operator=False)
    with pytest.raises(Forbidden) as e:
        await adapters.load(LoadAdapterRequest(lora_name="a1", lora_path="/b", load_inplace=True), "m", 0,
                            owner="key-b", operator=False)
    assert e.value.status == 403 and e.value.param == "lora_name"
    with pytest.raises(Forbidden):
        await adapters.unload(UnloadAdapterRequest(lora_name="a1"), owner="key-b", operator=False)
    info = await AdapterRegistry(r).get("a1")
    assert (info.path, info.owner) == ("/a", "key-a")
    await adapters.load(LoadAdapterRequest(lora_name="a1", lora_path="/a2", load_inplace=True), "m", 0,
                        owner="key-a", operator=False)
    assert "removed" in await adapters.unload(UnloadAdapterRequest(lora_name="a1"), owner="op", operator=True)


async def test_a_load_waits_for_a_worker_and_a_refusal_frees_the_name(r, tmp_path: Path) -> None:
    """The gateway's load and a worker's handling of it, over real pub/sub."""
    engine, engine_adapters = ScriptedEngine(), EngineAdapters(enabled=True, capacity=4)
    engine_adapters.engine = engine
    worker = asyncio.create_task(fleet_adapters.listen(r, engine_adapters, "m", "w1"))
    await subscribed(r, keys.ADAPTER_CHANNEL)
    adapters = Adapters(Settings(lora_load_timeout_s=10), r)
    await adapters.load(LoadAdapterRequest(lora_name="good", lora_path=str(tmp_path)), "m", live_workers=1)
    assert engine_adapters.loaded() == ["good"]
    (tmp_path / "bad").mkdir()
    with pytest.raises(InvalidRequest) as e:
        await adapters.load(LoadAdapterRequest(lora_name="bad", lora_path=str(tmp_path / "bad")), "m",
                            live_workers=1)
    assert e.value.code == "adapter_load_failed" and "No adapter found for /bad" in e.value.message
    assert await adapters.get("bad") is None
    await adapters.unload(UnloadAdapterRequest(lora_name="good"))
    await eventually_async(engine_adapters.loaded, 10, "the unload carried out", until=lambda held: held == [])
    worker.cancel()


async def test_a_worker_answers_only_loads_for_its_model(r, tmp_path: Path) -> None:
    engine_adapters = EngineAdapters(enabled=True)
    engine_adapters.engine = ScriptedEngine()
    cmd = AdapterCommand(op="load", adapter=AdapterInfo(name="z", parent="other", path=str(tmp_path)),
                         reply_to="inferq:t:z")
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
    assert (model, info.id, adapter.name, adapter.path) == ("base-m", "wm", "ad-1", "/a1") and adapter.id > 0
    assert (await svc.resolve("base-m"))[2] is None
    with pytest.raises(NotFound):
        await svc.resolve("ad-2")


def test_over_http_a_key_manages_its_own_adapters_and_an_operator_key_any(own_redis: str, tmp_path: Path) -> None:
    """Run-time loads through the gateway with keys A and B and an operator key (role=operator):
    B's load_inplace of A's adapter and B's unload of it are 403 and change nothing; A's own are
    fine; the operator's unload of B's adapter is too."""
    from fastapi.testclient import TestClient

    from inferq.api.app import create_app

    f = tmp_path / "keys"
    f.write_text("sk-a\nsk-b\nsk-op ops role=operator\n")
    model = "lora-owners"  # no live worker: loads are registered, loaded on first use
    settings = Settings(redis_url=own_redis, served_model_name=model, api_keys_file=f, lora_runtime_updates=True)

    def call(c: TestClient, key: str, op: str, **body: object) -> tuple[int, str]:
        r = c.post(f"/v1/{op}_lora_adapter", json=body, headers={"Authorization": f"Bearer {key}"})
        return r.status_code, r.text

    with TestClient(create_app(settings)) as c:
        assert call(c, "sk-a", "load", lora_name="a1", lora_path="/a1")[0] == 200
        status, text = call(c, "sk-b", "load", lora_name="a1", lora_path="/evil", load_inplace=True)
        assert status == 403 and "adapter_not_owned" in text and "lora_name" in text
        assert call(c, "sk-b", "unload", lora_name="a1")[0] == 403
        got = {m["id"]: m for m in c.get("/v1/models", headers={"Authorization": "Bearer sk-a"}).json()["data"]}
        assert "a1" not in got or got["a1"].get("parent") == model
        assert call(c, "sk-a", "load", lora_name="a1", lora_path="/a2", load_inplace=True)[0] == 200
        assert call(c, "sk-b", "load", lora_name="b1", lora_path="/b1")[0] == 200
        assert call(c, "sk-op", "unload", lora_name="b1")[0] == 200
        assert call(c, "sk-a", "unload", lora_name="a1")[0] == 200
    assert [s.operator for s in read_keys_file(f).values()] == [False, False, True]
    f.write_text("sk-x role=admin\n")
    with pytest.raises(ValueError, match="line 1: role= must be user or operator"):
        read_keys_file(f)
