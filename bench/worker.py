"""Worker alone: the CPU one worker process spends per streamed token, with no engine in the way.

A paced engine stands in for vLLM's ``AsyncLLM``: every ``--step-ms`` it produces one token for
every running request at once, as one engine step does, and each job's ``generate()`` wakes up
for it, as vLLM's output handler wakes each request. Everything else is the worker's own code,
unchanged: :class:`WorkerRuntime` claims each job in a real Redis, :class:`JobRunner` turns the
engine's outputs into events and the :class:`EventWriter` writes them (Lua fencing, the job's
log, pub/sub); the heartbeat and reaper run on their threads. Jobs are run from a thread pool, as
Celery's threads run them.

Reported per level (jobs in flight): tokens written per second against those offered, the whole
process's CPU-seconds per 1,000 tokens, and the busiest thread's — the thread that caps a worker
(on a GPU, the engine's event loop) — with its share of one core. The stand-in engine's own work
runs on that thread too, as vLLM's output handler does; it is small next to the worker's.

``python -m bench worker --jobs 16,64,256 [--tokens 256] [--step-ms 10] [--profile stacks.txt]``
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import subprocess
import sys
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path
from typing import Any

import psutil

from bench.stack import Procs, py_spy
from bench.standin import LoopHost, Out, Step
from bench.sysinfo import cpu_model
from inferq.cli.procs import start_redis
from inferq.shared.redis import make_redis
from inferq.shared.schemas import JobMessage, JobRecord, JobRequest
from inferq.shared.schemas.jobs import ServiceClass
from inferq.shared.store import JobStore
from inferq.worker.loopthread import LoopThread
from tests.procs import free_port

MODEL = "bench-paced"


class PacedEngine:
    """One token per running request every ``step_s`` (started on the engine loop)."""

    def __init__(self, step_s: float) -> None:
        self.step_s = step_s
        self._tick = asyncio.Event()  # bound to the engine loop on first use
        self.steps = 0
        self.errored = False  # read by the worker's engine-death check

    async def clock(self) -> None:
        while True:
            await asyncio.sleep(self.step_s)
            tick, self._tick = self._tick, asyncio.Event()
            self.steps += 1
            tick.set()

    async def generate(self, prompt: Any, params: Any, request_id: str, **_: Any) -> Any:
        n = int(params.max_tokens)
        for i in range(n):
            await self._tick.wait()
            yield Step([Out(0, " tok", [7], "length" if i == n - 1 else None)], finished=i == n - 1)


def _threads() -> dict[str, float]:
    """CPU seconds of each live thread of this process, by thread name."""
    names = {t.native_id: t.name for t in threading.enumerate()}
    out: dict[str, float] = {}
    for t in psutil.Process().threads():
        name = names.get(t.id, f"native-{t.id}")
        out[name] = out.get(name, 0.0) + t.user_time + t.system_time
    return out


def _no_send(_msg: JobMessage) -> None:
    """The runtime's hand-back of a job here: none happens in this bench, and none must reach a queue."""


async def _ping(store: JobStore) -> None:
    await store.redis.ping()


async def _records(store: JobStore, n: int, tokens: int,
                   service_class: ServiceClass = "interactive") -> list[JobMessage]:
    msgs = []
    for _ in range(n):
        rec = JobRecord(id=f"job-{uuid.uuid4().hex}", model=MODEL,
                        request=JobRequest(prompt="one two three", max_tokens=tokens, ignore_eos=True,
                                           service_class=service_class))
        await store.create(rec)
        msgs.append(rec.message())
    return msgs


def _writes() -> tuple[float, float]:
    """The event writer's round trips and events so far (its batch-size histogram, every model)."""
    from prometheus_client import REGISTRY

    trips = events = 0.0
    for metric in REGISTRY.collect():
        if metric.name == "inferq_worker_event_batch_size":
            for sample in metric.samples:
                if sample.name.endswith("_count"):
                    trips += sample.value
                elif sample.name.endswith("_sum"):
                    events += sample.value
    return trips, events


