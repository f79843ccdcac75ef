"""Admission control, API keys and graceful drain, end to end over real sockets (FAKE engine)."""

from __future__ import annotations

import concurrent.futures
import json
import signal
import time

import httpx
import pytest

from tests.helpers import procs
from tests.helpers.api import assert_openai_error, completion
from tests.helpers.waiting import wait_until


def gauge(client: httpx.Client, url: str, name: str) -> float:
    """An unlabelled gauge of the sidecar's /metrics page."""
    for line in client.get(f"{url}/metrics").text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"{name} not on the metrics page")


def test_queue_full_is_429_with_retry_after_and_queued_requests_complete(engine, sidecar_factory, client):
    # Fixed mode, the manual settings: one in flight, one queued (adaptive: tests/app/test_admission_adaptive_live.py).
    with sidecar_factory(
        engine.url, PALMYRA_ADMISSION_MODE="fixed", PALMYRA_MAX_IN_FLIGHT="1", PALMYRA_MAX_QUEUE="1"
    ) as sc:
        slow = completion("fake:slow", max_tokens=5, stream=True)
        with concurrent.futures.ThreadPoolExecutor(3) as pool:
            first = pool.submit(client.post, f"{sc.url}/v1/completions", json=slow)
            wait_until(lambda: gauge(client, sc.url, "palmyra_in_flight_requests") == 1, 5, "the first in flight")
            second = pool.submit(client.post, f"{sc.url}/v1/completions", json=slow)  # waits in the queue
            wait_until(lambda: gauge(client, sc.url, "palmyra_queued_requests") == 1, 5, "the second queued")
            t0 = time.monotonic()
            third = client.post(f"{sc.url}/v1/completions", json=completion())
            assert time.monotonic() - t0 < 2, "a rejection must not wait for the 30 s queue timeout"
            assert_openai_error(third, 429, "queue_full")
            assert third.headers["retry-after"] == "1"
            assert first.result().status_code == 200 and second.result().status_code == 200
        metrics = client.get(f"{sc.url}/metrics").text
        assert 'palmyra_rejections_total{reason="queue_full"} 1.0' in metrics
        assert "palmyra_in_flight_requests 0.0" in metrics and "palmyra_queued_requests 0.0" in metrics


def test_body_limit_and_max_tokens_cap(engine, sidecar_factory, client):
    with sidecar_factory(engine.url, PALMYRA_MAX_BODY_BYTES="1000", PALMYRA_MAX_TOKENS_CAP="16") as sc:
        assert_openai_error(
            client.post(f"{sc.url}/v1/completions", json=completion("x" * 2000)), 413, "request_too_large"
        )
        err = assert_openai_error(
            client.post(f"{sc.url}/v1/completions", json=completion(max_tokens=17)), 400, "max_tokens_too_large"
        )
        assert err["param"] == "max_tokens"
        assert client.post(f"{sc.url}/v1/completions", json=completion(max_tokens=16)).status_code == 200
        assert_openai_error(
            client.post(f"{sc.url}/v1/completions", content=b"{not json", headers={"content-type": "application/json"}),
            400,
            "invalid_json",
        )


def test_api_keys_guard_v1_but_not_health_ready_metrics(engine, sidecar_factory, client, tmp_path):
    keyfile = tmp_path / "keys"
    keyfile.write_text("# rotated 2026-12\nfile-key-2\n")
    with sidecar_factory(engine.url, PALMYRA_API_KEYS="env-key-1", PALMYRA_API_KEYS_FILE=str(keyfile)) as sc:
        for auth in (None, "Bearer wrong", "Bearer env-key", "Bearer env-key-1x", "Basic env-key-1", "env-key-1"):
            headers = {"Authorization": auth} if auth else {}
            for method, path in (
                ("POST", "/v1/completions"),
                ("POST", "/v1/chat/completions"),
                ("GET", "/v1/models"),
                ("POST", "/tokenize"),
            ):
                resp = client.request(method, f"{sc.url}{path}", json=completion(), headers=headers)
                assert_openai_error(resp, 401, "invalid_api_key")
        for key in ("env-key-1", "file-key-2"):
            resp = client.post(
                f"{sc.url}/v1/completions", json=completion(), headers={"Authorization": f"Bearer {key}"}
            )
            assert resp.status_code == 200
        for path in ("/health", "/health/sidecar", "/ready", "/metrics"):
            assert client.get(f"{sc.url}{path}").status_code == 200
        # The client's key never reaches the engine (it gets the pod-local engine key, or nothing).
        assert all(a is None for a in client.get(f"{engine.url}/fake/stats").json()["auth"])
        text = sc.log() + client.get(f"{sc.url}/metrics").text
        assert "env-key-1" not in text and "file-key-2" not in text


def test_sigterm_drains_in_flight_streams_then_exits_zero(engine, sidecar_factory, client):
    with sidecar_factory(engine.url) as sc:

        def stream() -> list[str]:
            with (
                httpx.Client(timeout=30) as c,
                c.stream(
                    "POST", f"{sc.url}/v1/completions", json=completion("fake:slow", max_tokens=8, stream=True)
                ) as resp,
            ):
                assert resp.status_code == 200
                return [line for line in resp.iter_lines() if line.startswith("data: ")]

        with concurrent.futures.ThreadPoolExecutor(3) as pool:
            streams = [pool.submit(stream) for _ in range(3)]
            # All three are mid-stream (8 chunks, 0.3 s apart) before the signal.
            wait_until(lambda: gauge(client, sc.url, "palmyra_in_flight_requests") == 3, 5, "three streams in flight")
            sc.proc.send_signal(signal.SIGTERM)
            wait_until(lambda: client.get(f"{sc.url}/ready").json()["phase"] == "draining", 5, "draining")
            # Still listening, but refusing new work with a retryable 503.
            late = client.post(f"{sc.url}/v1/completions", json=completion())
            assert_openai_error(late, 503, "draining")
            assert late.headers["retry-after"] == "1"
            ready = client.get(f"{sc.url}/ready")
            assert ready.status_code == 503 and ready.json()["phase"] == "draining"
            results = [f.result(timeout=20) for f in streams]
        completed = sum(1 for events in results if events[-1] == "data: [DONE]" and len(events) == 9)
        print(f"graceful stop: {completed}/{len(results)} in-flight streams completed")
        assert completed == len(results)
        assert sc.proc.wait(timeout=15) == 0
        logs = [json.loads(line) for line in sc.log().splitlines() if line.startswith("{")]
        assert any(e["msg"] == "drained" for e in logs)


def test_sigterm_when_idle_exits_zero_at_once(engine, sidecar_factory):
    with sidecar_factory(engine.url) as sc:
        t0 = time.monotonic()
        sc.proc.send_signal(signal.SIGTERM)
        assert sc.proc.wait(timeout=10) == 0
        assert time.monotonic() - t0 < 3
        with pytest.raises(OSError):  # the listener is gone afterwards
            procs.http_get(f"{sc.url}/health/sidecar", timeout=2)
