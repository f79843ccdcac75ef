"""The field policy on the real sidecar, one regression test per attack a keyed tenant made
(the fake engine misbehaves on purpose where an attack needs the engine's answer)."""

from __future__ import annotations

import json
import signal

import httpx

from tests.helpers.api import assert_openai_error, completion
from tests.helpers.waiting import wait_until


def _stats(client: httpx.Client, engine) -> dict:
    return client.get(f"{engine.url}/fake/stats").json()


def _ready(client: httpx.Client, sidecar) -> int:
    return client.get(f"{sidecar.url}/ready").status_code


def test_stream_spelt_as_a_string_is_a_stream_counted_by_the_engines_usage(engine, sidecar, client):
    """Attack: `"stream": "true"` was read as no stream by the accounting, and vLLM 0.32's
    stream_interval packed 1000 tokens into one event charged as one token."""
    with client.stream("POST", f"{sidecar.url}/v1/completions", json=completion(max_tokens=5, stream="true")) as r:
        assert r.status_code == 200
        text = r.read().decode()
    assert '"usage"' not in text  # the client did not ask for the report the relay asked for
    sent = _stats(client, engine)["bodies"][-1]
    assert sent["stream"] is True
    assert sent["stream_options"] == {"include_usage": True, "continuous_usage_stats": False}
    assert isinstance(sent["cache_salt"], str) and len(sent["cache_salt"]) == 32

    def logged() -> dict | None:
        lines = [json.loads(line) for line in sidecar.log().splitlines() if '"palmyra.access"' in line]
        return lines[-1] if lines else None

    record = wait_until(logged, 10, "the stream's access-log line")
    assert record["completion_tokens"] == 5 and record["prompt_tokens"] == 3

    before = _stats(client, engine)["requests"]
    resp = client.post(f"{sidecar.url}/v1/completions", json=completion(stream=True, stream_interval=2048))
    assert assert_openai_error(resp, 400, "unsupported_parameter")["param"] == "stream_interval"
    assert _stats(client, engine)["requests"] == before  # never reached the engine


def test_an_engine_4xx_of_any_size_is_the_clients_and_never_flips_readiness(engine, sidecar, client):
    """Attack: an unknown 70 KB model name made vLLM's 404 body exceed the relay's error cap; the
    relay reported an engine failure and /ready was 503 for 96% of 20 s."""
    for _ in range(6):
        resp = client.post(f"{sidecar.url}/v1/completions", json=completion(prompt="fake:huge-404"))
        err = assert_openai_error(resp, 404)
        assert len(err["message"]) < 1000
        assert _ready(client, sidecar) == 200
    metrics = client.get(f"{sidecar.url}/metrics").text
    assert not [
        line
        for line in metrics.splitlines()
        if line.startswith("palmyra_upstream_errors_total") and not line.endswith(" 0.0")
    ]


def test_a_nested_prompt_is_the_clients_400_not_a_sidecar_fault(engine, sidecar, client):
    """Attack: a prompt nested 1000 lists deep (2 KB) crashed the reservation estimate: a 500
    counted as an internal fault, and three of them turned /ready false for 30 s."""
    body = '{"model": "palmyra-mini", "prompt": ' + "[" * 1000 + "1" + "]" * 1000 + "}"
    for _ in range(5):
        resp = client.post(f"{sidecar.url}/v1/completions", content=body, headers={"content-type": "application/json"})
        assert_openai_error(resp, 400)
    assert _ready(client, sidecar) == 200
    assert "palmyra_internal_errors_total 0.0" in client.get(f"{sidecar.url}/metrics").text


def test_unknown_and_refused_fields_never_reach_the_engine(engine, sidecar, client):
    before = _stats(client, engine)["requests"]
    for extra, code in (
        ({"temprature": 0}, "unknown_parameter"),
        ({"use_beam_search": "true"}, "unsupported_parameter"),
        ({"kv_transfer_params": {"remote_host": "10.0.0.1"}}, "unsupported_parameter"),
    ):
        assert_openai_error(client.post(f"{sidecar.url}/v1/completions", json=completion(**extra)), 400, code)
    chat = {"model": "palmyra-mini", "messages": [{"role": "user", "content": "hi"}], "chat_template": "{{ 7 * 7 }}"}
    assert_openai_error(client.post(f"{sidecar.url}/v1/chat/completions", json=chat), 400, "unsupported_parameter")
    assert _stats(client, engine)["requests"] == before


def test_sighup_reloads_and_keeps_serving(engine, sidecar, client):
    """SIGHUP is a reload, as operators expect of a daemon: nothing stops."""
    sidecar.proc.send_signal(signal.SIGHUP)
    assert client.post(f"{sidecar.url}/v1/completions", json=completion()).status_code == 200
    assert sidecar.proc.poll() is None
    assert "SIGHUP: reading the key and tenants files again" in sidecar.log()
