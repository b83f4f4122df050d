"""Chaos scenarios on Redis Sentinel: the master SIGKILLed under load, a replica promoted.

Each runs on a fleet of its own (:class:`SentinelFleet`): a master and a replica (append-only files,
fsynced on every write), three Sentinels (quorum 2, down after 1 s), two gateways and two workers,
every process given the three Sentinels in the same order.

- ``failover``: streaming jobs over both gateways, all running, and a batch of 200 lines (those
  the streams leave slots for running, the rest queued); the master SIGKILLed.
- ``failover_sentinel_down``: the same, with the first Sentinel of the list down from the start
  (every process starts with it dead and must ask the next one, at start and through the failover).

Reported beyond the usual figures: the time from the kill until the Sentinels name the new master,
until each gateway accepts a new job, until every stream open at the kill receives an event again;
stranded jobs (still counted queued or running once everything ended), the batch's lines answered
twice or never, and the probes' jobs lost.
"""

from __future__ import annotations

import asyncio
import json
import signal
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import redis

from inferq.cli.procs import start_redis
from inferq.shared.settings import Settings
from tests.chaos.client import Client, Followed, Outcome, figures, summary
from tests.conftest import Service, free_port, spawn
from tests.fleet import PY, Fleet
from tests.procs import start_sentinel
from tests.wait import WaitTimeout, eventually, eventually_async

SCENARIOS = ["failover", "failover_sentinel_down"]
MASTER = "inferq"
DOWN_AFTER_MS = 1000
#: 48 sequences per engine: the 64 streams run at once on two workers, and 32 of the batch's lines beside them
FLEET_ENV = {"INFERQ_MAX_NUM_SEQS": "48", "INFERQ_CPU_KV_CACHE_GIB": "0.5"}


@dataclass
class SentinelFleet(Fleet):
    first_sentinel_down: bool = False
    replica_port: int = field(default_factory=free_port)
    sentinel_ports: list[int] = field(default_factory=lambda: [free_port() for _ in range(3)])
    api_port2: int = field(default_factory=free_port)
    replica: Service | None = None
    sentinels: list[Service] = field(default_factory=list)
    gateway2: Service | None = None

    @property
    def sentinel_list(self) -> str:
        return ",".join(f"127.0.0.1:{p}" for p in self.sentinel_ports)

    @property
    def settings(self) -> Settings:
        return Settings(redis_url=self.redis_url, redis_sentinels=self.sentinel_list, redis_sentinel_master=MASTER)

    def env(self, **extra: str) -> dict[str, str]:
        return super().env(INFERQ_REDIS_SENTINELS=self.sentinel_list, INFERQ_REDIS_SENTINEL_MASTER=MASTER, **extra)

    def start_redis(self) -> None:
        self.redis = start_redis(self.redis_port, self.logdir, appendonly=True, name="fo-master")
        self.replica = start_redis(self.replica_port, self.logdir, appendonly=True, name="fo-replica",
                                   replica_of=self.redis_port)
        with redis.Redis(port=self.replica_port) as r:
            eventually(lambda: r.info("replication").get("master_link_status"), 30, "the replica in sync",
                       until=lambda s: s == "up")
        self.sentinels = [start_sentinel(p, self.logdir, self.redis_port, master=MASTER, quorum=2,
                                         down_after_ms=DOWN_AFTER_MS, name=f"fo-sentinel{i}")
                          for i, p in enumerate(self.sentinel_ports)]
        for p in self.sentinel_ports:
            with redis.Redis(port=p, decode_responses=True) as s:
                eventually(lambda s=s: s.sentinel_master(MASTER), 30, f"Sentinel {p} to see the others",
                           until=lambda m: m["num-slaves"] >= 1 and m["num-other-sentinels"] == 2)
        if self.first_sentinel_down:
            self.sentinels[0].stop(signal.SIGKILL)

    def start_gateway(self) -> None:
        super().start_gateway()
        self.gateway2 = spawn("fleet-gateway2", [*PY, "api", "--port", str(self.api_port2)], self.env(), self.logdir)
        eventually(lambda: httpx.get(f"http://127.0.0.1:{self.api_port2}/healthz", timeout=2).status_code == 200,
                   30, "the second gateway", procs=[self.gateway2], interval=0.2, ignore=(httpx.HTTPError,))

    def master_named(self) -> int | None:
        """The master's port as the live Sentinels name it in SENTINEL MASTERS (what clients read),
        once no failover is under way; None meanwhile."""
        for s in self.sentinels:
            if s.alive():
                try:
                    with redis.Redis(port=s.port, decode_responses=True, socket_timeout=1) as c:
                        m = c.sentinel_master(MASTER)
                except redis.RedisError:
                    continue
                if m["flags"] == "master":
                    return int(m["port"])
        return None

    def stop(self) -> None:
        for s in [self.gateway2, self.replica, *self.sentinels]:
            if s is not None:
                s.stop(signal.SIGTERM if s is self.gateway2 else signal.SIGKILL, grace=20)
        super().stop()


