"""A TEST OTLP/HTTP receiver: what an OpenTelemetry Collector would receive, decoded.

No Collector can be installed from the package registries these machines reach, so the tests
receive spans here: a real HTTP server on a loopback port that accepts OTLP/HTTP protobuf exports
(POST /v1/traces, gzip or not), decodes them with the official `opentelemetry-proto` package, and
keeps every span. The sidecar's exporter and vLLM's are the real ones, unchanged.
"""

from __future__ import annotations

import contextlib
import gzip
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue

PATH = "/v1/traces"
KINDS = {0: "UNSPECIFIED", 1: "INTERNAL", 2: "SERVER", 3: "CLIENT", 4: "PRODUCER", 5: "CONSUMER"}


@dataclass
class ReceivedSpan:
    service: str
    name: str
    kind: str
    trace_id: str
    span_id: str
    parent_span_id: str
    start_ns: int
    end_ns: int
    attributes: dict[str, Any]
    events: dict[str, int]  # event name -> time (ns)
    status_code: int

    @property
    def duration_ms(self) -> float:
        return (self.end_ns - self.start_ns) / 1e6


@dataclass
class Receiver:
    url: str
    spans: dict[tuple[str, str], ReceivedSpan] = field(default_factory=dict)  # by (trace id, span id)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def keep(self, spans: list[ReceivedSpan]) -> None:
        # By identity: an exporter that gave up waiting for our answer sends the same batch again.
        with self.lock:
            self.spans.update(((s.trace_id, s.span_id), s) for s in spans)

    def trace(self, trace_id: str) -> list[ReceivedSpan]:
        with self.lock:
            return [s for s in self.spans.values() if s.trace_id == trace_id]


def _value(v: AnyValue) -> Any:
    kind = v.WhichOneof("value")
    if kind == "array_value":
        return [_value(x) for x in v.array_value.values]
    return getattr(v, kind) if kind else None


def decode(body: bytes) -> list[ReceivedSpan]:
    request = ExportTraceServiceRequest()
    request.ParseFromString(body)
    out = []
    for resource_spans in request.resource_spans:
        resource = {a.key: _value(a.value) for a in resource_spans.resource.attributes}
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                out.append(
                    ReceivedSpan(
                        service=str(resource.get("service.name", "")),
                        name=span.name,
                        kind=KINDS.get(span.kind, str(span.kind)),
                        trace_id=span.trace_id.hex(),
                        span_id=span.span_id.hex(),
                        parent_span_id=span.parent_span_id.hex(),
                        start_ns=span.start_time_unix_nano,
                        end_ns=span.end_time_unix_nano,
                        attributes={a.key: _value(a.value) for a in span.attributes},
                        events={e.name: e.time_unix_nano for e in span.events},
                        status_code=span.status.code,
                    )
                )
    return out


@contextlib.contextmanager
def otlp_receiver() -> Iterator[Receiver]:
    receiver = Receiver(url="")

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("content-length", "0")))
            if self.headers.get("content-encoding") == "gzip":
                body = gzip.decompress(body)
            if self.path != PATH or self.headers.get("content-type") != "application/x-protobuf":
                self.send_response(404)
                self.end_headers()
                return
            receiver.keep(decode(body))
            answer = ExportTraceServiceResponse().SerializeToString()
            # An exporter whose deadline passed (two loaded cores) has hung up; it will send again.
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                self.send_response(200)
                self.send_header("content-type", "application/x-protobuf")
                self.send_header("content-length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

        def log_message(self, *_: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    receiver.url = f"http://127.0.0.1:{server.server_address[1]}{PATH}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield receiver
    finally:
        server.shutdown()
        server.server_close()
