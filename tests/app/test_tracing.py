"""Tracing through the real sidecar process in front of the fake engine: a client's W3C
traceparent is continued, the engine gets the sidecar's own, the spans reach an OTLP/HTTP receiver
(the test receiver of tests/helpers/otlp_receiver.py, decoding with opentelemetry-proto), and the
access log carries the trace id. Off, the sidecar neither changes the header nor logs an id.
(The real engine's spans joining the same trace: tests/engine/test_tracing_engine.py.)"""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

import httpx

from tests.helpers.otlp_receiver import ReceivedSpan, otlp_receiver
from tests.helpers.waiting import wait_until

# Spans leave in batches; the SDK reads its batch delay from this variable (default 5 s).
FAST_EXPORT = {"OTEL_BSP_SCHEDULE_DELAY": "100"}
BODY = {"model": "palmyra-mini", "prompt": "hello", "max_tokens": 4, "stream": True}


def _traceparent(trace_id: str, span_id: str, sampled: bool = True) -> str:
    return f"00-{trace_id}-{span_id}-{'01' if sampled else '00'}"


def _access_lines(log_path: Path) -> list[dict]:
    return [json.loads(line) for line in log_path.read_text().splitlines() if '"palmyra.access"' in line]


def _engine_saw(client: httpx.Client, engine_url: str) -> str:
    """The traceparent of the last generation the engine got ("" for none)."""
    return client.get(f"{engine_url}/fake/stats").json()["traceparents"][-1] or ""


def _by_name(spans: list[ReceivedSpan]) -> dict[str, ReceivedSpan]:
    return {s.name: s for s in spans}


def test_a_stream_is_one_trace_that_continues_the_clients_and_reaches_the_engine(
    engine, sidecar_factory, client, log_dir
):
    trace_id, client_span = os.urandom(16).hex(), os.urandom(8).hex()
    with otlp_receiver() as receiver:
        env = {"PALMYRA_OTLP_TRACES_ENDPOINT": receiver.url, **FAST_EXPORT}
        with sidecar_factory(engine.url, **env) as sc:
            with client.stream(
                "POST",
                f"{sc.url}/v1/completions",
                json=BODY,
                headers={"traceparent": _traceparent(trace_id, client_span), "x-request-id": "trace-me"},
            ) as resp:
                assert resp.status_code == 200
                assert b"[DONE]" in resp.read()
            sent = _engine_saw(client, engine.url)
            wait_until(lambda: len(receiver.trace(trace_id)) == 3, 10, "three spans of the client's trace", 0.05)
            spans = _by_name(receiver.trace(trace_id))

            # A client that sends no traceparent gets a trace of its own, logged.
            assert client.post(f"{sc.url}/v1/completions", json={**BODY, "stream": False}).status_code == 200
            started = _engine_saw(client, engine.url).split("-")[1]
            assert started != trace_id
            wait_until(lambda: len(receiver.trace(started)) == 3, 10, "the trace the sidecar started", 0.05)

            # An unsampled parent: the decision is kept, nothing exported, the engine told not to record.
            quiet = os.urandom(16).hex()
            client.post(
                f"{sc.url}/v1/completions",
                json={**BODY, "stream": False},
                headers={"traceparent": _traceparent(quiet, client_span, sampled=False)},
            ).raise_for_status()
            unsampled = _engine_saw(client, engine.url)
        lines = _access_lines(sc.log_path)

    root, admission, upstream = spans["POST /v1/completions"], spans["admission"], spans["POST"]
    assert root.kind == "SERVER" and root.parent_span_id == client_span
    assert root.service == "palmyra-sidecar"
    assert root.attributes["http.request.method"] == "POST"
    assert root.attributes["http.route"] == "/v1/completions"
    assert root.attributes["http.response.status_code"] == 200
    assert root.attributes["palmyra.request_id"] == "trace-me"
    assert root.attributes["gen_ai.operation.name"] == "text_completion"
    assert root.attributes["gen_ai.request.model"] == "palmyra-mini"
    assert root.attributes["gen_ai.usage.output_tokens"] == 4
    assert root.attributes["palmyra.tenant"] == "default"
    assert admission.parent_span_id == root.span_id and admission.kind == "INTERNAL"
    assert admission.attributes["palmyra.admission.verdict"] == "admitted"
    assert upstream.kind == "CLIENT" and upstream.parent_span_id == root.span_id
    assert upstream.attributes["http.response.status_code"] == 200
    assert "first_token" in upstream.events
    # Nested in time: the admission before the engine request, both inside the request.
    assert root.start_ns <= admission.start_ns <= admission.end_ns <= upstream.start_ns
    assert upstream.start_ns <= upstream.events["first_token"] <= upstream.end_ns <= root.end_ns
    # The engine continues the sidecar's engine-request span, not the client's.
    assert sent == _traceparent(trace_id, upstream.span_id)

    assert unsampled.split("-")[1] == quiet and not int(unsampled.split("-")[3], 16) & 1
    assert receiver.trace(quiet) == []
    by_id = {line["request_id"]: line for line in lines}
    assert by_id["trace-me"]["trace_id"] == trace_id
    assert [line.get("trace_id") for line in lines[-2:]] == [started, None]


def test_off_by_default_the_clients_traceparent_passes_unchanged_and_nothing_is_logged(engine, sidecar, client):
    header = _traceparent(os.urandom(16).hex(), os.urandom(8).hex())
    resp = client.post(f"{sidecar.url}/v1/completions", json=BODY, headers={"traceparent": header})
    assert resp.status_code == 200
    assert _engine_saw(client, engine.url) == header
    wait_until(lambda: _access_lines(sidecar.log_path), 5, "the access log line", 0.05)
    assert "trace_id" not in _access_lines(sidecar.log_path)[-1]


def test_a_caller_without_a_key_costs_no_spans(engine, sidecar_factory, client):
    trace_id = os.urandom(16).hex()
    with otlp_receiver() as receiver:
        env = {"PALMYRA_OTLP_TRACES_ENDPOINT": receiver.url, "PALMYRA_API_KEYS": "a-real-key-0123456789", **FAST_EXPORT}
        with sidecar_factory(engine.url, **env) as sc:
            parent = {"traceparent": _traceparent(trace_id, os.urandom(8).hex())}
            assert client.post(f"{sc.url}/v1/completions", json=BODY, headers=parent).status_code == 401
            keyed = {**parent, "Authorization": "Bearer a-real-key-0123456789"}
            assert client.get(f"{sc.url}/v1/models", headers=keyed).status_code == 200
            wait_until(lambda: receiver.trace(trace_id), 10, "the keyed request's spans", 0.05)
        lines = _access_lines(sc.log_path)
    assert [line["status"] for line in lines] == [401, 200]
    assert "trace_id" not in lines[0] and lines[1]["trace_id"] == trace_id
    # The keyed request's spans only: the 401 made none.
    assert {s.name for s in receiver.trace(trace_id)} == {"GET /v1/models", "admission", "GET"}


def test_a_collector_that_is_away_costs_no_request(engine, sidecar_factory, client):
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}/v1/traces"
    with sidecar_factory(engine.url, PALMYRA_OTLP_TRACES_ENDPOINT=dead, **FAST_EXPORT) as sc:
        for _ in range(5):
            assert client.post(f"{sc.url}/v1/completions", json={**BODY, "stream": False}).status_code == 200
