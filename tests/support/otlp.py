"""An OTLP/HTTP trace receiver in the test process: services export their spans to it as to
any collector (protobuf on ``/v1/traces``), and tests read them back."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)


@dataclass(frozen=True)
class Span:
    service: str
    name: str
    trace_id: str
    span_id: str
    parent_id: str
    start_ns: int
    end_ns: int
    attributes: dict[str, Any] = field(default_factory=dict)


class OtlpReceiver:
    """Owns the HTTP server and every span received. Invariant: ``spans`` only grows."""

    def __init__(self) -> None:
        self.spans: list[Span] = []
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                receiver.add(ExportTraceServiceRequest.FromString(body))
                reply = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.server.server_port}"

    def env(self) -> dict[str, str]:
        """What a service needs to export here, promptly."""
        return {"OTEL_EXPORTER_OTLP_ENDPOINT": self.endpoint, "OTEL_BSP_SCHEDULE_DELAY": "200"}

    def start(self) -> OtlpReceiver:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()

    def add(self, export: ExportTraceServiceRequest) -> None:
        received = []
        for resource in export.resource_spans:
            attrs = {a.key: a.value.string_value for a in resource.resource.attributes}
            service = attrs.get("service.name", "")
            for scope in resource.scope_spans:
                for s in scope.spans:
                    received.append(
                        Span(
                            service, s.name, s.trace_id.hex(), s.span_id.hex(),
                            s.parent_span_id.hex(), s.start_time_unix_nano, s.end_time_unix_nano,
                            {a.key: _value(a.value) for a in s.attributes},
                        )
                    )  # fmt: skip
        with self.lock:
            self.spans.extend(received)

    def trace(self, trace_id: str) -> list[Span]:
        with self.lock:
            return [s for s in self.spans if s.trace_id == trace_id]


def _value(value: Any) -> Any:
    kind = value.WhichOneof("value")
    return getattr(value, kind) if kind else None
