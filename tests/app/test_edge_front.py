"""The sidecar as an edge, attacked over real sockets: the real sidecar process (uvicorn with the
bounded protocol) in front of the FAKE engine, which records every request that reaches it."""

from __future__ import annotations

import json
import socket
import threading
import time
from pathlib import Path

import pytest

from tests.helpers import procs
from tests.helpers.api import assert_openai_error, completion
from tests.helpers.edge import MIB, RssPeak, busy_connection, raw_exchange, rejections, status_of
from tests.helpers.waiting import wait_until

# warmup and canary use the first three; adaptive admission reads the engine's /metrics at start (its
# ceiling), and the supervisor its /version (what the Messages API can carry depends on it)
ALLOWED_UPSTREAM = {"/v1/models", "/v1/completions", "/v1/chat/completions", "/metrics", "/version"}


def leaked(client, engine, marker: str) -> list[str]:
    """Requests the engine saw that it should not have: a path off the allow-list, or one of ours."""
    stats = client.get(f"{engine.url}/fake/stats").json()
    return [p for p in stats["paths"] if p not in ALLOWED_UPSTREAM] + [
        r for r in stats["request_ids"] if r and r.startswith(marker)
    ]


# --- the allow-list ---------------------------------------------------------------------------

REFUSED_TARGETS = [
    "/v1/chat/completions/batch",
    "/v1/responses/abc",
    "/v1/responses/abc/cancel",
    "/v1/messages/count_tokens",
    "/invocations",
    "/v1/load_lora_adapter",
    "/v1/unload_lora_adapter",
    "/v1/embeddings",
    "/v1/audio/transcriptions",
    "/pooling",
    "/v1/completions/",
    "//v1/completions",
    "/v1//completions",
    "/v1/./completions",
    "/v1/%2e%2e/invocations",
    "/v1/completions/../../invocations",
    "/V1/completions",
    "/v1/completions%00",
    "/v1/completions;x",
    "/v1",
    "/",
    "/version",
    "/server_info",
    "/reset_prefix_cache",
    "/collective_rpc",
]


def test_only_allow_listed_routes_reach_the_engine(sidecar, engine, client):
    body = json.dumps(completion()).encode()
    for i, target in enumerate(REFUSED_TARGETS):
        raw = (
            f"POST {target} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nX-Request-Id: refused-{i}\r\n"
            f"Content-Length: {len(body)}\r\n\r\n"
        ).encode() + body
        resp = raw_exchange(sidecar.port, raw)
        assert status_of(resp) == 404, (target, resp[:300])
        err = json.loads(resp.partition(b"\r\n\r\n")[2])["error"]
        assert err["code"] == "not_found" and err["type"] == "invalid_request_error"
    assert not leaked(client, engine, "refused-"), "a refused request reached the engine"
    assert rejections(client, sidecar, "not_found") == len(REFUSED_TARGETS)

    # A known path with the wrong method: 405 with Allow, and still nothing upstream.
    marked = {"X-Request-Id": "refused-405"}
    resp = client.get(f"{sidecar.url}/v1/completions", headers=marked)
    assert_openai_error(resp, 405, "method_not_allowed")
    assert resp.headers["allow"] == "POST"
    assert client.post(f"{sidecar.url}/v1/models", headers=marked).headers["allow"] == "GET"
    assert client.request("HEAD", f"{sidecar.url}/v1/chat/completions", headers=marked).status_code == 405
    assert not leaked(client, engine, "refused-")


