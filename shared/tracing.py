"""Optional OpenTelemetry tracing of a job across gateway → queue → worker; off unless
``INFERQ_OTEL_ENDPOINT`` names an OTLP/HTTP collector (e.g. ``http://otel-collector:4318``).

The gateway's ``inferq.submit`` span puts its W3C ``traceparent`` in the Celery message's headers
(and in the job record, so that a job re-sent after a worker is lost keeps its trace); the
worker's ``inferq.job`` span, one per attempt, is its child, with events for the claim, the first
token and the end. With tracing off nothing is imported and :func:`span` costs one branch.
"""

from __future__ import annotations

import atexit
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from inferq.shared.settings import Settings

_tracer: Any = None


def setup(settings: Settings, service: str) -> bool:
    """Start exporting this process's spans as ``service`` (once); False when tracing is off."""
    global _tracer
    if not settings.otel_endpoint or _tracer is not None:
        return _tracer is not None
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    provider = TracerProvider(resource=Resource.create({"service.name": service}))
    exporter = OTLPSpanExporter(endpoint=settings.otel_endpoint.rstrip("/") + "/v1/traces")
    provider.add_span_processor(BatchSpanProcessor(exporter, schedule_delay_millis=500))
    atexit.register(provider.shutdown)  # what is still batched goes out at exit
    _tracer = provider.get_tracer("inferq")
    return True


class Span:
    """A started span (or nothing, with tracing off): attributes and events by name."""

    def __init__(self, span: Any = None, traceparent: str | None = None) -> None:
        self._span, self.traceparent = span, traceparent

    def set(self, key: str, value: str | int | float | bool) -> None:
        if self._span is not None:
            self._span.set_attribute(key, value)

    def event(self, name: str, **attributes: str | int | float) -> None:
        if self._span is not None:
            self._span.add_event(name, attributes)


@contextmanager
def span(name: str, parent: str | None = None, **attributes: str | int | float) -> Iterator[Span]:
    """A span, child of the ``parent`` traceparent if given (else of the current span)."""
    if _tracer is None:
        yield Span()
        return
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    propagator = TraceContextTextMapPropagator()
    context = propagator.extract({"traceparent": parent}) if parent else None
    with _tracer.start_as_current_span(name, context=context, attributes=attributes) as s:
        carrier: dict[str, str] = {}
        propagator.inject(carrier)
        yield Span(s, carrier.get("traceparent"))
