"""API keys on the real sidecar in front of the real engine: every relayed route refuses a missing,
wrong or prefix-of-valid key with an OpenAI-shaped 401; health, readiness and metrics stay open;
the keys never show up in the sidecar's logs or metrics."""

from __future__ import annotations

import secrets
from collections.abc import Iterator

import httpx
import pytest

from tests.helpers import procs
from tests.helpers.api import completion, plain_client
from tests.helpers.reliability import FAST, figure

pytestmark = pytest.mark.engine_contract  # also run against vLLM 0.18.0 (the vllm018 tier)

KEY_A = "sk-palmyra-" + secrets.token_hex(16)
KEY_B = "sk-palmyra-" + secrets.token_hex(16)

ROUTES = [
    ("POST", "/v1/completions", completion(max_tokens=2)),
    (
        "POST",
        "/v1/chat/completions",
        {"model": "palmyra-mini", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
    ),
    ("GET", "/v1/models", None),
    ("POST", "/tokenize", {"model": "palmyra-mini", "prompt": "hi"}),
    ("POST", "/detokenize", {"model": "palmyra-mini", "tokens": [9707]}),
]
BAD_AUTH = {
    "missing": None,
    "scheme without a key": "Bearer",
    "wrong": "Bearer sk-palmyra-" + secrets.token_hex(16),
    "prefix of a valid key": f"Bearer {KEY_A[:-1]}",
    "valid key plus a suffix": f"Bearer {KEY_A}x",
    "valid key, other case": f"Bearer {KEY_A.upper()}",
    "valid key without Bearer": KEY_A,
    "valid key as Basic": f"Basic {KEY_A}",
    "the engine's own key": "Bearer engine-test-key",
}


@pytest.fixture(scope="module")
def sidecar(engine_server, log_dir) -> Iterator[procs.Server]:
    env = {**FAST, "PALMYRA_API_KEYS": f"{KEY_A},{KEY_B}", "PALMYRA_LOG_LEVEL": "debug"}
    with procs.sidecar(engine_server.url, log_dir, engine_api_key=engine_server.api_key, extra_env=env) as server:
        yield server


def call(client: httpx.Client, url: str, method: str, path: str, body: dict | None, auth: str | None):
    headers = {"Authorization": auth} if auth is not None else {}
    return client.request(method, f"{url}{path}", json=body, headers=headers)


def test_every_relayed_route_refuses_bad_keys_with_401(sidecar):
    refused = 0
    with plain_client(timeout=30) as client:
        for what, auth in BAD_AUTH.items():
            for method, path, body in ROUTES:
                resp = call(client, sidecar.url, method, path, body, auth)
                assert resp.status_code == 401, (what, path, resp.status_code, resp.text[:200])
                err = resp.json()["error"]
                assert err["code"] == "invalid_api_key" and err["type"] == "authentication_error" and err["message"]
                refused += 1
        for key in (KEY_A, KEY_B):
            ok = call(client, sidecar.url, "POST", "/v1/completions", completion(max_tokens=3), f"Bearer {key}")
            assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] == 3, ok.text
        models = call(client, sidecar.url, "GET", "/v1/models", None, f"bearer {KEY_B}")
        assert models.status_code == 200  # the scheme is case-insensitive, the key is not
        for path in ("/health", "/health/sidecar", "/ready", "/metrics", "/engine/metrics"):
            assert client.get(f"{sidecar.url}{path}").status_code == 200, path
        # The API document lists the routes: it asks for a key like them.
        assert client.get(f"{sidecar.url}/openapi.json").status_code == 401
        assert (
            client.get(f"{sidecar.url}/openapi.json", headers={"Authorization": f"Bearer {KEY_A}"}).status_code == 200
        )
        metrics = client.get(f"{sidecar.url}/metrics").text
    counted = sum(
        float(line.rsplit(" ", 1)[1])
        for line in metrics.splitlines()
        if line.startswith('palmyra_rejections_total{reason="invalid_api_key"}')
    )
    assert counted == refused
    # Off the allow-list: a 401 without a key (nothing about the routes is revealed before it), a
    # 404 with one; it never reaches the engine either way.
    with plain_client(timeout=30) as client:
        for path in ("/v1/embeddings", "/v1/does-not-exist", "/invocations"):
            for auth, status, code in ((None, 401, "invalid_api_key"), (f"Bearer {KEY_A}", 404, "not_found")):
                resp = call(client, sidecar.url, "POST", path, {"model": "palmyra-mini", "input": "hi"}, auth)
                assert resp.status_code == status and resp.json()["error"]["code"] == code, (path, resp.text)
    figure("auth", refused_401=refused, routes=len(ROUTES), bad_credentials=len(BAD_AUTH), valid_keys_accepted=2)


def test_keys_never_appear_in_logs_or_metrics(sidecar):
    with plain_client(timeout=30) as client:
        for key in (KEY_A, KEY_B):
            call(client, sidecar.url, "POST", "/v1/completions", completion(max_tokens=1), f"Bearer {key}")
            call(client, sidecar.url, "POST", "/v1/completions", completion(max_tokens=1), f"Bearer {key[:-2]}")
        exposed = sidecar.log() + client.get(f"{sidecar.url}/metrics").text
    assert "request" in sidecar.log(), "the access log must have been captured for this check to mean anything"
    for secret in (KEY_A, KEY_B, KEY_A[:-2], KEY_B[:-2], KEY_A[11:], KEY_B[11:]):
        assert secret not in exposed
