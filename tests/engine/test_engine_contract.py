"""What the sidecar, the dashboards, the alerts, the autoscaler and the endpoint picker rely on the
engine for, asked of the live engine: /tokenize and /v1/models as the sidecar relays them, a
stream's usage against the sidecar's token accounting, and every vllm: metric name the monitoring
files and the sidecar read, present on the engine's own page. The vllm018 tier runs this module
(and the others marked engine_contract) again against vLLM 0.18.0, the Ascend image's version."""

from __future__ import annotations

import json
import re

import pytest

from tests.helpers.api import HTTP, MODEL
from tests.helpers.reliability import sidecar_metric
from tests.helpers.vllm_metric_names import base_name, used_metric_lines

pytestmark = pytest.mark.engine_contract

# Read where present, exported only with a feature this deployment does not turn on (both vLLM
# versions register it under `if vllm_config.lora_config is not None`, v1/metrics/loggers.py).
FEATURE_ONLY = {"vllm:lora_requests_info": "LoRA (--enable-lora): the picker's loraSpec, for adapter affinity"}


def test_models_lists_the_served_name_with_its_context_length(sidecar_server):
    body = HTTP.get(f"{sidecar_server.url}/v1/models", timeout=10).json()
    assert body["object"] == "list"
    (model,) = body["data"]
    assert model["id"] == MODEL and model["object"] == "model" and model["max_model_len"] == 2048


def test_tokenize_and_detokenize_round_trip_through_the_sidecar(sidecar_server):
    tokens = HTTP.post(f"{sidecar_server.url}/tokenize", json={"model": MODEL, "prompt": "What is 2+2?"}, timeout=10)
    assert tokens.status_code == 200, tokens.text
    body = tokens.json()
    assert body["count"] == len(body["tokens"]) == 7 and body["max_model_len"] == 2048
    text = HTTP.post(f"{sidecar_server.url}/detokenize", json={"model": MODEL, "tokens": body["tokens"]}, timeout=10)
    assert text.status_code == 200 and text.json()["prompt"] == "What is 2+2?"


def test_a_streams_usage_is_what_the_sidecar_counts(sidecar_server):
    before = sidecar_metric(sidecar_server.url, 'palmyra_output_tokens_total{route="completions"}')
    payload = {"model": MODEL, "prompt": "Once upon", "max_tokens": 9, "stream": True, "temperature": 0}
    payload["stream_options"] = {"include_usage": True}
    with HTTP.stream("POST", f"{sidecar_server.url}/v1/completions", json=payload, timeout=60) as resp:
        assert resp.status_code == 200 and resp.headers["content-type"].startswith("text/event-stream")
        events = [line[6:] for line in resp.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    usage = chunks[-1]["usage"]
    assert usage["completion_tokens"] == 9 and usage["prompt_tokens"] > 0
    assert sum(1 for c in chunks if c["choices"] and c["choices"][0]["text"]) <= 9
    after = sidecar_metric(sidecar_server.url, 'palmyra_output_tokens_total{route="completions"}')
    assert after - before == 9


def test_every_vllm_metric_the_monitoring_reads_is_on_the_live_engines_page(engine_server, sidecar_server):
    # One generation first, so that every family has been touched.
    HTTP.post(
        f"{sidecar_server.url}/v1/completions", json={"model": MODEL, "prompt": "hi", "max_tokens": 2}, timeout=60
    )
    page = HTTP.get(f"{sidecar_server.url}/engine/metrics", timeout=10).text
    live = {base_name(m) for m in re.findall(r"^(vllm:[a-zA-Z0-9_:]+)", page, re.M)}
    assert "vllm:num_requests_waiting" in live
    missing = {}
    for name, lines in used_metric_lines().items():
        if base_name(name) in live or name in FEATURE_ONLY:
            continue
        # A name this engine lacks is fine only as a fallback beside one it has, in the same query.
        bare = [
            line
            for line in lines
            if not any(base_name(o) in live for o in re.findall(r"vllm:[a-zA-Z0-9_:]+", line) if o != name)
        ]
        if bare:
            missing[name] = bare[:3]
    assert not missing, "read but not exported by this engine:\n" + json.dumps(missing, indent=1)


def test_the_engines_request_models_are_the_ones_the_field_policy_decided():
    """Every field of this engine's request models has a decision in policy/fields.py (the unit
    tier checks the snapshot against the table; this checks the snapshot against the engine that
    runs: vLLM 0.32 here, 0.18.0 in the vllm018 tier)."""
    import subprocess
    import sys
    from pathlib import Path

    from tests.helpers import engine_under_test

    python = str(engine_under_test.VLLM018_VENV / "bin" / "python") if engine_under_test.vllm018() else sys.executable
    helper = Path(__file__).resolve().parents[1] / "helpers" / "vllm_request_fields.py"
    out = subprocess.run([python, str(helper)], capture_output=True, text=True, timeout=180, check=True)
    live = json.loads(out.stdout.strip().splitlines()[-1])
    snapshot = json.loads((helper.parents[1] / "unit" / "data" / "vllm-request-fields.json").read_text())
    version = live.pop("vllm")
    assert live == snapshot["versions"][version], f"vLLM {version}'s request models differ from the snapshot"


def test_structured_output_within_the_bounds_is_served_and_the_freezing_schema_refused(sidecar_server):
    """Attack: a 200-byte schema with a string pattern `{0,8000}` held vLLM 0.32's API server for
    12.9 s (its /health timing out, /ready 503). Refused before the engine; a small schema served."""

    def schema(prop: dict) -> dict:
        return {
            "model": MODEL,
            "messages": [{"role": "user", "content": "Answer."}],
            "max_tokens": 8,
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "a", "schema": {"type": "object", "properties": {"a": prop}}},
            },
        }

    url = f"{sidecar_server.url}/v1/chat/completions"
    frozen = HTTP.post(url, json=schema({"type": "string", "pattern": "^[\\x00-\\uffff]{0,8000}$"}), timeout=10)
    assert frozen.status_code == 400 and frozen.json()["error"]["param"] == "response_format"
    small = HTTP.post(url, json=schema({"type": "string", "maxLength": 8}), timeout=60)
    assert small.status_code == 200, small.text