def _lines(n: int, max_tokens: int) -> bytes:
    return "\n".join(json.dumps({"custom_id": f"line-{i}", "method": "POST", "url": "/v1/chat/completions",
                                 "body": {"model": "inferq-tiny", "max_tokens": max_tokens, "ignore_eos": True,
                                          "messages": [{"role": "user", "content": f"failover line {i}"}]}})
                     for i in range(n)).encode()


async def _batch(client: Client, lines: int, max_tokens: int) -> str:
    up = await client.http.post("/v1/files", files={"file": ("lines.jsonl", _lines(lines, max_tokens))},
                                data={"purpose": "batch"})
    b = await client.http.post("/v1/batches", json={"input_file_id": up.json()["id"], "completion_window": "24h",
                                                    "endpoint": "/v1/chat/completions"})
    return str(b.json()["id"])


async def _batch_end(client: Client, batch_id: str, lines: int) -> dict[str, Any]:
    """The batch's end: its status, lines answered twice or never, failed lines by error code."""
    async def view() -> dict[str, Any]:
        return dict((await client.http.get(f"/v1/batches/{batch_id}")).json())

    try:
        b = await eventually_async(view, 600, "the batch to end", interval=1, ignore=(httpx.HTTPError,),
                                   until=lambda b: b["status"] in ("completed", "failed", "cancelled", "expired"))
    except WaitTimeout:
        b = await view()
    answered: Counter[str] = Counter()
    failed: Counter[str] = Counter()
    for key in ("output_file_id", "error_file_id"):
        if b.get(key):
            for raw in (await client.http.get(f"/v1/files/{b[key]}/content")).text.splitlines():
                line = json.loads(raw)
                answered[line["custom_id"]] += 1
                if line.get("error") or (line.get("response") or {}).get("status_code") != 200:
                    err = line.get("error") or (line["response"]["body"].get("error") or {})
                    failed[str(err.get("code") or err.get("type"))] += 1
    return {"status": b["status"], "lines": lines, "answered": len(answered),
            "duplicated": sum(n - 1 for n in answered.values()), "unanswered": lines - len(answered),
            "failed": dict(failed)}


async def _probe(fleet: SentinelFleet, key: str, t_kill: float) -> dict[str, Any]:
    """New jobs sent to both gateways from the kill on, until each has accepted one: the seconds
    from the kill to each gateway's first 202, what the others got, and the accepted jobs' ids."""
    first: dict[str, float] = {}
    refused: Counter[str] = Counter()
    ids: list[tuple[str, str]] = []
    bases = {"gateway1": fleet.base, "gateway2": f"http://127.0.0.1:{fleet.api_port2}"}
    async with httpx.AsyncClient(timeout=30, headers={"Authorization": f"Bearer {key}"}) as http:
        async def one(name: str) -> None:
            while name not in first:
                try:
                    r = await http.post(f"{bases[name]}/v1/jobs", json={"prompt": "probe", "max_tokens": 4})
                except httpx.HTTPError as e:
                    refused[type(e).__name__] += 1
                else:
                    if r.status_code == 202:
                        first[name] = round(time.time() - t_kill, 2)
                        ids.append((name, r.json()["id"]))
                    else:
                        refused[str(r.status_code)] += 1
                await asyncio.sleep(0.1)

        await asyncio.gather(*(one(n) for n in bases))
    return {"accepted_after_s": first, "refused": dict(refused), "ids": ids}


async def _stranded(client: Client) -> int:
    """Jobs /v1/queue still counts queued or running once every job ended (0 awaited for a minute)."""
    async def counted() -> int:
        models = (await client.http.get("/v1/queue")).json()["models"]
        return sum(m["queued"] + m["running"] for m in models)

    try:
        return await eventually_async(counted, 60, "nothing counted queued or running", until=lambda n: n == 0,
                                      interval=1, ignore=(httpx.HTTPError,))
    except WaitTimeout:
        return await counted()


