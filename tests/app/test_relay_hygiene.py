"""What the relay lets out and holds on to, attacked: the real sidecar over real sockets in front of
a FAKE engine that misbehaves on purpose. One regression test per finding:

- an engine 500 whose body held a traceback with a token went to the client verbatim, with the
  engine's set-cookie, CORS grant and internal headers;
- /tokenize and /detokenize bypassed admission (40 concurrent 700 KB tokenizations reached the
  engine at once);
- queued requests whose clients had gone kept their queue places (a normal request got 429);
- SIGTERM waited for a slow upload's body deadline (30 s) with nothing in flight;
- 405 was answered before the key was checked, and the API document listed the routes to anyone.
"""

from __future__ import annotations

import concurrent.futures
import signal
import socket
import time

import httpx

from tests.helpers.api import HTTP, assert_openai_error, completion
from tests.helpers.api import metric_value as sample
from tests.helpers.fake_engine import LEAKED_SECRET
from tests.helpers.waiting import wait_until

KEY = "hygiene-test-key-0123456789"
AUTH = {"Authorization": f"Bearer {KEY}"}


def test_an_engine_5xx_reaches_the_client_without_its_text_or_its_headers(sidecar, client):
    resp = client.post(f"{sidecar.url}/v1/completions", json=completion("fake:leaky-500"))
    err = assert_openai_error(resp, 500, "engine_error")
    rid = resp.headers["x-request-id"]
    assert LEAKED_SECRET not in resp.text and "Traceback" not in resp.text and rid in err["message"]
    for header in ("set-cookie", "access-control-allow-origin", "x-engine-internal", "server"):
        assert header not in resp.headers, header
    # The operator still has the whole text, under the request id.
    wait_until(lambda: LEAKED_SECRET in sidecar.log(), 5, "the engine's text in the sidecar's log")
    logged = next(line for line in sidecar.log().splitlines() if LEAKED_SECRET in line)
    assert rid in logged


def test_tokenize_has_a_gate_of_its_own(engine, sidecar_factory, client):
    env = {"PALMYRA_TOKENIZE_MAX_IN_FLIGHT": "4", "PALMYRA_TOKENIZE_MAX_QUEUE": "8"}
    with sidecar_factory(engine.url, **env) as sc:
        client.post(f"{engine.url}/fake/control", json={"tokenize_delay_s": 0.3})
        bodies = {
            "/tokenize": {"model": "palmyra-mini", "prompt": "x" * 200_000},
            "/detokenize": {"model": "palmyra-mini", "tokens": [1] * 200},
        }

        def one(path: str) -> int:
            with httpx.Client(timeout=30) as c:
                return c.post(f"{sc.url}{path}", json=bodies[path]).status_code

        with concurrent.futures.ThreadPoolExecutor(40) as pool:
            statuses = list(pool.map(one, ["/tokenize", "/detokenize"] * 20))
        seen = client.get(f"{engine.url}/fake/stats").json()["tokenizing_max"]
        assert seen <= 4, f"{seen} tokenizations reached the engine at once"
        assert set(statuses) <= {200, 429} and statuses.count(200) >= 4 and 429 in statuses
        # Generations keep their own slots meanwhile.
        assert client.post(f"{sc.url}/v1/completions", json=completion()).status_code == 200
    print(
        f"40 concurrent tokenizations: at most {seen} at the engine, {statuses.count(200)} served, "
        f"{statuses.count(429)} refused"
    )


def _send_and_close(url: str, body: bytes) -> None:
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port))) as sock:
        sock.sendall(
            b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
            b"content-length: %d\r\n\r\n%s" % (len(body), body)
        )


def test_a_queued_request_whose_client_left_gives_its_place_up_at_once(engine, sidecar_factory, client):
    env = {
        "PALMYRA_ADMISSION_MODE": "fixed",
        "PALMYRA_MAX_IN_FLIGHT": "1",
        "PALMYRA_MAX_QUEUE": "4",
        "PALMYRA_QUEUE_TIMEOUT_S": "30",
    }
    with sidecar_factory(engine.url, **env) as sc, concurrent.futures.ThreadPoolExecutor(2) as pool:
        busy = pool.submit(
            httpx.post, f"{sc.url}/v1/completions", json=completion("fake:slow", max_tokens=10, stream=True), timeout=30
        )
        queued = lambda: sample(client, sc.url, "palmyra_queued_requests")  # noqa: E731
        wait_until(lambda: sample(client, sc.url, "palmyra_in_flight_requests") == 1, 5, "the only slot taken")
        body = httpx.Request("POST", sc.url, json=completion()).content
        for _ in range(4):
            _send_and_close(sc.url, body)
        # Each left at once: the queue is empty again long before the slow stream (3 s) ends.
        t0 = time.monotonic()
        wait_until(lambda: queued() == 0 and not busy.done(), 2, "the gone clients to leave the queue")
        left_in = time.monotonic() - t0
        normal = pool.submit(httpx.post, f"{sc.url}/v1/completions", json=completion(), timeout=30)
        assert normal.result().status_code == 200, "queued behind the slow stream, not refused queue_full"
        assert busy.result().status_code == 200
    print(f"4 gone clients left the queue within {left_in:.2f} s")


def test_sigterm_exits_at_once_with_only_a_slow_upload_open(engine, sidecar_factory):
    with sidecar_factory(engine.url) as sc:
        host, port = sc.url.removeprefix("http://").split(":")
        sock = socket.create_connection((host, int(port)))
        # A body of 1000 bytes announced, 10 sent: the upload would hold the connection for its
        # whole deadline (PALMYRA_BODY_TIMEOUT_S, 30 s by default).
        sock.sendall(
            b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
            b"content-length: 1000\r\n\r\n" + b'{"model": '
        )
        sock.settimeout(15)
        wait_until(
            lambda: sample(HTTP, sc.url, "palmyra_request_bodies_arriving") == 1,
            5,
            "the request to wait in the relay for the rest of its body",
        )
        t0 = time.monotonic()
        sc.proc.send_signal(signal.SIGTERM)
        code = sc.proc.wait(timeout=20)
        took = time.monotonic() - t0
        answer = sock.recv(65536)
        sock.close()
    assert code == 0 and took < 8, f"exited after {took:.1f} s (code {code})"
    assert answer.startswith(b"HTTP/1.1 503") and b"draining" in answer
    print(f"SIGTERM with a slow upload open: 503 draining, exit 0 after {took:.2f} s")


def test_the_key_comes_before_anything_about_the_routes(engine, sidecar_factory, client):
    with sidecar_factory(engine.url, PALMYRA_API_KEYS=KEY) as sc:
        for method, path in (
            ("GET", "/v1/completions"),
            ("POST", "/v1/nothing-here"),
            ("GET", "/openapi.json"),
            ("GET", "/docs"),
            ("DELETE", "/v1/models"),
        ):
            resp = client.request(method, f"{sc.url}{path}")
            assert_openai_error(resp, 401, "invalid_api_key")
            assert "allow" not in resp.headers, path
        assert client.get(f"{sc.url}/v1/completions", headers=AUTH).status_code == 405
        assert client.post(f"{sc.url}/v1/nothing-here", headers=AUTH).status_code == 404
        doc = client.get(f"{sc.url}/openapi.json", headers=AUTH)
        assert doc.status_code == 200 and "/v1/completions" in doc.json()["paths"]
        for path in ("/health", "/health/sidecar", "/ready", "/metrics"):  # probes and scrapers send no key
            assert client.get(f"{sc.url}{path}").status_code == 200, path
