"""The spans a request's record turns into (sidecar/observability/tracing.py), read from the SDK's
in-memory exporter beside the real OTLP one: the verdict of a refused request, a 5xx marked as an
error, sampling at the configured ratio, and a client's unsampled traceparent kept."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from palmyra_serve.settings import Settings
from palmyra_serve.sidecar.core.record import RequestRecord
from palmyra_serve.sidecar.observability.tracing import Tracing
from tests.helpers.otlp_receiver import otlp_receiver


@pytest.fixture
def url() -> Iterator[str]:
    """Where the real exporter sends (the test receiver, so that a stop never waits on retries);
    what is asserted is read from the in-memory exporter beside it."""
    with otlp_receiver() as receiver:
        yield receiver.url


@pytest.fixture
def traced(url: str) -> Iterator[tuple[Tracing, InMemorySpanExporter]]:
    tracing = Tracing(Settings(otlp_traces_endpoint=url))
    memory = InMemorySpanExporter()
    tracing.provider.add_span_processor(SimpleSpanProcessor(memory))
    yield tracing, memory
    tracing.shutdown()


def scope(traceparent: str | None = None, path: str = "/v1/chat/completions") -> dict:
    headers = [(b"traceparent", traceparent.encode())] if traceparent else []
    return {"method": "POST", "path": path, "headers": headers, "client": ("10.0.0.7", 5555)}


def test_a_request_refused_in_the_queue_has_an_admission_span_with_its_verdict_and_no_engine_span(traced):
    tracing, memory = traced
    t0 = time.perf_counter()
    record = RequestRecord("r1", "POST", "/v1/chat/completions", "chat_completions", tenant="search")
    rt = tracing.start(scope(), record, t0)
    record.admit_at = t0 + 0.001
    record.status, record.error, record.queue_wait_s = 429, "queue_timeout", 0.5
    rt.finish(record, t0 + 0.6)
    spans = {s.name: s for s in memory.get_finished_spans()}
    assert set(spans) == {"POST /v1/chat/completions", "admission"}
    root, admission = spans["POST /v1/chat/completions"], spans["admission"]
    assert admission.attributes["palmyra.admission.verdict"] == "queue_timeout"
    assert admission.attributes["palmyra.admission.queue_wait_s"] == 0.5
    assert root.attributes["http.response.status_code"] == 429
    assert root.attributes["gen_ai.operation.name"] == "chat"
    assert root.attributes["palmyra.tenant"] == "search" and root.attributes["palmyra.error"] == "queue_timeout"
    assert root.attributes["client.address"] == "10.0.0.7"
    assert root.status.status_code == StatusCode.UNSET  # a 4xx is the client's, not the server's error
    assert round((root.end_time - root.start_time) / 1e6) == 600


def test_an_engine_failure_marks_both_spans_as_errors(traced):
    tracing, memory = traced
    t0 = time.perf_counter()
    record = RequestRecord("r2", "POST", "/v1/completions", "completions")
    rt = tracing.start(scope(path="/v1/completions"), record, t0)
    record.admit_at = record.sent_at = t0 + 0.001
    header = rt.engine_traceparent("POST", b"/v1/completions", record.sent_at)
    record.status, record.upstream_error, record.upstream_detail = 503, "engine_unavailable", "refused"
    rt.finish(record, t0 + 0.01)
    spans = {s.name: s for s in memory.get_finished_spans()}
    engine = spans["POST"]
    context = engine.context
    assert header.decode() == f"00-{context.trace_id:032x}-{context.span_id:016x}-{int(context.trace_flags):02x}"
    assert context.trace_flags.sampled
    assert engine.attributes["error.type"] == "engine_unavailable"
    assert engine.status.status_code == StatusCode.ERROR
    assert spans["POST /v1/completions"].attributes["error.type"] == "503"
    assert spans["admission"].attributes["palmyra.admission.verdict"] == "admitted"


def test_ratio_zero_records_nothing_and_tells_the_engine_so(url: str):
    tracing = Tracing(Settings(otlp_traces_endpoint=url, trace_sample_ratio=0.0))
    memory = InMemorySpanExporter()
    tracing.provider.add_span_processor(SimpleSpanProcessor(memory))
    try:
        t0 = time.perf_counter()
        record = RequestRecord("r3", "POST", "/v1/completions", "completions")
        rt = tracing.start(scope(), record, t0)
        assert rt.trace_id is None  # nothing recorded: no id in the access log
        flags = int(rt.engine_traceparent("POST", b"/v1/completions", t0).rsplit(b"-", 1)[1], 16)
        assert not flags & 1  # W3C: the sampled bit clear (the SDK may set bit 1, "random")
        record.status = 200
        rt.finish(record, t0 + 0.01)
        assert memory.get_finished_spans() == ()
    finally:
        tracing.shutdown()


def test_a_clients_sampled_flag_never_lifts_tracing_above_the_operators_ratio(url: str):
    """Attack: a client's traceparent with the sampled flag overrode a ratio of 0.0 (four spans a
    request, under a trace id of the client's choosing)."""
    tracing = Tracing(Settings(otlp_traces_endpoint=url, trace_sample_ratio=0.0))
    try:
        t0 = time.perf_counter()
        record = RequestRecord("r4", "POST", "/v1/completions", "completions")
        for parent in (
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
            "00-00000000000000000000000000000001-b7ad6b7169203331-01",  # the lowest id a ratio test passes
            "00-" + "0" * 32 + "-b7ad6b7169203331-01",
            "garbage",
        ):
            assert tracing.start(scope(parent), record, t0).trace_id is None
    finally:
        tracing.shutdown()


def test_a_clients_trace_is_continued_at_ratio_one_and_its_unsampled_flag_kept(url: str):
    tracing = Tracing(Settings(otlp_traces_endpoint=url, trace_sample_ratio=1.0))
    try:
        t0 = time.perf_counter()
        record = RequestRecord("r5", "POST", "/v1/completions", "completions")
        parent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
        assert tracing.start(scope(parent), record, t0).trace_id == "0af7651916cd43dd8448eb211c80319c"
        unsampled = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00"
        assert tracing.start(scope(unsampled), record, t0).trace_id is None
    finally:
        tracing.shutdown()


def test_an_endpoint_that_is_not_an_http_url_stops_the_start():
    with pytest.raises(ValueError, match="OTLP/HTTP"):
        Settings(otlp_traces_endpoint="otel-collector:4317")