async def scenario(fleet: SentinelFleet, a: Client, b: Client, jobs: int = 64, max_tokens: int = 1000,
                   lines: int = 200, line_tokens: int = 300) -> dict[str, Any]:
    """Streams over both gateways, all running, and a batch, some of its lines running and the
    rest queued; the master SIGKILLed."""
    tag = uuid.uuid4().hex[:8]
    submitted: dict[str, Client] = {}  # job id -> the client (gateway) that follows it

    async def stream(i: int) -> tuple[str, Followed]:
        c = (a, b)[i % 2]
        job_id = await c.submit({"prompt": f"failover {i}:", "max_tokens": max_tokens, "ignore_eos": True,
                                 "temperature": 0}, f"failover-{tag}-{i}")
        submitted[job_id] = c
        return job_id, await c.follow(job_id, 900)

    streams = asyncio.gather(*(stream(i) for i in range(jobs)))

    async def running(more: int) -> bool:  # every stream runs (none queued), and ``more`` jobs besides
        q = (await a.http.get("/v1/queue")).json()["models"]
        return (len(submitted) == jobs and sum(m["by_priority"]["5"] for m in q) == 0
                and sum(m["running"] for m in q) >= jobs + more)
    await eventually_async(lambda: running(0), 300, "every stream running", interval=0.2)
    batch_id = await _batch(a, lines, line_tokens)  # its lines take the slots left; the rest wait queued
    await eventually_async(lambda: running(1), 300, "some of the batch's lines running", interval=0.2)
    t_kill = time.time()
    fleet.redis.stop(signal.SIGKILL)

    async def promoted() -> float:
        await eventually_async(fleet.master_named, 120, "the Sentinels to name the replica",
                               until=lambda p: p == fleet.replica_port, interval=0.05)
        return round(time.time() - t_kill, 2)

    promote_s, probe = await asyncio.gather(promoted(), _probe(fleet, fleet.api_key or "", t_kill))
    followed = await streams
    outcomes: list[Outcome] = list(await asyncio.gather(*(submitted[j].outcome(j, f) for j, f in followed)))
    probes = [await (a if g == "gateway1" else b).final(j, 120) for g, j in probe.pop("ids")]
    open_at_kill = [o.followed for o in outcomes
                    if not any(t < t_kill and e["type"] in ("done", "error")
                               for t, e in zip(o.followed.times, o.followed.events, strict=True))]
    moved = [next((t - t_kill for t in f.times if t > t_kill), None) for f in open_at_kill]
    report = figures(outcomes)
    report.update(
        promote_s=promote_s, **probe, probes_lost=sum(p is None for p in probes),
        streams_open_at_kill=len(open_at_kill), streams_never_moved=sum(m is None for m in moved),
        moved_again_s=summary([m for m in moved if m is not None]), told=sum(o.followed.told for o in outcomes),
        batch=await _batch_end(a, batch_id, lines), stranded=await _stranded(a),
        workers_alive=len(fleet.live()), workers=len(fleet.workers),
        first_sentinel_down=fleet.first_sentinel_down)
    return report


def problems(r: dict[str, Any]) -> list[str]:
    """What went wrong beyond lost, corrupted and bare closes (empty: it held)."""
    bad = []
    if r["succeeded"] + sum(r["failed"].values()) != r["submitted"] or r["failed"]:
        bad.append(f"not every job succeeded: failed {r['failed']}")
    if r["stranded"] or r["probes_lost"] or r["streams_never_moved"]:
        bad.append(f"stranded {r['stranded']}, probes lost {r['probes_lost']}, "
                   f"streams that never moved again {r['streams_never_moved']}")
    if len(r["accepted_after_s"]) < 2:
        bad.append("a gateway never accepted a job again")
    bt = r["batch"]
    if bt["status"] != "completed" or bt["duplicated"] or bt["unanswered"] or bt["failed"]:
        bad.append(f"batch {bt['status']}: duplicated {bt['duplicated']}, unanswered {bt['unanswered']}, "
                   f"failed {bt['failed']}")
    return bad


def cell(r: dict[str, Any]) -> str:
    bt, acc, mv = r["batch"], r["accepted_after_s"], r["moved_again_s"]
    return (("first of 3 Sentinels down; " if r["first_sentinel_down"] else "") +
            f"master SIGKILLed; new master named after {r['promote_s']} s; new jobs accepted after "
            f"{acc.get('gateway1')} / {acc.get('gateway2')} s (gateways 1 / 2; meanwhile {r['refused'] or 'none'}); "
            f"{r['streams_open_at_kill']} open streams moved again after p50/max {mv.get('p50')}/{mv.get('max')} s; "
            f"sockets told why: {r['told']}; batch of {bt['lines']} lines {bt['status']}: duplicated "
            f"{bt['duplicated']}, unanswered {bt['unanswered']}, failed {bt['failed'] or 0}; stranded {r['stranded']}; "
            f"probe jobs lost {r['probes_lost']}")


def run(name: str, logdir: Path, extra_env: dict[str, str], keys: tuple[str, str],
        sizes: dict[str, Any]) -> dict[str, Any]:
    """Scenario ``name`` on a fleet of its own, started and stopped here."""
    folder = logdir / name
    folder.mkdir(parents=True, exist_ok=True)
    fleet = SentinelFleet(folder, extra_env={**extra_env, **FLEET_ENV}, api_key=keys[0],
                          first_sentinel_down=name == "failover_sentinel_down")

    async def go() -> dict[str, Any]:
        a = Client(fleet.base, fleet.ws, keys[0])
        b = Client(f"http://127.0.0.1:{fleet.api_port2}", f"ws://127.0.0.1:{fleet.api_port2}", keys[0])
        try:
            return await scenario(fleet, a, b, **sizes)
        finally:
            await a.aclose()
            await b.aclose()

    try:
        fleet.start()
        return asyncio.run(go())
    finally:
        fleet.stop()
