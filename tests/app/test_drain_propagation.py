"""SIGTERM with a propagation delay: not ready at once, still serving for the delay, then 503 +
Retry-After on a listener that stays open, in-flight streams (also those admitted during the
delay) finish, exit 0. Real sidecar process, FAKE engine."""

from __future__ import annotations

import concurrent.futures
import signal
import socket
import time

import httpx

from tests.helpers.api import assert_openai_error, completion
from tests.helpers.waiting import wait_until

PROPAGATION_S = 2.0


def test_sigterm_keeps_serving_for_the_propagation_delay_then_refuses_and_drains(engine, sidecar_factory, client):
    with sidecar_factory(engine.url, PALMYRA_DRAIN_PROPAGATION_S=str(PROPAGATION_S)) as sc:

        def stream() -> list[str]:
            with (
                httpx.Client(timeout=30) as c,
                c.stream(
                    "POST", f"{sc.url}/v1/completions", json=completion("fake:slow", max_tokens=10, stream=True)
                ) as resp,
            ):
                assert resp.status_code == 200
                return [line for line in resp.iter_lines() if line.startswith("data: ")]

        t0 = time.monotonic()
        sc.proc.send_signal(signal.SIGTERM)
        ready = wait_until(lambda: (r := client.get(f"{sc.url}/ready")).status_code == 503 and r, 2, "/ready 503")
        assert ready.json()["phase"] == "draining"
        # Not ready, yet new work is still taken: routers have not all stopped sending it here.
        served = client.post(f"{sc.url}/v1/completions", json=completion())
        assert served.status_code == 200
        # ...on a connection that closes after it, so a kept-alive client (pinned to this pod by
        # kube-proxy or its own pool) reconnects and lands on a replica that stays.
        assert served.headers["connection"] == "close"
        with socket.create_connection(("127.0.0.1", sc.port), timeout=5) as raw:
            raw.sendall(b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n")
            answer = b""
            while chunk := raw.recv(65536):  # ends only because the sidecar closes the connection
                answer += chunk
        assert answer.startswith(b"HTTP/1.1 200") and b"connection: close" in answer.lower()
        assert time.monotonic() - t0 < PROPAGATION_S
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            late_stream = pool.submit(stream)  # 3 s of tokens: outlives the delay
            # After the delay: refused, retryable, while the listener is still open.
            refused = wait_until(
                lambda: (r := client.post(f"{sc.url}/v1/completions", json=completion())).status_code != 200 and r,
                PROPAGATION_S + 3,
                "new requests refused",
            )
            assert time.monotonic() - t0 >= PROPAGATION_S
            assert_openai_error(refused, 503, "draining")
            assert refused.headers["retry-after"] == "1"
            events = late_stream.result(timeout=20)
        assert events[-1] == "data: [DONE]" and len(events) == 11
        assert sc.proc.wait(timeout=15) == 0
