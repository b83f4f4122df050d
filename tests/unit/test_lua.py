"""The Redis scripts' one home (shared/lua/): each compiles in a real Redis, none spells a status
or builds an error of its own, and the events callers pass in come out as the schemas say."""

from __future__ import annotations

import json
import re
from importlib import resources

import pytest
import redis.asyncio

from inferq.shared import keys, lua
from inferq.shared.schemas import JobRecord, JobRequest, JobStatus, parse_event
from inferq.shared.store import JobStore


def bodies() -> dict[str, str]:
    folder = resources.files("inferq.shared.lua")
    return {name: (folder / f"{name}.lua").read_text() for name in [*lua.names(), "prelude"]}


def test_every_python_script_is_in_the_lua_folder() -> None:
    """No module of the four parts holds a script of its own (a call of Redis' scripting API)."""
    from tests.unit.test_imports import ROOT, source_files

    found = [f"{p.relative_to(ROOT)}" for p in source_files("api", "worker", "shared", "cli")
             if "redis.call(" in p.read_text()]
    assert found == []


def test_no_script_spells_a_status_or_makes_an_error() -> None:
    statuses = "|".join(s.value for s in JobStatus)
    spelled = re.compile(rf"""['"]\\?"?({statuses})\\?"?['"]""")
    made = re.compile(r"\b(type|code|message)\s*=\s*['\"]")
    for name, body in bodies().items():
        code = "\n".join(line.split("--")[0] for line in body.splitlines())  # comments may name them
        assert not made.search(code), f"{name}.lua builds an error object"
        # a finish reason, a counter's label or the requeue's answer may say 'cancelled': not a status
        for m in spelled.finditer(code):
            line = code[code.rfind("\n", 0, m.start()) + 1:code.find("\n", m.end())]
            assert any(ok in line for ok in ("finish_reason", "count(", "outcome =")), \
                f"{name}.lua spells a status: {line.strip()}"


async def test_every_script_compiles(r: redis.asyncio.Redis) -> None:
    for name in lua.names():
        assert len(await r.script_load(lua.source(name))) == 40, name


async def test_a_script_with_a_syntax_error_does_not(r: redis.asyncio.Redis) -> None:
    with pytest.raises(redis.exceptions.ResponseError):
        await r.script_load(lua.source("job_update") + "\nif then end")


async def test_the_events_scripts_complete_are_valid_events(store: JobStore) -> None:
    """A queued job cancelled, and a running one given up after its last attempt: the final events
    parse as the schemas say, with the seq and message the script filled in."""
    rec = JobRecord(id="job-" + "a" * 32, model="m", request=JobRequest(prompt="x"))
    await store.create(rec)
    assert await store.request_cancel(rec.id) is JobStatus.queued
    [done] = await store.read_log(rec.id)
    assert done.type == "done" and done.seq == 1 and done.status is JobStatus.cancelled
    rec = JobRecord(id="job-" + "b" * 32, model="m", request=JobRequest(prompt="x"))
    await store.create(rec)
    await store.claim(rec.id, "w1")
    assert await store.requeue(rec.id, "w1", 1, "worker_lost", max_attempts=1) == "failed"
    [failed] = await store.read_log(rec.id)
    assert failed.type == "error" and failed.seq == 1 and failed.error.code == "worker_lost"
    assert failed.error.message == "the job was interrupted 1 times (last: worker_lost); giving up"
    assert (await store.get(rec.id)).error == failed.error
    raw = json.loads((await store.read_log_raw(rec.id))[0])
    assert parse_event(json.dumps(raw)) == failed and set(raw["error"]) == {"type", "code", "message", "param"}
    assert int(await store.redis.hget(keys.STATS, keys.stat("end", "m", "failed", "worker_lost"))) == 1
