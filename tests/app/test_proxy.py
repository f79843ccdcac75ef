"""The relay over real sockets: streaming chunk by chunk, errors mapped, disconnects abort upstream."""

from __future__ import annotations

import json
import socket
import time

from tests.helpers import procs
from tests.helpers.api import assert_openai_error, completion, raw_json_post
from tests.helpers.waiting import wait_until


def test_non_streaming_completion_is_relayed_with_request_id(sidecar, engine, client):
    resp = client.post(
        f"{sidecar.url}/v1/completions", json=completion(max_tokens=3), headers={"X-Request-Id": "abc-123"}
    )
    assert resp.status_code == 200
    assert resp.json()["choices"][0]["text"] == "t0t1t2"
    assert resp.headers["x-request-id"] == "abc-123"
    assert "abc-123" in client.get(f"{engine.url}/fake/stats").json()["request_ids"]


def test_unsafe_request_id_is_replaced_not_forwarded(sidecar, client):
    resp = client.post(f"{sidecar.url}/v1/completions", json=completion(), headers={"X-Request-Id": "a/b<script>"})
    assert resp.status_code == 200
    rid = resp.headers["x-request-id"]
    assert rid != "a/b<script>" and len(rid) == 32


def test_stream_is_relayed_chunk_by_chunk_not_buffered(sidecar, client):
    arrivals = []
    with client.stream(
        "POST", f"{sidecar.url}/v1/completions", json=completion("fake:slow", max_tokens=5, stream=True)
    ) as resp:
        assert resp.status_code == 200
        assert resp.headers["content-type"].startswith("text/event-stream")
        for line in resp.iter_lines():
            if line.startswith("data: "):
                arrivals.append((time.monotonic(), line))
    assert arrivals[-1][1] == "data: [DONE]"
    assert len(arrivals) == 6
    # The fake engine waits 0.3 s between chunks: a buffering proxy would deliver them together.
    spread = arrivals[4][0] - arrivals[0][0]
    assert spread > 0.9, f"chunks arrived within {spread:.3f} s: buffered"


def test_an_engine_4xx_keeps_its_message_in_openai_shape(sidecar, client):
    resp = client.post(f"{sidecar.url}/v1/completions", json=completion("fake:error"))
    err = assert_openai_error(resp, 400)
    assert err == {"message": "bad sampling parameter", "type": "BadRequestError", "param": "temperature", "code": 400}


def test_engine_unreachable_is_503_with_retry_after(sidecar_factory, client):
    nothing_listens = f"http://127.0.0.1:{procs.free_port()}"
    with sidecar_factory(nothing_listens, wait_ready=False) as sc:
        resp = client.post(f"{sc.url}/v1/completions", json=completion())
        assert_openai_error(resp, 503, "engine_unavailable")
        assert resp.headers["retry-after"] == "1"
        assert client.get(f"{sc.url}/ready").status_code == 503
        live = client.get(f"{sc.url}/health")
        assert live.status_code == 503 and live.json()["status"] == "starting"


def test_engine_timeout_is_504(sidecar, client):
    t0 = time.monotonic()
    resp = client.post(f"{sidecar.url}/v1/completions", json=completion("fake:hang"))
    took = time.monotonic() - t0
    assert_openai_error(resp, 504, "engine_timeout")
    assert took < 2 + 2.5, f"504 after {took:.1f} s with a 2 s read timeout"


def test_unreadable_upstream_is_502(sidecar, client):
    resp = client.post(f"{sidecar.url}/v1/completions", json=completion("fake:garbage"))
    assert_openai_error(resp, 502, "bad_upstream")


def test_engine_dying_mid_stream_ends_with_error_event(sidecar, client):
    t0 = time.monotonic()
    events = []
    with client.stream(
        "POST", f"{sidecar.url}/v1/completions", json=completion("fake:die", max_tokens=10, stream=True)
    ) as resp:
        assert resp.status_code == 200
        for line in resp.iter_lines():
            if line.startswith("data: "):
                events.append(line[6:])
    assert time.monotonic() - t0 < 2
    assert events[:3] == [
        json.dumps({"object": "text_completion", "choices": [{"index": 0, "text": f"t{i}"}]}) for i in range(3)
    ]
    assert json.loads(events[3])["error"]["code"] == "stream_interrupted"
    assert events[4] == "[DONE]"
    metrics = client.get(f"{sidecar.url}/metrics").text
    assert 'palmyra_upstream_errors_total{kind="stream_interrupted"} 1.0' in metrics


