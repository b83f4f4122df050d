"""The benchmark's stand-in EngineCore (bench/standin_core.py): what vLLM's output processor reads
from it is what an engine would send."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from vllm.v1.engine import FinishReason

from bench.standin_core import StandinCoreClient, standin_env


def _request(rid: str, max_tokens: int) -> SimpleNamespace:
    return SimpleNamespace(request_id=rid, sampling_params=SimpleNamespace(max_tokens=max_tokens))


def test_every_running_request_gets_a_token_a_step_until_its_max_tokens() -> None:
    async def main() -> list[dict[str, tuple[int, FinishReason | None]]]:
        core = StandinCoreClient(None)
        await core.add_request_async(_request("a", 3))
        await core.add_request_async(_request("b", 1))
        steps = []
        for _ in range(3):
            out = await core.get_output_async()
            steps.append({o.request_id: (len(o.new_token_ids), o.finish_reason) for o in out.outputs})
        assert not core.running
        return steps

    steps = asyncio.run(main())
    assert steps == [{"a": (1, None), "b": (1, FinishReason.LENGTH)}, {"a": (1, None)},
                     {"a": (1, FinishReason.LENGTH)}]


def test_an_aborted_request_gets_no_more_tokens_and_an_idle_core_waits() -> None:
    async def main() -> None:
        core = StandinCoreClient(None)
        await core.add_request_async(_request("a", 5))
        await core.abort_requests_async(["a"])
        waiting = asyncio.ensure_future(core.get_output_async())
        await asyncio.sleep(0.05)
        assert not waiting.done()  # nothing runs: no output, no spinning
        await core.add_request_async(_request("b", 1))
        out = await asyncio.wait_for(waiting, 5)
        assert [o.request_id for o in out.outputs] == ["b"]
        assert await core.is_sleeping_async() is False  # any other utility answers at once

    asyncio.run(main())


def test_the_environment_puts_the_hook_first_and_keeps_the_path() -> None:
    env = standin_env(2.5, {"PYTHONPATH": "/x"})
    assert env["BENCH_STANDIN_CORE"] == "2.5"
    parts = env["PYTHONPATH"].split(":")
    assert parts[0].endswith("bench/standin_core_site") and parts[-1] == "/x"
