"""The worker's metrics port answers from the start: while its engine starts (minutes for a large
model) ``/ready`` says 503 and ``/metrics`` serves, so a probe or a scrape is answered, not
refused; ``/ready`` turns 200 with the first heartbeat."""

from __future__ import annotations

import threading

import httpx
import pytest

from bench.standin import LoopHost
from tests.procs import free_port
from tests.unit.workerkit import GatedEngine, make_runtime
from tests.wait import eventually


class SlowStart(LoopHost):
    """An engine host whose start waits for ``gate``."""

    def __init__(self) -> None:
        super().__init__(GatedEngine())
        self.gate = threading.Event()
        self.starting = threading.Event()

    def start(self) -> None:
        self.starting.set()
        assert self.gate.wait(60), "the test never let the engine start"
        super().start()


def test_metrics_and_ready_answer_while_the_engine_starts(own_redis: str) -> None:
    host, port = SlowStart(), free_port()
    rig = make_runtime(own_redis, host, metrics_port=port)
    starter = threading.Thread(target=rig.runtime.start, name="worker-start")
    starter.start()
    base = f"http://127.0.0.1:{port}"
    try:
        assert host.starting.wait(30)
        ready = httpx.get(f"{base}/ready", timeout=5)
        assert (ready.status_code, ready.text) == (503, "not ready\n")
        scrape = httpx.get(f"{base}/metrics", timeout=5)
        assert scrape.status_code == 200
        info = f'inferq_worker_info{{frontend="0",model_name="scripted",worker_id="{rig.runtime.id}"}} 1.0'
        assert info in scrape.text
        assert 'inferq_worker_heartbeat_age_seconds{model_name="scripted"} +Inf' in scrape.text
        assert not host.loop.is_running()  # the engine was still starting all along
        host.gate.set()
        starter.join(60)
        eventually(lambda: httpx.get(f"{base}/ready", timeout=5).status_code == 200, 30, "/ready says ready")
    finally:
        host.gate.set()
        starter.join(60)
        rig.stop()
    with pytest.raises(httpx.ConnectError):  # stopped: the port is given back
        httpx.get(f"{base}/ready", timeout=2)


def test_an_engine_that_fails_to_start_gives_the_port_back(own_redis: str) -> None:
    class Broken(LoopHost):
        def start(self) -> None:
            raise RuntimeError("no GPU")

    port = free_port()
    rig = make_runtime(own_redis, Broken(GatedEngine()), metrics_port=port)
    with pytest.raises(RuntimeError, match="no GPU"):
        rig.runtime.start()
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"http://127.0.0.1:{port}/ready", timeout=2)
