"""Fuzz every operation of the gateway's OpenAPI schema with schemathesis: whatever arrives, the
gateway answers without a 5xx, and the workers behind it live on."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error

from tests.helpers import submit, wait_status

pytestmark = pytest.mark.integration
EXAMPLES_PER_OPERATION = 10


def _keep_jobs_small(body: Any) -> None:
    """Valid generated jobs really run on the CPU workers: cap their size so the fuzzing stays
    quick. Only values that would be accepted are lowered; out-of-range ones are left to be refused."""
    if not isinstance(body, dict):
        return
    for field in ("max_tokens", "max_completion_tokens"):
        if type(body.get(field)) is int and 4 < body[field] <= 32_768:
            body[field] = 4
    if type(body.get("n")) is int and 2 < body["n"] <= 8:
        body["n"] = 2
    if isinstance(body.get("prompt"), list) and 4 < len(body["prompt"]) <= 64:
        body["prompt"] = body["prompt"][:4]


def _fuzz(operation: Any, mode: GenerationMode, base: str, seen: Counter[tuple[str, int]]) -> str | None:
    """Run the operation's generated cases; the first failure, described, or None."""

    @given(case=operation.as_strategy(generation_mode=mode))
    @settings(max_examples=EXAMPLES_PER_OPERATION, deadline=None, database=None,
              phases=[Phase.explicit, Phase.generate], suppress_health_check=list(HealthCheck))
    def run(case: Any) -> None:
        _keep_jobs_small(case.body)
        response = case.call_and_validate(base_url=base, checks=[not_a_server_error], timeout=60)
        seen[operation.label, response.status_code] += 1

    try:
        run()
    except Unsatisfiable:  # nothing in the schema can be broken (e.g. no parameters): no negative cases
        return None
    except Exception as e:  # a failed check, with the request that caused it
        return f"{operation.label} ({mode.value}): {e}"
    return None


def test_no_operation_answers_5xx(stack: Any) -> None:
    """Every operation in /openapi.json, with data that fits the schema and data that does not."""
    schema = schemathesis.openapi.from_url(f"{stack.base}/openapi.json")
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) >= 10, [op.label for op in operations]
    seen: Counter[tuple[str, int]] = Counter()
    failures = [f for op in operations for mode in GenerationMode if (f := _fuzz(op, mode, stack.base, seen))]
    print(f"{seen.total()} fuzzed requests:",
          *(f"{n:4} x {st} {label}" for (label, st), n in sorted(seen.items())), sep="\n")
    assert not failures, "\n\n".join(failures)
    assert seen.total() >= 10 * EXAMPLES_PER_OPERATION
    assert {op.label for op in operations} == {label for label, _ in seen}  # each one was called


def test_workers_survive_the_fuzzing(stack: Any) -> None:
    assert all(w.proc.poll() is None for w in stack.workers.values())
    with stack.http() as http:
        assert http.get("/readyz").json()["workers"] == 2
        view = wait_status(http, submit(http, prompt="still serving", max_tokens=4))
    assert view["status"] == "succeeded", view
