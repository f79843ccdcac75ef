"""The real vLLM CPU engine (tiny stand-in) behind the real sidecar, called the way users call it:
the unmodified OpenAI SDK and curl."""

from __future__ import annotations

import json
import socket
import subprocess
import time
from typing import Any

import openai
import pytest

from tests.helpers.api import HTTP, raw_json_post
from tests.helpers.reliability import engine_gauge, wait_engine_idle
from tests.helpers.waiting import wait_until

pytestmark = pytest.mark.engine_contract  # also run against vLLM 0.18.0 (the vllm018 tier)


@pytest.fixture(scope="module")
def sdk(sidecar_server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{sidecar_server.url}/v1", api_key="unused", max_retries=0)


# Long enough to still be generating when the client leaves: the most the engine's max-model-len
# (2048) allows after the one-token prompt, about 20 s at this machine's single-stream rate.
LONG_GENERATION: dict[str, Any] = {"model": "palmyra-mini", "prompt": "Tell", "max_tokens": 2000, "ignore_eos": True}
# While the CPU engine generates, a test process can wait on the run queue for the whole generation
# (docs/reliability.md, finding 5). Such a stall leaves nothing to abort, so that attempt is retried.
ATTEMPTS = 3


def test_ready_reports_the_random_stand_in(sidecar_server):
    body = HTTP.get(f"{sidecar_server.url}/ready", timeout=5).json()
    assert body["ready"] is True and body["weights"] == "random-stand-in"
    assert body["progress"]["done"] == body["progress"]["total"] >= 6


def test_sdk_completion_returns_real_generated_tokens(sdk):
    out = sdk.completions.create(model="palmyra-mini", prompt="What is 2+2?", max_tokens=8, temperature=0)
    assert out.usage.completion_tokens == 8 and out.usage.prompt_tokens == 7
    assert out.choices[0].text and out.choices[0].finish_reason == "length"
    again = sdk.completions.create(model="palmyra-mini", prompt="What is 2+2?", max_tokens=8, temperature=0)
    assert again.choices[0].text == out.choices[0].text  # greedy is deterministic


def test_sdk_chat_and_streaming(sdk):
    chat = sdk.chat.completions.create(model="palmyra-mini", messages=[{"role": "user", "content": "Hi"}], max_tokens=5)
    assert chat.choices[0].message.role == "assistant" and chat.usage.completion_tokens == 5
    pieces = [
        c.choices[0].text
        for c in sdk.completions.create(
            model="palmyra-mini", prompt="Once upon", max_tokens=6, stream=True, temperature=0
        )
        if c.choices
    ]
    assert len(pieces) == 6
    deltas = [
        c.choices[0].delta.content
        for c in sdk.chat.completions.create(
            model="palmyra-mini",
            messages=[{"role": "user", "content": "Hi"}],
            max_tokens=4,
            stream=True,
            stream_options={"include_usage": True},
        )
        if c.choices
    ]
    assert len([d for d in deltas if d]) >= 3


def test_sdk_errors_are_openai_errors(sdk):
    with pytest.raises(openai.NotFoundError) as exc:
        sdk.completions.create(model="not-a-model", prompt="x", max_tokens=1)
    assert "not-a-model" in str(exc.value)
    with pytest.raises(openai.BadRequestError):
        sdk.completions.create(model="palmyra-mini", prompt="x", max_tokens=1, temperature=-1)
    with pytest.raises(openai.BadRequestError):
        sdk.completions.create(model="palmyra-mini", prompt=[9707] * 3000, max_tokens=1)  # over max-model-len


def test_curl_completion_and_request_id(sidecar_server):
    out = subprocess.run(
        [
            "curl",
            "-sS",
            "-i",
            f"{sidecar_server.url}/v1/completions",
            "-H",
            "Content-Type: application/json",
            "-H",
            "X-Request-Id: curl-1",
            "-d",
            json.dumps({"model": "palmyra-mini", "prompt": "Hello", "max_tokens": 4}),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    head, _, body = out.stdout.partition("\n\n")  # text mode turned \r\n into \n
    assert head.startswith("HTTP/1.1 200") and "x-request-id: curl-1" in head.lower(), out.stdout
    assert json.loads(body)["usage"]["completion_tokens"] == 4, out.stdout


def assert_stopped_early(engine_url: str, generated_before: float) -> None:
    """The engine stopped the generation the client left: idle soon, short of max_tokens, and
    nothing generated after."""
    wait_engine_idle(engine_url, 10)
    generated = engine_gauge(engine_url, "vllm:generation_tokens_total")
    assert generated - generated_before < LONG_GENERATION["max_tokens"]  # stopped, not finished
    time.sleep(1)
    assert engine_gauge(engine_url, "vllm:generation_tokens_total") == generated  # nothing more generated


def leave_mid_generation(sidecar_server, engine_url: str, payload: dict, started) -> float:
    """Send `payload` on a raw socket, wait until `started(sock)` says the generation is under way
    while the engine still runs it, then close the socket. Returns generation_tokens_total at the
    start; retried when a delivery stall let the whole generation finish first."""
    for _ in range(ATTEMPTS):
        wait_engine_idle(engine_url, 30)
        before = engine_gauge(engine_url, "vllm:generation_tokens_total")
        with socket.create_connection(("127.0.0.1", sidecar_server.port), timeout=60) as sock:
            sock.sendall(raw_json_post("/v1/completions", payload))
            started(sock)
            if engine_gauge(engine_url, "vllm:num_requests_running") == 1:
                return before
    raise AssertionError(f"in {ATTEMPTS} attempts the engine never still ran the generation when the client left")


def test_client_disconnect_makes_the_engine_abort(sidecar_server, engine_server):
    def five_events(sock: socket.socket) -> None:
        received = b""
        while received.count(b"data: ") < 5:
            chunk = sock.recv(65536)
            assert chunk and b"200 OK" in received + chunk, (received + chunk)[:500]
            received += chunk

    before = leave_mid_generation(sidecar_server, engine_server.url, {**LONG_GENERATION, "stream": True}, five_events)
    assert_stopped_early(engine_server.url, before)


def test_client_disconnect_aborts_a_non_streamed_generation_in_the_engine(sidecar_server, engine_server):
    # Nothing comes back until a non-streamed generation is finished, so only the sidecar noticing
    # the socket close can stop it.
    def generation_running(_sock: socket.socket) -> None:
        wait_until(
            lambda: engine_gauge(engine_server.url, "vllm:num_requests_running") == 1,
            10,
            "the generation started",
            interval_s=0.05,
        )

    before = leave_mid_generation(sidecar_server, engine_server.url, LONG_GENERATION, generation_running)
    assert_stopped_early(engine_server.url, before)


# What a load-aware router and the dashboards read from the engine's own page.
ENGINE_SERIES = (
    "vllm:num_requests_waiting",
    "vllm:num_requests_running",
    "vllm:kv_cache_usage_perc",
    "vllm:cache_config_info",
)


def test_engine_metrics_are_served_unchanged_on_the_sidecar_port(sidecar_server, engine_server):
    def names(page: str) -> set[str]:
        return {line.split("{")[0].split(" ")[0] for line in page.splitlines() if line and line[0] != "#"}

    direct = HTTP.get(f"{engine_server.url}/metrics", timeout=10)  # the text format
    for accept in (None, "application/openmetrics-text; version=1.0.0"):
        headers = {"Accept": accept} if accept else {}
        relayed = HTTP.get(f"{sidecar_server.url}/engine/metrics", headers=headers, timeout=10)  # no key
        assert relayed.status_code == direct.status_code == 200
        # One copy serves every client (sidecar/upstream/metrics_page.py): the text format, whatever is asked.
        assert relayed.headers["content-type"] == direct.headers["content-type"]
        assert "content-encoding" not in relayed.headers
        # Counters move between the two scrapes; the series on the page are the same.
        assert names(relayed.text) == names(direct.text)
        for series in ENGINE_SERIES:
            assert series in names(relayed.text), series
    # vLLM 0.32 exports vllm:lora_requests_info only when LoRA is enabled (it is not here).
    assert "vllm:lora_requests_info" not in relayed.text
