"""``inferq up``: start Redis (if nothing answers), one worker and the gateway; stop all on Ctrl-C."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from urllib.parse import urlparse

import redis

from inferq.shared.settings import Settings


class Proc:
    def __init__(self, name: str, cmd: list[str], log_path: Path, env: dict[str, str]) -> None:
        self.name, self.log_path = name, log_path
        self.log = open(log_path, "ab")
        self.p = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, env=env,
                                  start_new_session=True)
        print(f"  {name:<8} pid {self.p.pid:<7} log {log_path}", flush=True)

    def stop(self, grace: float) -> None:
        if self.p.poll() is None:
            os.killpg(self.p.pid, signal.SIGTERM)
            try:
                self.p.wait(grace)
            except subprocess.TimeoutExpired:
                os.killpg(self.p.pid, signal.SIGKILL)
                self.p.wait()
        self.log.close()

    def tail(self, n: int = 20) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])


def _redis_answers(url: str) -> bool:
    try:
        return bool(redis.Redis.from_url(url, socket_connect_timeout=1).ping())
    except redis.RedisError:
        return False


def _ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return r.status == 200
    except OSError:
        return False


def _interrupt(*_: object) -> None:
    raise KeyboardInterrupt


def up(settings: Settings, host: str | None = None, port: int | None = None) -> int:
    host, port = host or settings.host, port or settings.port
    logs = settings.cache_dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    procs: list[Proc] = []
    signal.signal(signal.SIGTERM, _interrupt)
    print("inferq up: starting", flush=True)
    if not _redis_answers(settings.redis_url):
        u = urlparse(settings.redis_url)
        if u.hostname not in ("127.0.0.1", "localhost", "::1") or not shutil.which("redis-server"):
            print(f"Redis at {settings.redis_url} does not answer, and it is not a local one I can start.")
            return 1
        procs.append(Proc("redis", ["redis-server", "--port", str(u.port or 6379), "--bind", "127.0.0.1",
                                    "--save", "", "--appendonly", "no"], logs / "redis.log", env))
        for _ in range(50):
            if _redis_answers(settings.redis_url):
                break
            time.sleep(0.1)
    else:
        print(f"  redis    using {settings.redis_url}")
    py = [sys.executable, "-m", "inferq.cli"]
    procs.append(Proc("worker", [*py, "worker"], logs / "worker.log", env))
    procs.append(Proc("gateway", [*py, "api", "--host", host, "--port", str(port)], logs / "api.log", env))
    base = f"http://{host}:{port}"
    try:
        announced = False
        while True:
            for p in procs:
                if p.p.poll() is not None:
                    print(f"\n{p.name} exited with code {p.p.returncode}; last lines of {p.log_path}:\n{p.tail()}")
                    return 1
            if not announced and _ready(f"{base}/readyz"):
                announced = True
                print(f"\ninferq is ready at {base} serving model {settings.model_name!r}. Try:\n"
                      f"  curl -s {base}/v1/jobs -H 'content-type: application/json' "
                      f"-d '{{\"prompt\": \"Hello\", \"max_tokens\": 32}}'\n"
                      f"  curl -s {base}/v1/jobs/<id>\n"
                      f"  inferq stream <id>          (tokens over WebSocket)\n"
                      f"  inferq generate 'Hello'     (submit + stream on one socket)\n"
                      f"API docs: {base}/docs   Ctrl-C stops everything.", flush=True)
            time.sleep(0.5)
    except KeyboardInterrupt:
        print("\nstopping...", flush=True)
        return 0
    finally:
        for p in reversed(procs):
            p.stop(grace=30.0 if p.name == "worker" else 10.0)
        print("stopped.", flush=True)
