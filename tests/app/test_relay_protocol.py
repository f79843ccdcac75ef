"""The relay's protocol handling and accounting over real sockets, against the fake engine's named
faults (tests/helpers/fake_engine.py): interim responses, close-delimited bodies, trailers, an
oversized head, a request never sent twice, a body cut in the middle, an SSE stream whose reads
split everything, readiness dropping when the relay sees the engine fail, and /engine/metrics."""

from __future__ import annotations

import json
import re
import socket
import time

from tests.helpers import procs
from tests.helpers.api import assert_openai_error, completion, raw_json_post
from tests.helpers.fake_engine import METRICS_PAGE, METRICS_TYPE, USAGE_TRICKY
from tests.helpers.waiting import wait_until


def metric(text: str, series: str) -> float:
    """The value of one exact series on a metrics page (0 when absent)."""
    match = re.search(rf"^{re.escape(series)} (\S+)$", text, re.MULTILINE)
    return float(match.group(1)) if match else 0.0


def access_entries(server: procs.Server, request_id: str) -> list[dict]:
    lines = [json.loads(line) for line in server.log().splitlines() if line.startswith("{")]
    return [e for e in lines if e.get("logger") == "palmyra.access" and e.get("request_id") == request_id]


def test_a_stream_split_everywhere_is_counted_exactly_and_relayed_unchanged(sidecar, client):
    from tests.helpers.fake_engine import _tricky_stream

    with client.stream(
        "POST", f"{sidecar.url}/v1/completions", json=completion("fake:tricky-sse", n=2, stream=True)
    ) as resp:
        assert resp.status_code == 200
        body = b"".join(resp.iter_raw())
    assert body == b"".join(_tricky_stream())
    text = client.get(f"{sidecar.url}/metrics").text
    # The usage event (split across two reads) wins: 7, not the 6 text events nor the 9 markers.
    assert metric(text, 'palmyra_output_tokens_total{route="completions"}') == USAGE_TRICKY["completion_tokens"]
    assert metric(text, 'palmyra_prompt_tokens_total{route="completions"}') == USAGE_TRICKY["prompt_tokens"]
    # Each of the two choices had three text events: one ITL observation, per choice.
    assert metric(text, 'palmyra_inter_token_latency_seconds_count{route="completions"}') == 1


def test_interim_responses_are_skipped_and_the_final_answer_relayed(sidecar, client):
    resp = client.post(f"{sidecar.url}/v1/completions", json=completion("fake:interim"))
    assert resp.status_code == 200 and resp.json()["choices"][0]["text"] == "t0t1"
    assert "link" not in resp.headers  # the 103's field belongs to the 103
    assert metric(client.get(f"{sidecar.url}/metrics").text, 'palmyra_output_tokens_total{route="completions"}') == 2


def test_a_close_delimited_body_is_relayed_as_complete(sidecar, client):
    resp = client.post(
        f"{sidecar.url}/v1/completions",
        json=completion("fake:close-delimited"),
        headers={"X-Request-Id": "close-delimited-1"},
    )
    assert resp.status_code == 200 and resp.json()["usage"]["completion_tokens"] == 2
    entry = wait_until(lambda: access_entries(sidecar, "close-delimited-1"), 5, "the access log line")[0]
    assert entry["status"] == 200 and "upstream_error" not in entry and entry["completion_tokens"] == 2


def test_trailers_are_never_relayed_as_headers(sidecar, client):
    resp = client.post(f"{sidecar.url}/v1/completions", json=completion("fake:trailers"))
    assert resp.status_code == 200 and resp.json()["choices"][0]["text"] == "t0t1"
    assert "x-smuggled" not in resp.headers and "set-cookie" not in resp.headers
    assert "trailer" not in resp.headers


def test_an_engine_head_over_the_limits_is_a_502(sidecar, client):
    resp = client.post(f"{sidecar.url}/v1/completions", json=completion("fake:big-head"))
    assert_openai_error(resp, 502, "bad_upstream")
    assert len(resp.headers) < 10
    text = client.get(f"{sidecar.url}/metrics").text
    assert metric(text, 'palmyra_upstream_errors_total{kind="bad_upstream"}') == 1


def test_a_request_the_engine_read_is_never_sent_again(sidecar, engine, client):
    # A first request leaves a kept-alive connection in the relay's pool; the second goes out on it,
    # and the engine reads it and closes without a byte: the relay must not resend it.
    assert client.post(f"{sidecar.url}/v1/completions", json=completion()).status_code == 200
    resp = client.post(
        f"{sidecar.url}/v1/completions", json=completion("fake:read-and-close"), headers={"X-Request-Id": "only-once-1"}
    )
    assert_openai_error(resp, 502, "bad_upstream")
    assert client.get(f"{engine.url}/fake/stats").json()["request_ids"].count("only-once-1") == 1


