"""OpenTelemetry tracing of relayed requests: one trace per request, across sidecar and engine.

On only when PALMYRA_OTLP_TRACES_ENDPOINT is set; the relay then holds a Tracing and gives each
request a RequestTrace. Off, this module is never imported and the relay pays one `is None` test
per request (benchmarks/results/relay-tracing.md).

Each request gets three spans, with the OpenTelemetry semantic conventions for HTTP and GenAI
where they apply (docs/tracing.md lists every attribute):

- the request (SERVER, `POST /v1/completions`), from its head to its answer's end: what the
  client got, its status, tokens, request id and tenant. It continues the client's W3C
  `traceparent` when one came, else it starts a trace; either way at most
  PALMYRA_TRACE_SAMPLE_RATIO of requests are sampled: a client's "not sampled" is kept, its
  "sampled" is only a candidate, drawn at the ratio by a random number of the sidecar's (not by the
  trace id, which the client chose, so no id it picks is always sampled);
- `admission` (INTERNAL), the quota check and the wait for a slot: its verdict and queue wait;
- the engine request (CLIENT, `POST`), from sending to the engine's last byte, with an event for a
  new connection's `connect` and for the `first_token`. Its id goes to the engine in the
  `traceparent` the relay sends (replacing the client's), so vLLM's own `llm_request` span, exported
  to the same endpoint, is its child.

The spans are made with the SDK's tracer and exported by its BatchSpanProcessor (a bounded queue,
a background thread, spans dropped rather than memory grown when the collector is away) through
the OTLP/HTTP protobuf exporter. The relay measures time with perf_counter; spans are stamped
in wall-clock nanoseconds from one anchor per request.
"""

from __future__ import annotations

import os
import random
import threading
import time
from urllib.parse import urlsplit

from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.sdk.trace.sampling import (
    ALWAYS_OFF,
    Decision,
    ParentBased,
    Sampler,
    SamplingResult,
    TraceIdRatioBased,
)
from opentelemetry.trace import SpanKind, Status, StatusCode, get_current_span
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from palmyra_serve import SIDECAR_SERVICE_NAME, __version__
from palmyra_serve.settings import Settings
from palmyra_serve.sidecar.core.record import RequestRecord
from palmyra_serve.sidecar.core.routes import RELAYED

# How long a stop waits for the last spans to leave, after the drain: a collector that is away
# would otherwise hold the exit for the exporter's retries.
SHUTDOWN_FLUSH_S = 2.0
# The OTLP exporter's deadline per batch: a collector that hangs delays only the export thread.
EXPORT_TIMEOUT_S = 10.0
# GenAI semantic conventions: gen_ai.operation.name of each generation route.
OPERATION = {"completions": "text_completion", "chat_completions": "chat", "responses": "chat", "messages": "chat"}
ADMITTED = "admitted"

_propagator = TraceContextTextMapPropagator()


class Tracing:
    """The sidecar's tracer provider and exporter, made once at start."""

    def __init__(self, settings: Settings) -> None:
        assert settings.otlp_traces_endpoint, "made only when an endpoint is configured"
        # OTEL_RESOURCE_ATTRIBUTES adds to these; OTEL_SERVICE_NAME, when set, names the service.
        attributes = {"service.version": __version__}
        if not os.environ.get("OTEL_SERVICE_NAME"):
            attributes["service.name"] = SIDECAR_SERVICE_NAME
        self.provider = TracerProvider(
            resource=Resource.create(attributes),
            sampler=operator_sampler(settings.trace_sample_ratio),
            shutdown_on_exit=False,  # shutdown() below, bounded; the SDK's own atexit hook is not
        )
        self.processor = BatchSpanProcessor(
            OTLPSpanExporter(endpoint=settings.otlp_traces_endpoint, timeout=EXPORT_TIMEOUT_S)
        )
        self.provider.add_span_processor(self.processor)
        self.tracer = self.provider.get_tracer("palmyra_serve.sidecar", __version__)
        engine = urlsplit(settings.engine_url)
        self.engine_host = engine.hostname or ""
        self.engine_port = engine.port or (443 if engine.scheme == "https" else 80)
        self.engine_url = settings.engine_url.rstrip("/")
        self.model = settings.served_model_name

    def start(self, scope: dict, record: RequestRecord, t0: float) -> RequestTrace:
        """The request's span, started at its head (t0, perf_counter), as a child of the client's
        traceparent when it sent a valid one."""
        carrier: dict[str, str] = {}
        for name, value in scope["headers"]:
            if name == b"traceparent" or name == b"tracestate":
                carrier[name.decode()] = value.decode("latin-1")
        parent = _propagator.extract(carrier) if carrier else None
        anchor_ns = time.time_ns() - int((time.perf_counter() - t0) * 1e9)
        entry = RELAYED.get(scope["path"])
        route = entry.target.decode() if entry is not None else None
        attributes: dict[str, str | int] = {
            "http.request.method": scope["method"],
            "url.path": scope["path"],
            "url.scheme": scope.get("scheme", "http"),
            "palmyra.request_id": record.request_id,
        }
        if route is not None:
            attributes["http.route"] = route
        client = scope.get("client")
        if client:
            attributes["client.address"] = client[0]
        span = self.tracer.start_span(
            f"{scope['method']} {route}" if route is not None else scope["method"],
            context=parent,
            kind=SpanKind.SERVER,
            attributes=attributes,
            start_time=anchor_ns,
        )
        return RequestTrace(self, span, t0, anchor_ns)

    def shutdown(self) -> None:
        """Export what is queued and stop, waiting at most SHUTDOWN_FLUSH_S: the exporter's retries
        toward an absent collector do not end when asked to, so the shutdown runs in a daemon
        thread (as the export thread is one) that the process's exit does not wait for."""
        stopping = threading.Thread(target=self.provider.shutdown, name="otel-shutdown", daemon=True)
        stopping.start()
        stopping.join(SHUTDOWN_FLUSH_S)


