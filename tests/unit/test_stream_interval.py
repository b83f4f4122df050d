"""``stream_interval``: the setting reaches the engine's arguments (and vllm serve's flags in the
bench), a request's reaches vLLM's ``SamplingParams``, and bad values are refused naming the field.
The stream itself is checked on the real engine (tests/integration/test_openai.py)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from inferq.api.openai.params import ChatCompletionRequest
from inferq.shared.schemas import JobRequest
from inferq.shared.settings import Settings

pytest.importorskip("vllm")


def engine_args(**settings: object) -> object:
    from inferq.worker.engine.args import engine_args_for

    return engine_args_for(Settings(**settings), "/nonexistent/model")


def test_the_setting_is_the_engines_stream_interval_but_not_for_pooling() -> None:
    assert engine_args(stream_interval=4).stream_interval == 4  # type: ignore[attr-defined]
    assert engine_args().stream_interval == 1  # type: ignore[attr-defined]
    # vLLM's pooling outputs have no detokenizer, which an interval above 1 asserts on
    assert engine_args(stream_interval=4, runner="pooling").stream_interval == 1  # type: ignore[attr-defined]


def test_vllm_serve_gets_the_same_flag_only_when_set() -> None:
    from bench.vllm_serve import flags

    cut = flags(engine_args(stream_interval=4))
    assert cut[cut.index("--stream-interval") + 1] == "4"
    assert "--stream-interval" not in flags(engine_args())  # older vLLMs have no such flag


def test_a_requests_interval_reaches_sampling_params() -> None:
    from inferq.worker.jobs.sampling import sampling_params

    assert sampling_params(JobRequest(prompt="x", stream_interval=3), 1, 64, 8).stream_interval == 3
    assert sampling_params(JobRequest(prompt="x"), 1, 64, 8).stream_interval is None
    chat = ChatCompletionRequest(messages=[{"role": "user", "content": "x"}], stream=True, stream_interval=5)
    assert chat.sampling_fields()["stream_interval"] == 5


@pytest.mark.parametrize("value", [0, 1025, "many"])
def test_a_bad_interval_names_the_field(value: object) -> None:
    with pytest.raises(ValidationError) as e:
        JobRequest(prompt="x", stream_interval=value)
    assert e.value.errors()[0]["loc"] == ("stream_interval",)