def test_a_non_streamed_body_cut_midway_ends_the_response_cleanly(sidecar, client):
    with socket.create_connection(("127.0.0.1", sidecar.port), timeout=10) as sock:
        sock.sendall(raw_json_post("/v1/completions", completion("fake:cut-body"), {"X-Request-Id": "cut-1"}))
        received = b""
        while chunk := sock.recv(65536):  # the sidecar closes the connection: no hang
            received += chunk
    head, _, body = received.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 ")
    announced = re.search(rb"(?i)\r\ncontent-length: (\d+)", head)
    assert announced, head
    length = int(announced.group(1))
    assert 0 < len(body) < length  # what the client sees: a 200 whose body stops short
    entry = wait_until(lambda: access_entries(sidecar, "cut-1"), 5, "the access log line")[0]
    assert entry["status"] == 200 and entry["truncated"] is True
    assert entry["upstream_error"] == "stream_interrupted"
    assert "Traceback" not in sidecar.log() and "Exception in ASGI application" not in sidecar.log()
    text = client.get(f"{sidecar.url}/metrics").text
    assert metric(text, 'palmyra_requests_total{route="completions",status="200"}') == 1
    assert metric(text, 'palmyra_requests_total{route="completions",status="500"}') == 0
    assert metric(text, 'palmyra_upstream_errors_total{kind="stream_interrupted"}') == 1
    # The sidecar still serves.
    assert client.post(f"{sidecar.url}/v1/completions", json=completion()).status_code == 200


def test_a_stream_cut_by_the_engine_drops_readiness_at_once_until_a_later_poll(engine, sidecar_factory, client):
    # A slow health poll, so what drops readiness can only be the relay's own report.
    with sidecar_factory(engine.url, PALMYRA_HEALTH_POLL_INTERVAL_S="4") as sc:
        assert client.get(f"{sc.url}/ready").status_code == 200
        with client.stream(
            "POST", f"{sc.url}/v1/completions", json=completion("fake:die", max_tokens=10, stream=True)
        ) as resp:
            tail = b"".join(resp.iter_raw())
        cut = time.monotonic()
        ready = client.get(f"{sc.url}/ready")
        assert time.monotonic() - cut < 0.5
        assert b"stream_interrupted" in tail and ready.status_code == 503
        body = ready.json()
        assert body["relay_failure"] == "stream_interrupted" and body["engine_health"] == "ok"
        # The engine still answers its /health: the next poll clears the report.
        wait_until(lambda: client.get(f"{sc.url}/ready").status_code == 200, 12, "ready after the next poll")
        assert client.get(f"{sc.url}/health").status_code == 200  # liveness never wavered


def test_ready_keeps_engine_error_texts_in_the_log(engine, sidecar_factory, client):
    client.post(f"{engine.url}/fake/control", json={"generate": "fail"})
    with sidecar_factory(engine.url, wait_ready=False) as sc:
        reason = wait_until(lambda: client.get(f"{sc.url}/ready").json().get("last_error"), 10, "a warmup error")
        assert reason.startswith("warmup step '") and reason.endswith("' failed")
        assert "engine core died" not in client.get(f"{sc.url}/ready").text
        wait_until(lambda: "engine core died" in sc.log(), 5, "the engine's words in the sidecar log")


def test_engine_metrics_are_relayed_unchanged_without_a_key(engine, sidecar_factory, client):
    with sidecar_factory(engine.url, PALMYRA_API_KEYS="client-key-1") as sc:
        assert client.post(f"{sc.url}/v1/completions", json=completion()).status_code == 401
        resp = client.get(f"{sc.url}/engine/metrics")
        assert resp.status_code == 200
        assert resp.headers["content-type"] == METRICS_TYPE and resp.content == METRICS_PAGE
        # Served from a copy at most 200 ms old (tests/app/test_edge_bypasses.py): a change on the
        # engine shows once the copy is replaced.
        client.post(f"{engine.url}/fake/control", json={"metrics": "fail"})
        resp = wait_until(
            lambda: (r := client.get(f"{sc.url}/engine/metrics")).status_code == 500 and r,
            2,
            "the engine's failure served",
        )
        assert resp.text == "metrics broke"  # the engine's answer, as it was
        client.post(f"{engine.url}/fake/control", json={"metrics": "huge"})
        resp = wait_until(
            lambda: (r := client.get(f"{sc.url}/engine/metrics")).status_code == 503 and r,
            2,
            "the page over the cap refused",
        )
        assert_openai_error(resp, 503, "bad_upstream")


def test_engine_metrics_when_the_engine_is_down_is_a_clear_503(sidecar_factory, client):
    nothing_listens = f"http://127.0.0.1:{procs.free_port()}"
    with sidecar_factory(nothing_listens, wait_ready=False) as sc:
        resp = client.get(f"{sc.url}/engine/metrics")
        assert_openai_error(resp, 503, "engine_unavailable")
        assert resp.headers["retry-after"] == "1"
