"""A real OTLP/HTTP trace receiver: collects what gateways and workers export (protobuf), for the
tracing test. Started once per session, before the stack, whose processes export to it."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)


@dataclass
class SpanSeen:
    service: str
    name: str
    trace_id: str
    span_id: str
    parent_span_id: str
    attributes: dict[str, Any]
    events: list[str] = field(default_factory=list)


class Receiver:
    def __init__(self) -> None:
        self.spans: list[SpanSeen] = []
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                receiver._add(ExportTraceServiceRequest.FromString(body))
                out = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def _add(self, req: ExportTraceServiceRequest) -> None:
        for rs in req.resource_spans:
            service = next((a.value.string_value for a in rs.resource.attributes if a.key == "service.name"), "")
            for ss in rs.scope_spans:
                for s in ss.spans:
                    attrs = {a.key: getattr(a.value, a.value.WhichOneof("value")) for a in s.attributes}
                    with self._lock:
                        self.spans.append(SpanSeen(service, s.name, s.trace_id.hex(), s.span_id.hex(),
                                                   s.parent_span_id.hex(), attrs, [e.name for e in s.events]))

    def of_job(self, job_id: str) -> list[SpanSeen]:
        with self._lock:
            return [s for s in self.spans if s.attributes.get("job_id") == job_id]

    def stop(self) -> None:
        self.server.shutdown()