def assert_one_more_abort(client, engine, before: int) -> None:
    """The fake engine counts one more generation cut by its caller within 5 s."""
    stats = wait_until(
        lambda: (s := client.get(f"{engine.url}/fake/stats").json())["aborted"] > before and s,
        5,
        "the engine to see the generation cut",
    )
    assert stats["aborted"] == before + 1, stats


def test_client_disconnect_aborts_the_upstream_stream(sidecar, engine, client):
    before = client.get(f"{engine.url}/fake/stats").json()["aborted"]
    with socket.create_connection(("127.0.0.1", sidecar.port)) as sock:
        sock.sendall(raw_json_post("/v1/completions", completion("fake:slow", max_tokens=50, stream=True)))
        assert b"200 OK" in sock.recv(4096)
    # The socket is closed after the first chunk; the fake engine must see its stream cut soon.
    assert_one_more_abort(client, engine, before)
    metrics = client.get(f"{sidecar.url}/metrics").text
    assert 'palmyra_requests_total{route="completions",status="499"} 1.0' in metrics
    assert "palmyra_in_flight_requests 0.0" in metrics


def test_client_disconnect_aborts_a_non_streamed_generation_before_any_byte_came_back(sidecar, engine, client):
    before = client.get(f"{engine.url}/fake/stats").json()["aborted"]
    with socket.create_connection(("127.0.0.1", sidecar.port)) as sock:
        sock.sendall(
            raw_json_post("/v1/completions", completion("fake:hang", max_tokens=5), {"X-Request-Id": "hold-1"})
        )
        # The engine holds the request; nothing has been answered yet.
        wait_until(
            lambda: "hold-1" in client.get(f"{engine.url}/fake/stats").json()["request_ids"],
            5,
            "the engine to hold the request",
        )
    assert_one_more_abort(client, engine, before)
    metrics = client.get(f"{sidecar.url}/metrics").text
    assert "palmyra_in_flight_requests 0.0" in metrics


def test_models_and_metrics_after_traffic(sidecar, client):
    assert client.get(f"{sidecar.url}/v1/models").json()["data"][0]["id"] == "palmyra-mini"
    client.post(
        f"{sidecar.url}/v1/chat/completions",
        json={"model": "palmyra-mini", "messages": [{"role": "user", "content": "x"}], "max_tokens": 6, "stream": True},
    )
    text = client.get(f"{sidecar.url}/metrics").text
    assert 'palmyra_requests_total{route="models",status="200"} 1.0' in text
    assert 'palmyra_requests_total{route="chat_completions",status="200"} 1.0' in text
    assert 'palmyra_inter_token_latency_seconds_count{route="chat_completions"} 1.0' in text
    # The fake's chat stream has no role-only delta and no usage: its 6 content deltas are 6 tokens
    # (the old count of markers took one of them for the role delta vLLM would send).
    assert 'palmyra_output_tokens_total{route="chat_completions"} 6.0' in text
    assert "_created" not in text


def test_one_json_log_line_per_request(sidecar, client):
    client.post(f"{sidecar.url}/v1/completions", json=completion(max_tokens=2), headers={"X-Request-Id": "log-1"})

    def access() -> list[dict]:
        lines = [json.loads(line) for line in sidecar.log().splitlines() if line.startswith("{")]
        return [e for e in lines if e.get("logger") == "palmyra.access" and e.get("request_id") == "log-1"]

    wait_until(access, 5, "the access log line")
    entries = access()
    assert len(entries) == 1
    entry = entries[0]
    assert entry["status"] == 200 and entry["route"] == "completions"
    assert entry["completion_tokens"] == 2 and entry["prompt_tokens"] == 3
    assert entry["duration_ms"] >= entry["ttft_ms"] > 0