def test_relayed_with_the_normalized_path_and_the_query(sidecar, engine, client):
    # Percent-encoded unreserved characters are the same path (RFC 3986 6.2.2.2): allowed, and the
    # engine sees the canonical spelling, never the client's.
    body = json.dumps(completion()).encode()
    raw = (
        f"POST /v1/%63ompletions?x=1 HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode() + body
    assert status_of(raw_exchange(sidecar.port, raw)) == 200
    assert "/v1/completions?x=1" in client.get(f"{engine.url}/fake/stats").json()["paths"]


def test_hop_by_hop_headers_are_not_forwarded(sidecar, engine, client):
    resp = client.post(
        f"{sidecar.url}/v1/completions",
        json=completion(),
        headers={
            "Connection": "keep-alive, X-Hop-One",
            "X-Hop-One": "secret-1",
            "Proxy-Connection": "X-Hop-Two",
            "X-Hop-Two": "secret-2",
            "Keep-Alive": "timeout=5",
            "TE": "trailers",
            "Proxy-Authorization": "Basic eDp5",
            "X-End-To-End": "kept",
        },
    )
    assert resp.status_code == 200
    seen = {k.lower(): v for k, v in client.get(f"{engine.url}/fake/stats").json()["headers"].items()}
    for hop in ("x-hop-one", "x-hop-two", "proxy-connection", "keep-alive", "te", "proxy-authorization"):
        assert hop not in seen, hop
    assert seen["x-end-to-end"] == "kept"


def test_upgrade_is_refused_and_the_connection_closed(sidecar, engine, client):
    upgrades = (
        "Connection: Upgrade\r\nUpgrade: websocket\r\n",
        "Connection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\nHTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA\r\n",
        "Upgrade: h2c\r\n",
    )
    for extra in upgrades:
        body = json.dumps(completion()).encode()
        raw = (
            f"POST /v1/completions HTTP/1.1\r\nHost: x\r\n{extra}Content-Type: application/json\r\n"
            f"X-Request-Id: refused-upgrade\r\nContent-Length: {len(body)}\r\n\r\n"
        ).encode() + body
        resp = raw_exchange(sidecar.port, raw)
        assert status_of(resp) == 400, resp[:300]
        assert b"connection: close" in resp.lower()
        assert json.loads(resp.partition(b"\r\n\r\n")[2])["error"]["code"] == "upgrade_not_supported"
    assert not leaked(client, engine, "refused-")


# --- the bounded front end -------------------------------------------------------------------


def test_a_200_mib_header_gets_431_in_a_second_without_growing_memory(sidecar, client):
    line = b"X-Big: " + b"a" * (200 * MIB) + b"\r\n"
    sock = socket.create_connection(("127.0.0.1", sidecar.port), timeout=10)
    sent = [0]

    def send() -> None:
        try:
            sock.sendall(b"GET /v1/models HTTP/1.1\r\nHost: x\r\n")
            view = memoryview(line)
            while sent[0] < len(view):
                sent[0] += sock.send(view[sent[0] : sent[0] + MIB])
        except OSError:
            pass  # the server closed after answering

    with RssPeak(sidecar.proc.pid) as rss:
        t0 = time.monotonic()
        sender = threading.Thread(target=send, daemon=True)
        sender.start()
        answer = b""
        try:
            while b"\r\n\r\n" not in answer:
                chunk = sock.recv(65536)
                if not chunk:
                    break
                answer += chunk
        except ConnectionResetError:
            pass
        took = time.monotonic() - t0
        sock.close()
        sender.join(timeout=10)
    print(
        f"200 MiB header: {status_of(answer) if answer else None} after {took:.3f} s, "
        f"{sent[0] / MIB:.1f} MiB sent by then, peak RSS growth {rss.growth_mb:.1f} MB"
    )
    assert answer.startswith(b"HTTP/1.1 431"), answer[:200]
    assert took < 1.0
    assert rss.growth_mb < 20
    assert client.get(f"{sidecar.url}/health/sidecar").status_code == 200
    assert rejections(client, sidecar, "header_too_large") == 1


def test_header_count_and_request_line_limits(sidecar, client):
    many = "".join(f"X-H{i}: v\r\n" for i in range(101))
    resp = raw_exchange(sidecar.port, f"GET /v1/models HTTP/1.1\r\nHost: x\r\n{many}\r\n".encode())
    assert status_of(resp) == 431
    resp = raw_exchange(sidecar.port, f"GET /v1/models?{'q' * 9000} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    assert status_of(resp) == 414
    assert json.loads(resp.partition(b"\r\n\r\n")[2])["error"]["code"] == "uri_too_long"
    # Just under the limits is served.
    few = "".join(f"X-H{i}: v\r\n" for i in range(90))
    assert status_of(raw_exchange(sidecar.port, f"GET /v1/models HTTP/1.1\r\nHost: x\r\n{few}\r\n".encode())) == 200


def test_slow_headers_are_closed_within_ten_seconds(sidecar, client):
    # One header line every 5 s, as the attacker did: the head has 8 s (the default) in all.
    with socket.create_connection(("127.0.0.1", sidecar.port), timeout=15) as s:
        t0 = time.monotonic()
        s.sendall(b"GET /v1/models HTTP/1.1\r\nHost: x\r\n")
        answer = b""
        closed_at = None
        for i in range(4):
            s.settimeout(5)
            try:
                chunk = s.recv(4096)
                if not chunk:
                    closed_at = time.monotonic() - t0
                    break
                answer += chunk
            except TimeoutError:
                pass
            except ConnectionResetError:
                closed_at = time.monotonic() - t0
                break
            try:
                s.sendall(f"X-Slow-{i}: x\r\n".encode())
            except OSError:
                closed_at = time.monotonic() - t0
                break
    print(f"slow headers: closed after {closed_at} s, answer {answer[:40]!r}")
    assert closed_at is not None and closed_at < 10
    assert answer.startswith(b"HTTP/1.1 408")
    assert rejections(client, sidecar, "header_timeout") == 1


def test_connection_cap_refuses_cheaply(engine, sidecar_factory, client):
    # Every connection in the middle of a request: none can make room (an idle one would:
    # tests/app/test_edge_bypasses.py).
    with sidecar_factory(engine.url, PALMYRA_MAX_CONNECTIONS="4") as sc:
        held = [busy_connection(sc.port) for _ in range(4)]
        try:
            wait_until(
                lambda: status_of(raw_exchange(sc.port, b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n")) == 503,
                timeout_s=3,
                what="the fifth connection refused",
            )
            resp = raw_exchange(sc.port, b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n")
            assert json.loads(resp.partition(b"\r\n\r\n")[2])["error"]["code"] == "too_many_connections"
        finally:
            for s in held:
                s.close()
        wait_until(
            lambda: client.get(f"{sc.url}/v1/models").status_code == 200,
            timeout_s=5,
            what="served again once connections closed",
        )


def test_probes_keep_their_own_port_when_clients_hold_every_connection(engine, sidecar_factory, client):
    """The kubelet probes the probe port: with the client port's connections all held (the state in
    which a liveness failure would restart a merely busy pod), the probes and Prometheus' /metrics
    still answer, and the probe port serves nothing else and has a cap of its own."""
    probe_port = procs.free_port()
    with sidecar_factory(engine.url, PALMYRA_MAX_CONNECTIONS="4", PALMYRA_PROBE_PORT=str(probe_port)) as sc:
        held = [busy_connection(sc.port) for _ in range(4)]
        try:
            wait_until(
                lambda: status_of(raw_exchange(sc.port, b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")) == 503,
                timeout_s=3,
                what="the client port full: even /health refused there",
            )
            for path in ("/health", "/health/sidecar", "/ready", "/metrics"):
                resp = raw_exchange(probe_port, b"GET %s HTTP/1.1\r\nHost: x\r\n\r\n" % path.encode())
                assert status_of(resp) == 200, (path, resp[:300])
            # Nothing but the probes and the sidecar's own metrics: no relay, no engine page, no API
            # document behind this port.
            for request in (
                b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n",
                b"GET /engine/metrics HTTP/1.1\r\nHost: x\r\n\r\n",
                b"GET /openapi.json HTTP/1.1\r\nHost: x\r\n\r\n",
                b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}",
            ):
                resp = raw_exchange(probe_port, request)
                assert status_of(resp) == 404, resp[:300]
                error = json.loads(resp.partition(b"\r\n\r\n")[2])["error"]
                assert error["code"] == "not_found" and "/ready" in error["message"], error
            # Its own cap: 16 held probe connections, the 17th refused; the client port unaffected.
            probes_held = [socket.create_connection(("127.0.0.1", probe_port)) for _ in range(16)]
            try:
                wait_until(
                    lambda: status_of(raw_exchange(probe_port, b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")) == 503,
                    timeout_s=3,
                    what="the 17th probe connection refused",
                )
            finally:
                for s in probes_held:
                    s.close()
        finally:
            for s in held:
                s.close()
        wait_until(
            lambda: client.get(f"{sc.url}/v1/models").status_code == 200,
            timeout_s=5,
            what="the client port served again once connections closed",
        )
        assert client.get(f"http://127.0.0.1:{probe_port}/ready").status_code == 200


def test_slow_body_has_its_own_deadline(engine, sidecar_factory):
    with sidecar_factory(engine.url, PALMYRA_BODY_TIMEOUT_S="1", PALMYRA_READ_TIMEOUT_S="30") as sc:
        with socket.create_connection(("127.0.0.1", sc.port), timeout=10) as s:
            t0 = time.monotonic()
            s.sendall(
                b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                b'Content-Length: 100\r\n\r\n{"model"'
            )
            answer = s.recv(4096)
            took = time.monotonic() - t0
        assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
        assert 0.9 < took < 3, took


def test_a_client_that_stops_reading_loses_its_slot(engine, sidecar_factory, client):
    with sidecar_factory(
        engine.url, PALMYRA_WRITE_TIMEOUT_S="1", PALMYRA_MAX_MODEL_LEN="1000000", PALMYRA_MAX_IN_FLIGHT="1"
    ) as sc:
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # a client that reads nothing
        s.connect(("127.0.0.1", sc.port))
        body = json.dumps(completion(max_tokens=500000, stream=True)).encode()
        t0 = time.monotonic()
        s.sendall(
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n" % len(body) + body
        )
        wait_until(
            lambda: "palmyra_in_flight_requests 1.0" in client.get(f"{sc.url}/metrics").text,
            timeout_s=5,
            what="the stream holds the slot",
        )
        wait_until(
            lambda: "palmyra_in_flight_requests 0.0" in client.get(f"{sc.url}/metrics").text,
            timeout_s=20,
            what="the slot freed",
        )
        freed = time.monotonic() - t0
        s.close()
        print(f"non-reading client: slot freed after {freed:.1f} s (write timeout 1 s)")
        wait_until(
            lambda: client.get(f"{engine.url}/fake/stats").json()["aborted"] >= 1,
            timeout_s=5,
            what="the engine's stream aborted",
        )
        assert rejections(client, sc, "write_timeout") == 1
        assert client.post(f"{sc.url}/v1/completions", json=completion()).status_code == 200


def test_early_refusal_with_a_body_pending_still_reaches_the_client(engine, sidecar_factory):
    # A 413 decided from Content-Length while the client is still sending: the client reads the
    # answer (lingering close), not a connection reset.
    with sidecar_factory(engine.url, PALMYRA_MAX_BODY_BYTES="1000") as sc:
        with socket.create_connection(("127.0.0.1", sc.port), timeout=10) as s:
            s.sendall(
                b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                b"Content-Length: 50000000\r\n\r\n" + b"x" * 200000
            )
            answer = s.recv(4096)
        assert answer.startswith(b"HTTP/1.1 413"), answer[:200]


def test_a_refusal_before_the_body_says_the_connection_closes(engine, sidecar_factory):
    """A 401 sent while the request's body is still on its way: the front end then closes the
    connection, so the response must say `Connection: close`; otherwise a keep-alive client sends
    its next request into the closing connection (seen in CI: "Server disconnected without sending
    a response"). A refusal of a request without a body keeps the connection."""
    with sidecar_factory(engine.url, PALMYRA_API_KEYS="sk-edge-test-key-0123456789abcdef") as sc:
        body = b'{"model": "palmyra-mini", "prompt": "hi", "max_tokens": 2}'
        head = (
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer wrong\r\n"
            b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body)
        )
        with socket.create_connection(("127.0.0.1", sc.port), timeout=10) as s:
            s.sendall(head)  # the body is held back until the answer is in
            answer = s.recv(65536)
            s.sendall(body)
        assert answer.startswith(b"HTTP/1.1 401"), answer[:200]
        assert b"\r\nconnection: close" in answer.partition(b"\r\n\r\n")[0].lower(), answer[:400]
        answer = raw_exchange(sc.port, b"GET /v1/models HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer wrong\r\n\r\n")
        assert answer.startswith(b"HTTP/1.1 401"), answer[:200]
        assert b"connection: close" not in answer.partition(b"\r\n\r\n")[0].lower(), answer[:400]


# --- request cost -----------------------------------------------------------------------------

COST_CASES = [
    ({"max_tokens": "600"}, 400, "max_tokens_too_large"),
    ({"max_tokens": 600.0}, 400, "max_tokens_too_large"),
    ({"max_tokens": 6e2}, 400, "max_tokens_too_large"),
    ({"max_tokens": "6e2"}, 400, "invalid_parameter"),  # pydantic (and so vLLM) refuses it too
    ({"max_tokens": 4.5}, 400, "invalid_parameter"),
    ({"max_completion_tokens": "513"}, 400, "unknown_parameter"),  # chat's field: completions have none
    ({"min_tokens": 10**6}, 400, "max_tokens_too_large"),
    ({"n": 16384}, 400, "parameter_too_large"),
    ({"n": "9"}, 400, "parameter_too_large"),
    ({"n": 0}, 400, "invalid_parameter"),
    ({"best_of": 100}, 400, "unknown_parameter"),  # neither engine's model has it any more
    ({"logprobs": 21}, 400, "parameter_too_large"),
    ({"logprobs": -1}, 400, "invalid_parameter"),
    ({"prompt_logprobs": "50"}, 400, "parameter_too_large"),
    ({"prompt": ["a"] * 9}, 400, "parameter_too_large"),
    ({"prompt": ["a"] * 4, "n": 3}, 400, "parameter_too_large"),
    ({"max_tokens": "512"}, 200, None),
    ({"n": "2", "max_tokens": 3.0}, 200, None),
    ({"prompt": [[1, 2], [3, 4]], "n": 4}, 200, None),
    ({"prompt": [1, 2, 3], "n": 8}, 200, None),
]


@pytest.fixture
def capped(engine, sidecar_factory):
    with sidecar_factory(engine.url, PALMYRA_MAX_MODEL_LEN="512") as sc:
        yield sc


@pytest.mark.parametrize(("extra", "status", "code"), COST_CASES, ids=[json.dumps(c[0])[:40] for c in COST_CASES])
def test_request_cost_on_the_values_vllm_uses(capped, client, extra, status, code):
    resp = client.post(f"{capped.url}/v1/completions", json={**completion(), **extra})
    if code is None:
        assert resp.status_code == status, resp.text
    else:
        err = assert_openai_error(resp, status, code)
        assert err["param"] in extra or err["param"] in ("prompt", "max_tokens")


def test_chat_roles_outside_the_schema_are_refused(capped, client):
    def chat(*roles: object) -> dict:
        return {"model": "palmyra-mini", "max_tokens": 2, "messages": [{"role": r, "content": "hi"} for r in roles]}

    for bad in ("wizard", "System", "", None, 3, ["user"]):
        err = assert_openai_error(client.post(f"{capped.url}/v1/chat/completions", json=chat("user", bad)), 400)
        assert err["code"] == "invalid_role" and err["param"] == "messages"
    ok = client.post(f"{capped.url}/v1/chat/completions", json=chat("system", "developer", "user", "assistant", "user"))
    assert ok.status_code == 200
    assert_openai_error(
        client.post(f"{capped.url}/v1/chat/completions", json={"model": "palmyra-mini", "messages": "hi"}),
        400,
        "invalid_parameter",
    )
    assert rejections(client, capped, "invalid_role") == 6


# --- auth fails closed ------------------------------------------------------------------------


def start_refused(log_dir: Path, **env: str) -> str:
    port = procs.free_port()
    log_path = log_dir / f"refused-{port}.log"
    base = {
        "PALMYRA_PORT": str(port),
        "PALMYRA_HOST": "127.0.0.1",
        "PALMYRA_ENGINE_URL": "http://127.0.0.1:9",
        "PALMYRA_API_KEYS": "",
        "PALMYRA_AUTH_DISABLED": "false",
    }
    proc = procs.spawn([procs.PALMYRA, "sidecar"], log_path, {**base, **env})
    try:
        assert proc.wait(timeout=30) == 2
    finally:
        procs.stop(proc)
    return log_path.read_text()


def test_auth_refuses_to_start_open_or_with_placeholder_keys(log_dir, tmp_path):
    assert "PALMYRA_AUTH_DISABLED=true" in start_refused(log_dir)
    comments = tmp_path / "keys"
    comments.write_text("# rotated 2026-12\n\n   \n# nothing yet\n")
    assert "holds no key" in start_refused(log_dir, PALMYRA_API_KEYS_FILE=str(comments))
    for placeholder in ("changeme", "change-me-client-key", "replace-me", "short"):
        assert "placeholder" in start_refused(log_dir, PALMYRA_API_KEYS=placeholder)
    placeholder_file = tmp_path / "placeholder"
    placeholder_file.write_text("replace-me\n")
    assert "placeholder" in start_refused(log_dir, PALMYRA_API_KEYS_FILE=str(placeholder_file))
    # The engine key is held to the same rule (Compose's env files once shipped this one); a real
    # client key, so the engine key is the only reason left to refuse.
    refused = start_refused(
        log_dir, PALMYRA_API_KEYS="a-real-client-key-123", PALMYRA_ENGINE_API_KEY="change-me-engine-key"
    )
    assert "engine key (PALMYRA_ENGINE_API_KEY) is a placeholder" in refused
    assert "change-me-engine-key" not in refused  # the value itself is never logged


def test_keys_reload_when_the_file_changes(engine, sidecar_factory, client, tmp_path):
    keyfile = tmp_path / "keys"
    keyfile.write_text("first-key-123456\n")
    with sidecar_factory(engine.url, PALMYRA_API_KEYS_FILE=str(keyfile), PALMYRA_AUTH_DISABLED="false") as sc:

        def status(key: str) -> int:
            return client.get(f"{sc.url}/v1/models", headers={"Authorization": f"Bearer {key}"}).status_code

        assert status("first-key-123456") == 200 and status("second-key-123456") == 401
        keyfile.write_text("# rotated\nsecond-key-123456\n")
        t0 = time.monotonic()
        wait_until(lambda: status("second-key-123456") == 200, timeout_s=5, what="the new key accepted")
        print(f"key rotation picked up after {time.monotonic() - t0:.2f} s")
        assert status("first-key-123456") == 401
        keyfile.write_text("# emptied by mistake\n")  # unusable: the previous keys stay in force
        # The file is checked from the request path (at most once a second): requests drive it,
        # and the sidecar logs when it found the new file unusable.
        wait_until(
            lambda: status("second-key-123456") == 200 and "unusable" in sc.log(),
            timeout_s=5,
            what="the sidecar to read the emptied key file and log it unusable",
        )
        assert status("second-key-123456") == 200


def test_bodies_held_before_admission_are_capped_over_all_connections(engine, sidecar_factory, client):
    # Bodies are read before a slot is taken, so the cap is on bytes held over all connections:
    # (in flight + queue) x body cap = 2 x 1000 bytes here (fixed mode: in flight is max_in_flight;
    # adaptive would count its ceiling, tests/unit/test_memory_budget.py).
    with sidecar_factory(
        engine.url,
        PALMYRA_ADMISSION_MODE="fixed",
        PALMYRA_MAX_IN_FLIGHT="1",
        PALMYRA_MAX_QUEUE="1",
        PALMYRA_MAX_BODY_BYTES="1000",
    ) as sc:
        head = (
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: 1000\r\n\r\n"
        )
        slow = [socket.create_connection(("127.0.0.1", sc.port), timeout=10) for _ in range(3)]
        try:
            for s in slow[:2]:
                s.sendall(head + b" " * 900)  # held, never completed
            # The sidecar reads sockets in the order data arrives: the first two are held by now
            # (a round trip on another connection proves the loop has passed them).
            assert client.get(f"{sc.url}/health/sidecar").status_code == 200
            slow[2].sendall(head + b" " * 900)
            # The head and the body of the answer may arrive in separate reads.
            answer = slow[2].recv(4096)
            while b"bodies_over_budget" not in answer and (more := slow[2].recv(4096)):
                answer += more
            assert answer.startswith(b"HTTP/1.1 503"), answer[:200]
            assert b"bodies_over_budget" in answer
        finally:
            for s in slow:
                s.close()
        wait_until(
            lambda: client.post(f"{sc.url}/v1/completions", json=completion()).status_code == 200,
            timeout_s=5,
            what="bodies released once their connections closed",
        )
