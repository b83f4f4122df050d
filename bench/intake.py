"""Intake: how fast one worker process takes a wave of jobs off its queue, through Celery.

A closed loop of N clients on N engine slots runs in waves (docs/benchmarks.md, "Levels"): N jobs
arrive at once, and the worker's one Celery consumer thread takes them in one by one while its
job threads and its engine loop share the same GIL. This measures that intake on any machine: a
real ``inferq worker`` process (Celery's consumer and threads pool, kombu, the job runner, the
event writer, heartbeat and reaper) whose engine is the paced stand-in of the worker-alone bench
(one token per running job every ``--step-ms``: no EngineCore competing for the CPU), with the
built-in model's real tokenizer. Each wave's jobs are written the way the gateway writes them
(record and Celery message in one script), all at once; per wave it reports queued (created to
the worker's claim) p50, p90 and max, and claim to first token p50. The first wave is a warm-up.
With ``--ids`` each message carries the prompt's token ids, as a gateway that reads the model's
tokenizer sends them (api/prompt_ids.py): the worker then does not tokenize.

``python -m bench intake [--jobs 256] [--waves 6] [--tokens 64] [--step-ms 10] [--chat] [--ids]
[--env INFERQ_GIL_SWITCH_INTERVAL_MS=5] [--out F]``
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from bench.stack import ROOT, Procs, base_env, free_port, start_redis
from bench.sysinfo import cpu_model

MODEL = "bench-intake"


def serve() -> None:
    """The worker process: ``inferq worker`` with the paced stand-in engine and the real tokenizer."""
    from transformers import AutoTokenizer

    from bench.standin import LoopHost
    from bench.worker import PacedEngine
    from inferq.shared.settings import get_settings
    from inferq.worker import tasks
    from inferq.worker.engine.models import resolve_model
    from inferq.worker.main import consume

    s = get_settings()
    tokenizer = AutoTokenizer.from_pretrained(str(resolve_model(s)))

    class Host(LoopHost):
        def start(self) -> None:
            super().start()
            self.submit(self.engine.clock())  # the engine steps on the engine loop, as vLLM's output handler runs

    def host(*_settings_and_frontend: Any) -> Host:
        h = Host(PacedEngine(float(os.environ["BENCH_STEP_S"])), max_model_len=1 << 20, thread_name="engine-loop")
        h.tokenizer = tokenizer
        return h

    vars(tasks)["EngineHost"] = host  # tasks makes its runtime's engine host by this name: the stand-in instead
    consume(s, s.max_num_seqs, s.reserve, "WARNING")


def start_standin_worker(procs: Procs, name: str, redis_url: str, slots: int, step_ms: float, **extra: str) -> None:
    """An ``inferq worker`` process (:func:`serve`) with ``slots`` job slots on the paced stand-in
    engine, serving :data:`MODEL` (``extra``: more of its environment)."""
    env = base_env(INFERQ_REDIS_URL=redis_url, INFERQ_SERVED_MODEL_NAME=MODEL, INFERQ_MAX_NUM_SEQS=str(slots),
                   INFERQ_LOG_LEVEL="WARNING", INFERQ_METRICS_PORT="0", BENCH_STEP_S=str(step_ms / 1000),
                   PYTHONPATH=str(ROOT), **extra)
    procs.start(name, [sys.executable, "-m", "bench", "intake", "--serve"], env, cwd=ROOT)


async def _waves(url: str, a: argparse.Namespace) -> list[dict[str, Any]]:
    from inferq.api.prompt_ids import gateway_tokenizer
    from inferq.shared import keys
    from inferq.shared.celery_app import job_message, make_celery
    from inferq.shared.redis import make_redis
    from inferq.shared.schemas import TERMINAL_STATUSES, ChatMessage, JobRecord, JobRequest
    from inferq.shared.settings import Settings
    from inferq.shared.store import JobStore
    from inferq.worker.engine.models import resolve_model

    s = Settings(redis_url=url, served_model_name=MODEL)
    tok = gateway_tokenizer(resolve_model(s)) if a.ids else None
    redis = make_redis(url)
    store, app = JobStore(redis, 3600), make_celery(s)
    deadline = time.monotonic() + 300
    while not await redis.zcard(keys.workers(MODEL)):
        if time.monotonic() > deadline:
            raise RuntimeError("the worker did not register")
        await asyncio.sleep(0.2)
    out = []
    text = "the quick brown fox jumps over the lazy dog " * 6
    for wave in range(a.waves + 1):
        recs = []
        for i in range(a.jobs):
            prompt = f"wave {wave} job {i} {text}"
            req = (JobRequest(messages=[ChatMessage(role="user", content=prompt)], max_tokens=a.tokens, ignore_eos=True)
                   if a.chat else JobRequest(prompt=prompt, max_tokens=a.tokens, ignore_eos=True))
            recs.append(JobRecord(id=f"job-{uuid.uuid4().hex}", model=MODEL, request=req))
        t0 = time.time()
        for rec in recs:
            rec.created_at = t0
        messages = [job_message(app, rec.message(tok.encode(rec.request) if tok else None)) for rec in recs]
        await asyncio.gather(*(store.submit(rec, q, m, 1 << 30) for rec, (q, m) in zip(recs, messages, strict=True)))
        while True:
            await asyncio.sleep(0.25)
            async with redis.pipeline(transaction=False) as p:
                for rec in recs:
                    p.hget(keys.job(rec.id), "status")
                states = await p.execute()
            if all(x is not None and json.loads(x) in TERMINAL_STATUSES for x in states):
                break
        got = [await store.get(rec.id) for rec in recs]
        queued = sorted(g.started_at - t0 for g in got if g is not None and g.started_at)
        first = sorted(g.first_token_at - g.started_at for g in got if g and g.first_token_at and g.started_at)
        if wave == 0:
            continue  # warm-up
        row = {"wave": wave, "jobs": a.jobs, "succeeded": sum(1 for g in got if g and g.status.value == "succeeded"),
               "queued_p50_ms": round(1e3 * queued[len(queued) // 2], 1),
               "queued_p90_ms": round(1e3 * queued[int(len(queued) * 0.9)], 1),
               "queued_max_ms": round(1e3 * queued[-1], 1),
               "claim_to_first_p50_ms": round(1e3 * first[len(first) // 2], 1) if first else None}
        out.append(row)
        print(f"wave {wave}: queued p50 {row['queued_p50_ms']:.0f} p90 {row['queued_p90_ms']:.0f} max "
              f"{row['queued_max_ms']:.0f} ms; claim to first token p50 {row['claim_to_first_p50_ms']} ms", flush=True)
    await redis.aclose()
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench intake", description=__doc__.split("\n\n")[0])
    p.add_argument("--jobs", type=int, default=256, help="jobs per wave (= the worker's slots)")
    p.add_argument("--waves", type=int, default=6, help="waves measured (after one warm-up wave)")
    p.add_argument("--tokens", type=int, default=64, help="tokens per job")
    p.add_argument("--step-ms", type=float, default=10.0, help="the stand-in engine's step time")
    p.add_argument("--chat", action="store_true", help="chat messages (the chat template) instead of a prompt")
    p.add_argument("--ids", action="store_true", help="each message carries the prompt's token ids, as the "
                   "gateway sends them")
    p.add_argument("--env", action="append", default=[], help="NAME=VALUE for the worker (repeatable)")
    p.add_argument("--out", help="write the results as JSON here")
    p.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)  # the worker process itself
    a = p.parse_args(argv)
    if a.serve:
        serve()
        return 0
    extra = dict(kv.split("=", 1) for kv in a.env)
    with Procs(Path(os.environ.get("TMPDIR", "/tmp"))) as procs:
        redis = procs.add(start_redis(free_port(), procs.logdir, name="redis-intake-bench"))
        start_standin_worker(procs, "worker-intake-bench", redis.url, a.jobs, a.step_ms, **extra)
        waves = asyncio.run(_waves(redis.url, a))
    med = {k: statistics.median(w[k] for w in waves) for k in ("queued_p50_ms", "queued_p90_ms", "queued_max_ms")}
    print(f"median of {len(waves)} waves: queued p50 {med['queued_p50_ms']:.0f}, p90 {med['queued_p90_ms']:.0f}, "
          f"max {med['queued_max_ms']:.0f} ms")
    doc = {"benchmark": "worker-intake", "cpu": cpu_model(), "cpus": os.cpu_count(), "jobs": a.jobs,
           "tokens_per_job": a.tokens, "step_ms": a.step_ms, "chat": a.chat, "ids": a.ids, "worker_env": extra,
           "python": sys.version.split()[0], "waves": waves, "median": med}
    if a.out:
        Path(a.out).write_text(json.dumps(doc, indent=2) + "\n")
    return 0
