"""A fleet of real processes that tests may break: redis-server (with an append-only file, so a
restart keeps the queue and the jobs), a gateway and workers that can be killed and replaced."""

from __future__ import annotations

import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from inferq.cli.procs import start_redis
from tests.conftest import Service, free_port, inferq_env, spawn
from tests.wait import eventually

PY = [sys.executable, "-m", "inferq.cli"]
FLEET_ENV = {
    "INFERQ_MAX_NUM_SEQS": "32",
    "INFERQ_CPU_KV_CACHE_GIB": "0.25",
    "INFERQ_HEARTBEAT_S": "0.5",
    "INFERQ_WORKER_TTL_S": "6",  # on 2 shared cores a busy engine loop can miss a few beats
    "INFERQ_DRAIN_TIMEOUT_S": "1",
    "INFERQ_MAX_ATTEMPTS": "4",
}


@dataclass
class Fleet:
    logdir: Path
    redis_port: int = field(default_factory=free_port)
    api_port: int = field(default_factory=free_port)
    redis: Service | None = None
    gateway: Service | None = None
    workers: dict[str, Service] = field(default_factory=dict)
    spawned: int = 0
    extra_env: dict[str, str] = field(default_factory=dict)  # over FLEET_ENV, for every process
    api_key: str | None = None  # the key the fleet's own calls send (when extra_env sets keys)

    @property
    def redis_url(self) -> str:
        return f"redis://127.0.0.1:{self.redis_port}/0"

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.api_port}"

    @property
    def ws(self) -> str:
        return f"ws://127.0.0.1:{self.api_port}"

    def env(self, **extra: str) -> dict[str, str]:
        return inferq_env(self.redis_url, **{**FLEET_ENV, **self.extra_env, **extra})

    def start(self, workers: int = 2) -> Fleet:
        """Redis, the gateway and ``workers`` workers (their engines start side by side)."""
        self.start_redis()
        self.start_gateway()
        wids = [self.start_worker(wait=False) for _ in range(workers)]
        for wid in wids:
            self.wait_worker(wid)
        return self

    def launch(self) -> Fleet:
        """Redis, the gateway and one worker, not waited for (a fixture started ahead); stopped if
        any of them fails to start."""
        try:
            self.start_redis()
            self.start_gateway()
            self.start_worker(wait=False)
        except BaseException:
            self.stop()
            raise
        return self

    def start_redis(self) -> None:
        """redis-server with an append-only file: restarted, it has every job and queue back."""
        self.redis = start_redis(self.redis_port, self.logdir, appendonly=True, name="fleet-redis")

    def restart_redis(self, down_s: float = 1.0) -> None:
        assert self.redis is not None
        self.redis.stop(signal.SIGKILL)
        time.sleep(down_s)
        self.start_redis()

    def start_gateway(self) -> None:
        self.gateway = spawn("fleet-gateway", [*PY, "api", "--port", str(self.api_port)], self.env(), self.logdir)
        eventually(lambda: self._get("/healthz") is not None, 30, "fleet gateway", procs=[self.gateway], interval=0.2)

    def start_worker(self, wait: bool = True) -> str:
        self.spawned += 1
        wid = f"fw{self.spawned}"
        self.workers[wid] = spawn(f"fleet-{wid}", [*PY, "worker"], self.env(INFERQ_WORKER_ID=wid), self.logdir)
        if wait:
            self.wait_worker(wid)
        return wid

    def wait_worker(self, wid: str, timeout: float = 180) -> None:
        def live() -> bool:  # an engine group (INFERQ_FRONTENDS): all of its frontends, ids wid-0, wid-1...
            ws = self._get("/v1/workers")
            mine = [w for w in ws or [] if (w["id"] == wid or w["id"].startswith(f"{wid}-")) and not w["draining"]]
            return bool(mine) and len(mine) == mine[0]["frontends"]
        eventually(live, timeout, f"worker {wid}", procs=[self.workers[wid]], interval=0.2)

    def kill_worker(self, wid: str, sig: int = signal.SIGKILL) -> None:
        self.workers.pop(wid).stop(sig, grace=30)

    def live(self) -> list[str]:
        return [w for w, s in self.workers.items() if s.alive()]

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def http(self) -> httpx.Client:
        return httpx.Client(base_url=self.base, timeout=30, headers=self.headers)

    def _get(self, path: str) -> object | None:
        try:
            r = httpx.get(self.base + path, timeout=2, headers=self.headers)
            return r.json() if r.status_code == 200 else None
        except (httpx.HTTPError, ValueError):
            return None

    def stop(self) -> None:
        for s in [self.gateway, *self.workers.values(), self.redis]:
            if s is not None:
                s.stop(signal.SIGKILL if s is self.redis else signal.SIGTERM, grace=20)
