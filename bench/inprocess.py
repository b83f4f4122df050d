"""The ceiling: vLLM ``AsyncLLM`` in this process, driven by the same load generator as the rest.

Run by the harness as ``python -m bench.inprocess SPEC.json OUT.json`` in its own subprocess, so
the engine's memory is gone before the inferq stack starts. The engine gets the same arguments
as a worker's (``worker.engine.EngineHost.engine_args``) and the same token ids a worker would
compute (``tok.encode(prompt)``), sent as ``TokensPrompt`` with DELTA outputs.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

from bench.config import Level
from bench.load import RequestResult, Timer, drive


def engine_args(spec: dict[str, Any]) -> Any:
    """AsyncEngineArgs exactly as a worker with the same INFERQ_* settings would build them."""
    from inferq.shared.settings import Settings

    settings = Settings(**spec["settings"])
    try:
        from inferq.worker.engine.host import EngineHost

        host = EngineHost(settings)
        host.model_path = spec["model_path"]
        return host.engine_args()
    except (ImportError, AttributeError, TypeError) as e:  # EngineHost changed: mirror its defaults
        print(f"EngineHost.engine_args unavailable ({e}); building AsyncEngineArgs directly", flush=True)
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.platforms import current_platform

        cpu = current_platform.is_cpu()
        return AsyncEngineArgs(
            model=spec["model_path"], served_model_name=[settings.model_name],
            max_model_len=settings.max_model_len, gpu_memory_utilization=settings.gpu_memory_utilization,
            kv_cache_memory_bytes=int(settings.cpu_kv_cache_gib * (1 << 30)) if cpu else None,
            max_num_seqs=settings.max_num_seqs, dtype=settings.dtype, load_format=settings.load_format,
            enforce_eager=cpu if settings.enforce_eager is None else settings.enforce_eager,
        )


async def main_async(spec: dict[str, Any]) -> dict[str, Any]:
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt
    from vllm.sampling_params import RequestOutputKind
    from vllm.v1.engine.async_llm import AsyncLLM

    t0 = time.perf_counter()
    engine = AsyncLLM.from_engine_args(engine_args(spec))
    startup = time.perf_counter() - t0
    print(f"    engine ready in {startup:.1f} s", flush=True)
    expected = int(spec["output_len"])

    async def send(index: int, ids: list[int]) -> RequestResult:
        r = RequestResult(index=index, prompt_tokens=len(ids))
        timer = Timer(r)
        params = SamplingParams(max_tokens=expected, temperature=float(spec["temperature"]),
                                ignore_eos=True, output_kind=RequestOutputKind.DELTA)
        async for out in engine.generate(TokensPrompt(prompt_token_ids=ids), params,
                                         request_id=f"bench-{index}"):
            for c in out.outputs:
                if c.token_ids:
                    timer.chunk(len(c.token_ids))
        timer.done(expected)
        return r

    try:
        plan = [(Level(lv["mode"], lv["value"]), [[tuple(x) for x in reqs] for reqs in lv["repeats"]])
                for lv in spec["plan"]]
        levels = await drive(send, [tuple(x) for x in spec["warmup"]], plan,
                             float(spec["timeout_s"]), int(spec["seed"]))
    finally:
        engine.shutdown()
    return {"startup_s": startup, "levels": {
        k: {**v, "runs": [{**run, "results": [r.to_json() for r in run["results"]]} for run in v["runs"]]}
        for k, v in levels.items()}}


def main(argv: list[str]) -> int:
    spec = json.loads(Path(argv[0]).read_text())
    out = asyncio.run(main_async(spec))
    Path(argv[1]).write_text(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
