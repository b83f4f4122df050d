"""The gateway's view of which models are served: a submission reads the worker registry only for
a model it has not seen served lately; a stale view is refreshed in the background."""

from __future__ import annotations

import asyncio
import time

import pytest

from inferq.api import service as service_mod
from inferq.api.service import JobService
from inferq.shared import keys
from inferq.shared.errors import NotFound
from inferq.shared.schemas import WorkerInfo
from inferq.shared.settings import Settings


async def _register(r, model: str, worker_id: str, max_model_len: int) -> None:
    now = time.time()
    info = WorkerInfo(id=worker_id, model=model, host="h", pid=1, max_model_len=max_model_len, max_num_seqs=4,
                      started_at=now, last_seen=now)
    await r.set(keys.worker(worker_id), info.model_dump_json())
    await r.zadd(keys.workers(model), {worker_id: now})


async def _unregister(r, model: str, worker_id: str) -> None:
    await r.zrem(keys.workers(model), worker_id)
    await r.delete(keys.worker(worker_id))


async def test_a_stale_view_answers_at_once_and_is_refreshed_behind(r, monkeypatch) -> None:
    svc = JobService(Settings(), r, None, None)  # type: ignore[arg-type]  (resolving needs Redis only)
    await _register(r, "m1", "w1", 64)
    assert (await svc.resolve_model("m1"))[1].max_model_len == 64
    monkeypatch.setattr(service_mod, "WORKERS_CACHE_S", 0.0)  # every view is stale from now on
    await _unregister(r, "m1", "w1")
    await _register(r, "m1", "w2", 128)
    model, info = await svc.resolve_model("m1")
    assert (model, info.max_model_len) == ("m1", 64)  # what it saw, without waiting for Redis
    await asyncio.gather(*svc._looking.values())
    assert (await svc.resolve_model("m1"))[1].max_model_len == 128  # the refresh's answer


async def test_a_model_whose_workers_left_is_refused_once_the_refresh_saw_it(r, monkeypatch) -> None:
    svc = JobService(Settings(), r, None, None)  # type: ignore[arg-type]
    await _register(r, "m2", "w3", 64)
    await svc.resolve_model("m2")
    monkeypatch.setattr(service_mod, "WORKERS_CACHE_S", 0.0)
    await _unregister(r, "m2", "w3")
    await svc.resolve_model("m2")  # still answered from the view; the refresh finds no worker
    await asyncio.gather(*svc._looking.values())
    with pytest.raises(NotFound) as e:
        await svc.resolve_model("m2")
    assert e.value.param == "model"


async def test_a_view_older_than_a_worker_ttl_is_not_used(r) -> None:
    svc = JobService(Settings(worker_ttl_s=0.05), r, None, None)  # type: ignore[arg-type]
    await _register(r, "m3", "w4", 64)
    await svc.resolve_model("m3")
    await _unregister(r, "m3", "w4")
    await asyncio.sleep(0.1)
    with pytest.raises(NotFound):
        await svc.resolve_model("m3")
