"""Wire schemas, key layout and settings: pure functions."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from inferq.api.frames import frame
from inferq.shared import keys
from inferq.shared.schemas import (
    TERMINAL_STATUSES,
    DoneEvent,
    ErrorEvent,
    ErrorInfo,
    JobRecord,
    JobRequest,
    JobStatus,
    TokenEvent,
    Usage,
    parse_event,
)
from inferq.shared.settings import TINY_MODEL_NAME, Settings


def test_stop_string_becomes_a_list_and_defaults_hold() -> None:
    r = JobRequest(prompt="hi", stop="END")
    assert r.stop == ["END"] and r.n == 1 and r.max_tokens is None and r.temperature == 1.0


@pytest.mark.parametrize(("body", "field"), [
    ({"prompt": "x", "max_tokens": 0}, "max_tokens"),
    ({"prompt": "x", "n": 0}, "n"),
    ({"prompt": "x", "stop": ["a", ""]}, "stop"),
    ({"prompt": ""}, "prompt"),
    ({"prompt": "x", "top_p": 1.5}, "top_p"),
    ({"prompt": "x", "logprobs": 50}, "logprobs"),
    ({"prompt": "x", "surprise": True}, "surprise"),
])
def test_bounds_name_the_field(body: dict, field: str) -> None:
    with pytest.raises(ValidationError) as e:
        JobRequest.model_validate(body)
    assert e.value.errors()[0]["loc"][0] == field


def test_configured_limits_are_not_the_schemas_business() -> None:
    """INFERQ_MAX_* are checked against the admitting app's settings (tests/unit/test_request_limits.py)."""
    r = JobRequest(prompt="x" * 1_000_000, max_tokens=10**9, n=10**3, stop=["z" * 10_000] * 100, timeout=1e9)
    assert r.n == 10**3


def test_exactly_one_input_and_greedy_n() -> None:
    for body in ({}, {"prompt": "a", "messages": [{"role": "user", "content": "b"}]},
                 {"prompt": "a", "n": 2, "temperature": 0}):
        with pytest.raises(ValidationError):
            JobRequest.model_validate(body)


def test_record_round_trips_through_a_redis_hash() -> None:
    rec = JobRecord(id="job-1", model="m", request=JobRequest(messages=[{"role": "user", "content": "hi"}]),
                    usage=Usage(prompt_tokens=3, completion_tokens=4, total_tokens=7),
                    error=ErrorInfo(type="t", message="m"), status=JobStatus.failed)
    h = rec.to_hash()
    assert all(isinstance(v, str) for v in h.values())
    assert "started_at" not in h  # None fields are not stored
    assert JobRecord.from_hash(h) == rec


def test_event_union_parses_each_kind() -> None:
    events = [TokenEvent(seq=1, text="a", n_tokens=1), DoneEvent(seq=2, finish_reason="stop"),
              ErrorEvent(seq=3, error=ErrorInfo(type="x", message="y"))]
    parsed = [parse_event(e.model_dump_json()) for e in events]
    assert parsed == events
    assert [frame(e.model_dump_json(exclude_none=True)).terminal for e in events] == [False, True, True]
    with pytest.raises(ValidationError):
        parse_event('{"type": "bogus", "seq": 1}')


def test_status_terminality() -> None:
    assert {s for s in JobStatus if s.terminal} == {JobStatus.succeeded, JobStatus.failed, JobStatus.cancelled}
    assert {"succeeded", "failed", "cancelled"} == TERMINAL_STATUSES


def test_key_layout() -> None:
    assert keys.job("abc") == "inferq:job:abc"
    assert keys.job_log("abc") == "inferq:job:abc:log"
    assert keys.job_channel("abc") == "inferq:job:abc:chan"
    assert keys.queue("mistralai/Mistral-7B") == "inferq.q.mistralai/Mistral-7B"


def test_model_name_resolution(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("INFERQ_MODEL", raising=False)
    monkeypatch.delenv("INFERQ_SERVED_MODEL_NAME", raising=False)
    assert Settings().model_name == TINY_MODEL_NAME
    monkeypatch.setenv("INFERQ_MODEL", "org/model")
    assert Settings().model_name == "org/model"
    monkeypatch.setenv("INFERQ_SERVED_MODEL_NAME", "alias")
    assert Settings().model_name == "alias"
