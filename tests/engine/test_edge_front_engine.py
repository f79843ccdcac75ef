"""The edge in front of the real vLLM engine: a client that stops reading loses its slot and the
engine stops generating for it; the spellings vLLM coerces are bounded before they reach it; the
routes vLLM serves but this service does not document never reach it.

    flock /tmp/palmyra-engine.lock .venv/bin/python -m pytest tests/engine/test_edge_front_engine.py -s
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.helpers import procs
from tests.helpers.api import MODEL, completion, plain_client
from tests.helpers.reliability import FAST, engine_gauge, figure, sidecar_metric
from tests.helpers.waiting import wait_until

ENGINE_MAX_MODEL_LEN = 2048  # procs.engine's


@pytest.fixture(scope="module")
def sidecar(engine_server, log_dir) -> Iterator[procs.Server]:
    # The production front-end defaults (write timeout 10 s); the cap follows the engine's length.
    # No idle canary: its one-token prompt would reach the engine between the refusals whose
    # absence there the second test counts (it did, once in CI: 14919 -> 14920 prompt tokens).
    env = {
        **FAST,
        "PALMYRA_MAX_MODEL_LEN": str(ENGINE_MAX_MODEL_LEN),
        "PALMYRA_READ_TIMEOUT_S": "30",
        "PALMYRA_CANARY_INTERVAL_S": "3600",
    }
    with procs.sidecar(engine_server.url, log_dir, engine_api_key=engine_server.api_key, extra_env=env) as server:
        yield server


def test_a_client_that_stops_reading_frees_its_slot_and_the_engine(sidecar, engine_server):
    generated_before = engine_gauge(engine_server.url, "vllm:generation_tokens_total")
    # n=8 sequences of up to 2000 tokens each: 16000 tokens of work, far more than the time this
    # test allows, and eight choices per step fill the socket buffers quickly.
    body = json.dumps(
        completion("Once upon a time", max_tokens=2000, n=8, stream=True, ignore_eos=True, temperature=1.0)
    ).encode()
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # and then reads nothing
    s.connect(("127.0.0.1", sidecar.port))
    t0 = time.monotonic()
    s.sendall(
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n" % len(body) + body
    )
    try:
        wait_until(
            lambda: engine_gauge(engine_server.url, "vllm:num_requests_running") >= 1,
            30,
            "the engine generating for the stream",
            interval_s=0.1,
        )
        wait_until(
            lambda: sidecar_metric(sidecar.url, "palmyra_in_flight_requests") == 0,
            40,
            "the sidecar's slot freed",
            interval_s=0.2,
        )
        freed_s = time.monotonic() - t0
        wait_until(
            lambda: engine_gauge(engine_server.url, "vllm:num_requests_running") == 0,
            10,
            "the engine's running count back to 0",
            interval_s=0.1,
        )
        stopped_s = time.monotonic() - t0
    finally:
        s.close()
    generated = engine_gauge(engine_server.url, "vllm:generation_tokens_total") - generated_before
    figure(
        "non-reading client",
        slot_freed_s=round(freed_s, 1),
        engine_idle_s=round(stopped_s, 1),
        tokens_generated=int(generated),
        of_requested=16000,
    )
    assert freed_s < 30 and stopped_s < 30
    assert generated < 16000, "the engine finished the generation: nobody stopped it"
    assert sidecar_metric(sidecar.url, 'palmyra_rejections_total{reason="write_timeout"}') == 1


def test_coerced_spellings_and_multipliers_are_bounded_before_the_engine(sidecar, engine_server):
    prompts_before = engine_gauge(engine_server.url, "vllm:prompt_tokens_total")
    refused: dict[str, tuple[dict[str, Any], str]] = {
        "max_tokens as a string": ({"max_tokens": "100000"}, "max_tokens_too_large"),
        "max_tokens as a float": ({"max_tokens": 100000.0}, "max_tokens_too_large"),
        "max_tokens in exponent form": ({"max_tokens": 1e5}, "max_tokens_too_large"),
        "n as in the issue": ({"n": 16384}, "parameter_too_large"),
        "n as a string": ({"n": "64"}, "parameter_too_large"),
        "a batch of prompts": ({"prompt": ["hi"] * 100}, "parameter_too_large"),
        "logprobs over vLLM's cap": ({"logprobs": 1000}, "parameter_too_large"),
    }
    with plain_client(timeout=60) as client:
        for what, (extra, code) in refused.items():
            resp = client.post(f"{sidecar.url}/v1/completions", json={**completion(), **extra})
            assert resp.status_code == 400, (what, resp.text)
            assert resp.json()["error"]["code"] == code, (what, resp.text)
        chat = {"model": MODEL, "max_tokens": 2, "messages": [{"role": "wizard", "content": "hi"}]}
        assert client.post(f"{sidecar.url}/v1/chat/completions", json=chat).json()["error"]["code"] == "invalid_role"
        for path in ("/v1/chat/completions/batch", "/invocations", "/v1/responses/abc", "/v1/messages/count_tokens"):
            resp = client.post(f"{sidecar.url}{path}", json=chat)
            assert resp.status_code == 404 and resp.json()["error"]["code"] == "not_found", (path, resp.text)
        assert engine_gauge(engine_server.url, "vllm:prompt_tokens_total") == prompts_before, "a refusal reached vLLM"

        # The same coercion on both sides: what the sidecar lets through, vLLM reads as the same number.
        ok = client.post(f"{sidecar.url}/v1/completions", json=completion(max_tokens="5", n=2.0, ignore_eos=True))
        assert ok.status_code == 200, ok.text
        assert len(ok.json()["choices"]) == 2 and ok.json()["usage"]["completion_tokens"] == 10
        over = client.post(f"{sidecar.url}/v1/completions", json=completion(max_tokens=f"{ENGINE_MAX_MODEL_LEN + 1}"))
        assert over.status_code == 400 and over.json()["error"]["code"] == "max_tokens_too_large", over.text
    figure("request cost", refused=len(refused) + 5, engine_untouched=True)
