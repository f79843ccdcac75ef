"""One request, one trace, with the real engine (and, as an engine contract, with vLLM 0.18.0, the
Ascend image's): a streamed request through a sidecar with tracing on yields the sidecar's spans and
vLLM's own `llm_request` span in one trace, the engine's span a child of the sidecar's engine
request, all received over OTLP/HTTP by the test receiver (tests/helpers/otlp_receiver.py). The
shared engine runs with PALMYRA_OTLP_TRACES_ENDPOINT set (tests/engine/conftest.py), through the
launcher's own flags."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.helpers import procs
from tests.helpers.api import HTTP, MODEL
from tests.helpers.otlp_receiver import Receiver
from tests.helpers.waiting import wait_until

pytestmark = pytest.mark.engine_contract

SIDECAR, ENGINE = "palmyra-sidecar", "palmyra-engine"
EXPECTED = {(SIDECAR, "POST /v1/completions"), (SIDECAR, "admission"), (SIDECAR, "POST"), (ENGINE, "llm_request")}


def test_a_streamed_request_is_one_trace_across_sidecar_and_engine(engine_server, otlp: Receiver, log_dir: Path):
    trace_id, client_span = os.urandom(16).hex(), os.urandom(8).hex()
    env = {"PALMYRA_OTLP_TRACES_ENDPOINT": otlp.url, "OTEL_BSP_SCHEDULE_DELAY": "200"}
    with procs.sidecar(engine_server.url, log_dir, engine_api_key=engine_server.api_key, extra_env=env) as sc:
        body = {"model": MODEL, "prompt": "Once upon a time", "max_tokens": 8, "temperature": 0, "stream": True}
        headers = {"traceparent": f"00-{trace_id}-{client_span}-01", "x-request-id": "one-trace"}
        with HTTP.stream("POST", f"{sc.url}/v1/completions", json=body, headers=headers, timeout=120) as resp:
            assert resp.status_code == 200
            assert b"[DONE]" in resp.read()

        def names() -> set[tuple[str, str]]:
            return {(s.service, s.name) for s in otlp.trace(trace_id)}

        wait_until(
            lambda: (
                {(SIDECAR, "POST /v1/completions"), (SIDECAR, "admission"), (SIDECAR, "POST"), (ENGINE, "llm_request")}
                <= names()
            ),
            30,
            "the sidecar's three spans and vLLM's llm_request in the client's trace",
            0.1,
        )
    received = sorted(otlp.trace(trace_id), key=lambda s: s.start_ns)
    print(  # the trace as the receiver saw it, for the record
        "\n".join(
            f"{s.service:16} {s.kind:8} {s.name:22} {s.span_id} <- {s.parent_span_id:16} {s.duration_ms:8.1f} ms "
            f"events={sorted(s.events)}"
            for s in received
        )
    )
    # With vLLM 0.18.0 the engine also exports its HTTP server's spans (FastAPI 0.165, which that venv
    # resolves to, traces its own routes): spans are keyed by service and name.
    spans = {(s.service, s.name): s for s in received}
    root, upstream = spans[SIDECAR, "POST /v1/completions"], spans[SIDECAR, "POST"]
    engine = spans[ENGINE, "llm_request"]
    assert root.parent_span_id == client_span
    assert upstream.parent_span_id == root.span_id
    assert engine.parent_span_id == upstream.span_id, "vLLM's span continues the sidecar's engine request"
    # vLLM's request id is the sidecar's X-Request-Id (its completions prefix it: cmpl-<id>-<n>).
    assert "one-trace" in str(engine.attributes.get("gen_ai.request.id"))
    assert engine.attributes.get("gen_ai.usage.completion_tokens") == 8
    assert root.attributes["gen_ai.usage.output_tokens"] == 8
    # The engine's work lies inside the sidecar's engine request, as one clock would see it.
    assert upstream.start_ns - 50_000_000 <= engine.start_ns <= engine.end_ns <= upstream.end_ns + 50_000_000
    logged = [json.loads(x) for x in sc.log_path.read_text().splitlines() if '"one-trace"' in x and "access" in x]
    assert logged and logged[0]["trace_id"] == trace_id