class RequestTrace:
    """One request's spans while it runs."""

    __slots__ = ("anchor_ns", "engine", "root", "t0", "tracing")

    def __init__(self, tracing: Tracing, root: trace.Span, t0: float, anchor_ns: int) -> None:
        self.tracing = tracing
        self.root = root
        self.t0 = t0
        self.anchor_ns = anchor_ns
        self.engine: trace.Span | None = None

    @property
    def trace_id(self) -> str | None:
        """The id the access log carries: only for a trace that is recorded."""
        context = self.root.get_span_context()
        return f"{context.trace_id:032x}" if context.trace_flags.sampled else None

    def _ns(self, at: float) -> int:
        return self.anchor_ns + int((at - self.t0) * 1e9)

    def engine_traceparent(self, method: str, target: bytes, sent_at: float) -> bytes:
        """Start the engine request's span; the traceparent that makes the engine's spans its children."""
        tracing = self.tracing
        self.engine = span = tracing.tracer.start_span(
            method,  # HTTP client spans are named by their method alone
            context=trace.set_span_in_context(self.root),
            kind=SpanKind.CLIENT,
            attributes={
                "http.request.method": method,
                "server.address": tracing.engine_host,
                "server.port": tracing.engine_port,
                "url.full": tracing.engine_url + target.decode("latin-1"),
            },
            start_time=self._ns(sent_at),
        )
        context = span.get_span_context()
        return b"00-%032x-%016x-%02x" % (context.trace_id, context.span_id, context.trace_flags)

    def finish(self, record: RequestRecord, end: float) -> None:
        """End every span from what the record measured, at `end` (perf_counter)."""
        end_ns = self._ns(end)
        root = self.root
        if not root.is_recording():
            return
        parent = trace.set_span_in_context(root)
        if record.admit_at:
            admitted = record.sent_at or end
            verdict = ADMITTED if record.sent_at else (record.error or "cancelled")
            self.tracing.tracer.start_span(
                "admission",
                context=parent,
                attributes={
                    "palmyra.admission.verdict": verdict,
                    "palmyra.admission.queue_wait_s": record.queue_wait_s,
                },
                start_time=self._ns(record.admit_at),
            ).end(self._ns(admitted))
        engine = self.engine
        if engine is not None:
            if record.connected_at:
                engine.add_event("connect", timestamp=self._ns(record.connected_at))
            if record.ttft_s is not None:
                engine.add_event("first_token", timestamp=self._ns(self.t0 + record.ttft_s))
            failed: dict[str, str | int] = {}
            if record.engine_status:
                failed["http.response.status_code"] = record.engine_status
                if record.engine_status >= 500:
                    failed["error.type"] = str(record.engine_status)
            if record.upstream_error is not None:
                failed["error.type"] = record.upstream_error
            engine.set_attributes(failed)
            if "error.type" in failed:
                engine.set_status(Status(StatusCode.ERROR, record.upstream_detail))
            engine.end(self._ns(record.engine_done_at or end))
        # One call with every attribute: each set_attribute takes the span's lock.
        status = record.status
        attributes: dict[str, str | int | bool] = {"http.response.status_code": status}
        if status >= 500:
            attributes["error.type"] = str(status)
            root.set_status(Status(StatusCode.ERROR))
        operation = OPERATION.get(record.route)
        if operation is not None:
            attributes["gen_ai.operation.name"] = operation
            attributes["gen_ai.request.model"] = record.model or self.tracing.model
            if record.prompt_tokens is not None:
                attributes["gen_ai.usage.input_tokens"] = record.prompt_tokens
            if record.completion_tokens is not None:
                attributes["gen_ai.usage.output_tokens"] = record.completion_tokens
        if record.tenant is not None:
            attributes["palmyra.tenant"] = record.tenant
        if record.error is not None:
            attributes["palmyra.error"] = record.error
        if record.truncated:
            attributes["palmyra.truncated"] = True
        if record.client_disconnected:
            attributes["palmyra.client_disconnected"] = True
        root.set_attributes(attributes)
        root.end(end_ns)


class _DrawnRatio(Sampler):
    """Samples at `ratio` by a random draw, whatever the trace id: for traces a client started."""

    def __init__(self, ratio: float) -> None:
        self.ratio = ratio

    def should_sample(  # type: ignore[no-untyped-def]
        self, parent_context, trace_id, name, kind=None, attributes=None, links=None, trace_state=None
    ) -> SamplingResult:
        keep = random.random() < self.ratio
        parent_state = get_current_span(parent_context).get_span_context().trace_state
        return SamplingResult(
            Decision.RECORD_AND_SAMPLE if keep else Decision.DROP, attributes if keep else None, parent_state
        )

    def get_description(self) -> str:
        return f"DrawnRatio{{{self.ratio}}}"


def operator_sampler(ratio: float) -> Sampler:
    """The operator's ratio is the ceiling: a trace the sidecar starts is sampled by its (random)
    id, a client's sampled trace by a draw at the same ratio, a client's unsampled one never."""
    return ParentBased(
        TraceIdRatioBased(ratio), remote_parent_sampled=_DrawnRatio(ratio), remote_parent_not_sampled=ALWAYS_OFF
    )
