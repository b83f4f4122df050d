"""OpenTelemetry: one trace per job across gateway → queue → worker, exported over OTLP/HTTP to a
real receiver (tests/otlp.py); the worker's span is the child of the gateway's through the W3C
trace context in the Celery message."""

from __future__ import annotations

import pytest

from tests.conftest import Stack
from tests.helpers import submit, wait_status
from tests.otlp import Receiver
from tests.wait import eventually

pytestmark = pytest.mark.integration


def test_a_job_is_one_trace_from_gateway_to_worker(stack: Stack, otlp: Receiver) -> None:
    with stack.http() as http:
        job_id = submit(http, prompt="traced", max_tokens=8)
        assert wait_status(http, job_id)["status"] == "succeeded"
    # both processes export in batches, every half second
    got = eventually(lambda: otlp.of_job(job_id), 30, f"the gateway's and the worker's spans of {job_id}",
                     until=lambda spans: len(spans) >= 2, interval=0.2)
    spans = {s.name: s for s in got}
    submit_span, job_span = spans["inferq.submit"], spans["inferq.job"]
    assert submit_span.service == "inferq-gateway" and job_span.service == "inferq-worker"
    assert job_span.trace_id == submit_span.trace_id
    assert job_span.parent_span_id == submit_span.span_id
    assert job_span.attributes["inferq.status"] == "succeeded" and job_span.attributes["inferq.attempt"] == 1
    assert job_span.events[:2] == ["claimed", "first_token"]