def run_level(runtime: Any, store_run: Any, jobs: int, tokens: int, step_s: float) -> dict[str, Any]:
    msgs = store_run(jobs, tokens)
    proc = psutil.Process()
    trips0, events0 = _writes()
    before_t, before_c, t0 = _threads(), sum(proc.cpu_times()[:2]), time.perf_counter()
    with ThreadPoolExecutor(jobs, "celery-like") as pool:
        statuses = list(pool.map(runtime.run_job, msgs))
    wall = time.perf_counter() - t0
    cpu = sum(proc.cpu_times()[:2]) - before_c
    after_t = _threads()
    per_thread = {k: v - before_t.get(k, 0.0) for k, v in after_t.items()}
    busiest = max(per_thread, key=lambda k: per_thread[k])
    trips1, events1 = _writes()
    trips, events = trips1 - trips0, events1 - events0
    done = sum(1 for s in statuses if s is not None and s.value == "succeeded")
    written = done * tokens
    k = 1000 / written if written else float("nan")
    return {"jobs": jobs, "tokens_per_job": tokens, "succeeded": done, "wall_s": round(wall, 3),
            "offered_tok_s": round(jobs / step_s, 1), "written_tok_s": round(written / wall, 1),
            "cpu_s_per_1k_tokens": round(cpu * k, 4),
            "busiest_thread": busiest, "busiest_cpu_s_per_1k_tokens": round(per_thread[busiest] * k, 4),
            "busiest_core_share": round(per_thread[busiest] / wall, 3),
            # how the writer batched: Redis round trips, events per round trip, tokens per event
            "round_trips": int(trips), "events_per_round_trip": round(events / trips, 1) if trips else None,
            "tokens_per_event": round(written / events, 2) if events else None,
            "threads_cpu_s": {n: round(v, 3) for n, v in sorted(per_thread.items(), key=lambda x: -x[1])[:6]}}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench worker", description=__doc__.split("\n\n")[0])
    p.add_argument("--jobs", default="16,64,256", help="jobs in flight per level, comma-separated")
    p.add_argument("--tokens", type=int, default=256, help="tokens per job")
    p.add_argument("--step-ms", type=float, default=10.0, help="the stand-in engine's step time")
    p.add_argument("--repeats", type=int, default=3, help="runs per level (the median is reported)")
    p.add_argument("--service-class", default="interactive", choices=["interactive", "batch"],
                   help="the jobs' class (a batch job's text goes out every INFERQ_BATCH_EVENT_INTERVAL_MS)")
    p.add_argument("--profile", help="py-spy the worker during the last level; collapsed stacks here")
    p.add_argument("--out", help="write the results as JSON here")
    a = p.parse_args(argv)
    from inferq.shared.celery_app import make_celery
    from inferq.shared.settings import Settings
    from inferq.worker.runtime import WorkerRuntime

    logging.basicConfig(level=logging.WARNING)
    levels = [int(x) for x in a.jobs.split(",")]
    with Procs(Path(os.environ.get("TMPDIR", "/tmp"))) as procs:
        redis = procs.add(start_redis(free_port(), procs.logdir, name="redis-worker-bench"))
        settings = Settings(redis_url=redis.url, served_model_name=MODEL, worker_id="bench-worker",
                            max_num_seqs=max(levels))
        engine = PacedEngine(a.step_ms / 1000)
        host = LoopHost(engine, max_model_len=1 << 20, thread_name="engine-loop")
        # LoopHost stands in for EngineHost by duck typing (the engine host's interface, not its class)
        runtime = WorkerRuntime(settings, make_celery(settings), host=host)  # type: ignore[arg-type]
        runtime.send = partial(_no_send)  # a partial, as the runtime's own send (send_job on its Celery app)
        runtime.start()
        host.submit(engine.clock())  # the engine steps on the engine loop, as vLLM's output handler runs
        loop = LoopThread("bench-client")
        loop.start()
        store = JobStore(make_redis(redis.url), settings.job_ttl_s)
        loop.run(_ping(store))
        make = lambda n, t: loop.run(_records(store, n, t, a.service_class))  # noqa: E731
        run_level(runtime, make, 4, 8, a.step_ms / 1000)  # warm-up
        results = []
        for i, jobs in enumerate(levels):
            spy = None
            if a.profile and i == len(levels) - 1 and (exe := py_spy()) is not None:
                spy = subprocess.Popen([exe, "record", "--format", "raw", "--threads", "-r", "200",
                                        "-o", a.profile, "--pid", str(os.getpid()), "--nonblocking"],
                                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                time.sleep(1.0)
            runs = [run_level(runtime, make, jobs, a.tokens, a.step_ms / 1000) for _ in range(a.repeats)]
            if spy is not None:
                spy.send_signal(2)
                spy.wait(30)
            runs.sort(key=lambda r: r["busiest_cpu_s_per_1k_tokens"])
            med = dict(runs[len(runs) // 2])
            med["busiest_cpu_s_per_1k_tokens_min_max"] = [runs[0]["busiest_cpu_s_per_1k_tokens"],
                                                         runs[-1]["busiest_cpu_s_per_1k_tokens"]]
            results.append(med)
            print(f"{jobs:>5} jobs: {med['written_tok_s']:>9.0f} tok/s written (offered {med['offered_tok_s']:.0f}), "
                  f"{med['cpu_s_per_1k_tokens']:.3f} CPU-s/1k tokens in all, busiest thread "
                  f"{med['busiest_thread']!r} {med['busiest_cpu_s_per_1k_tokens']:.3f} CPU-s/1k tokens "
                  f"({med['busiest_core_share']:.0%} of a core); {med['events_per_round_trip']} events per round "
                  f"trip, {med['tokens_per_event']} tokens per event", flush=True)
        runtime.stop()
        loop.stop()
    doc = {"benchmark": "worker-alone", "cpu": cpu_model(), "cpus": os.cpu_count(), "step_ms": a.step_ms,
           "tokens_per_job": a.tokens, "repeats": a.repeats, "python": sys.version.split()[0], "results": results}
    if a.out:
        Path(a.out).write_text(json.dumps(doc, indent=2) + "\n")
    return 0
