"""The Responses and Messages APIs on the real sidecar, in front of the fake engine (which answers them
in their shapes, usage unasked, tests/helpers/fake_engine.py): tenants pay the engine's usage on
both, streamed or not; a report the accounting cannot hold costs the whole reservation; the Anthropic
SDK's key header works and its errors come in its shape; a client that leaves aborts the
generation; what the Messages API cannot carry (a private tenant's cache salt on an engine that
does not say it can, a tenant's priority) is refused with the reason."""

from __future__ import annotations

import json
import socket
from functools import partial
from pathlib import Path

import httpx

from palmyra_serve.sidecar.tenants.config import key_digest
from tests.helpers.api import assert_openai_error, metric_value, raw_json_post
from tests.helpers.waiting import wait_until

PRIVATE_KEY = "team-private-key-0123456789"
SHARED_KEY = "team-shared-key-0123456789"


def _tenants(tmp_path: Path, extra: str = "") -> Path:
    path = tmp_path / "tenants.yaml"
    path.write_text(
        "tenants:\n"
        f"  - name: private\n    keys: ['{key_digest(PRIVATE_KEY)}']\n    tokens_per_minute: 1000\n{extra}"
        f"  - name: shared\n    keys: ['{key_digest(SHARED_KEY)}']\n    tokens_per_minute: 100000\n"
        "    prefix_cache: shared\n"
    )
    return path


def _anthropic_error(resp: httpx.Response, status: int) -> dict:
    assert resp.status_code == status, resp.text
    body = resp.json()
    assert body["type"] == "error" and set(body["error"]) == {"type", "message"} and body["request_id"]
    return body["error"]


def _stats(client: httpx.Client, engine) -> dict:
    return client.get(f"{engine.url}/fake/stats").json()


def _access_log(sidecar) -> list[dict]:
    return [json.loads(line) for line in sidecar.log().splitlines() if '"palmyra.access"' in line]


def test_tenants_pay_the_engines_usage_on_both_routes_streamed_and_not(engine, sidecar_factory, client, tmp_path):
    with sidecar_factory(engine.url, probe=True, PALMYRA_TENANTS_FILE=str(_tenants(tmp_path))) as sc:
        bearer = {"Authorization": f"Bearer {SHARED_KEY}"}
        anthropic = {"x-api-key": SHARED_KEY, "anthropic-version": "2023-06-01"}
        calls = [
            ("/v1/responses", bearer, {"model": "m", "input": "hi", "max_output_tokens": 4, "store": True}),
            ("/v1/responses", bearer, {"model": "m", "input": "hi", "max_output_tokens": 5, "stream": "true"}),
            (
                "/v1/messages",
                anthropic,
                {"model": "m", "max_tokens": 6, "messages": [{"role": "user", "content": "hi"}]},
            ),
            (
                "/v1/messages",
                anthropic,
                {"model": "m", "max_tokens": 7, "stream": True, "messages": [{"role": "user", "content": "hi"}]},
            ),
        ]
        for path, headers, body in calls:
            resp = client.post(f"{sc.url}{path}", headers=headers, json=body)
            assert resp.status_code == 200, resp.text
            assert resp.headers["x-ratelimit-limit-tokens"] == "100000"
        sent = _stats(client, engine)["bodies"][-4:]
        assert [b.get("store") for b in sent[:2]] == [False, False]  # stateless, whatever the client asked
        assert sent[1]["stream"] is True and "stream_options" not in sent[1]  # its usage comes unasked
        assert all("cache_salt" not in b for b in sent)  # a shared tenant: no salt
        tokens = 'palmyra_tenant_tokens_total{kind="%s",tenant="shared"}'
        assert metric_value(client, sc.probe_url, tokens % "completion") == 4 + 5 + 6 + 7
        assert metric_value(client, sc.probe_url, tokens % "prompt") == 4 * 3
        for route in ("responses", "messages"):
            assert metric_value(client, sc.url, f'palmyra_output_tokens_total{{route="{route}"}}') > 0

        # A private tenant among others, on an engine that does not say it carries the salt.
        private = client.post(
            f"{sc.url}/v1/messages",
            headers={"x-api-key": PRIVATE_KEY},
            json={"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]},
        )
        assert "prefix cache" in _anthropic_error(private, 400)["message"]
        salted = client.post(
            f"{sc.url}/v1/responses", headers={"Authorization": f"Bearer {PRIVATE_KEY}"}, json=calls[0][2]
        )
        assert salted.status_code == 200 and len(_stats(client, engine)["bodies"][-1]["cache_salt"]) == 32


def test_a_report_the_accounting_cannot_hold_costs_the_whole_reservation(engine, sidecar_factory, client, tmp_path):
    """The fake engine answers one token but echoes 100 KB before its usage: the relay cannot read the
    report, so the tenant pays what it reserved (500 + its prompt), and its next 600 do not fit its
    1000 a minute. Charged by the unreadable report's absence, it would have paid its prompt only."""
    with sidecar_factory(engine.url, PALMYRA_TENANTS_FILE=str(_tenants(tmp_path))) as sc:
        headers = {"Authorization": f"Bearer {PRIVATE_KEY}"}
        echo = client.post(
            f"{sc.url}/v1/responses",
            headers=headers,
            json={"model": "m", "input": "fake:echo", "max_output_tokens": 500},
        )
        assert echo.status_code == 200 and len(echo.content) > 100_000
        logged = wait_until(lambda: [r for r in _access_log(sc) if r.get("usage_missing")], 10, "usage_missing logged")
        assert logged[-1]["route"] == "responses"
        after = client.post(
            f"{sc.url}/v1/responses", headers=headers, json={"model": "m", "input": "hi", "max_output_tokens": 600}
        )
        assert_openai_error(after, 429, "rate_limit_tokens")


def test_errors_come_in_each_apis_shape_and_what_messages_cannot_carry_is_refused(
    engine, sidecar_factory, client, tmp_path
):
    path = _tenants(tmp_path, "    priority: 5\n    prefix_cache: shared\n")
    with sidecar_factory(engine.url, PALMYRA_TENANTS_FILE=str(path), PALMYRA_PRIORITY_SCHEDULING="true") as sc:
        user = [{"role": "user", "content": "hi"}]
        assert _anthropic_error(client.post(f"{sc.url}/v1/messages", headers={"x-api-key": "wrong"}, json={}), 401) == {
            "type": "authentication_error",
            "message": _anthropic_error(client.post(f"{sc.url}/v1/messages", json={}), 401)["message"],
        }
        unknown = client.post(
            f"{sc.url}/v1/messages",
            headers={"x-api-key": SHARED_KEY},
            json={"model": "m", "max_tokens": 4, "messages": user, "mcp_servers": []},
        )
        assert _anthropic_error(unknown, 400)["type"] == "invalid_request_error"
        stored = client.post(
            f"{sc.url}/v1/responses",
            headers={"Authorization": f"Bearer {SHARED_KEY}"},
            json={"model": "m", "input": "hi", "previous_response_id": "resp_1"},
        )
        assert "keeps no responses" in assert_openai_error(stored, 400, "unsupported_parameter")["message"]
        ranked = client.post(
            f"{sc.url}/v1/messages",
            headers={"x-api-key": PRIVATE_KEY},
            json={"model": "m", "max_tokens": 4, "messages": user},
        )
        assert "priority" in _anthropic_error(ranked, 400)["message"]
        # A stored response's own routes are not relayed: 404, never the engine's memory.
        assert client.get(f"{sc.url}/v1/responses/resp_1", headers={"x-api-key": SHARED_KEY}).status_code == 404


def test_a_client_that_leaves_aborts_the_generation_on_both_routes(engine, sidecar, client):
    bodies = {
        "/v1/responses": {"model": "m", "input": "fake:hang", "stream": True},
        "/v1/messages": {
            "model": "m",
            "max_tokens": 4,
            "stream": True,
            "messages": [{"role": "user", "content": "fake:hang"}],
        },
    }
    host, port = sidecar.url.removeprefix("http://").split(":")

    def arrived(path: str) -> bool:
        """The engine got this route's hanging request (its body, as relayed, names it)."""
        for sent in _stats(client, engine)["bodies"]:
            given = sent.get("messages", [{}])[-1].get("content") if path == "/v1/messages" else sent.get("input")
            if given == "fake:hang":
                return True
        return False

    def aborted(n: int) -> bool:
        return _stats(client, engine)["aborted"] >= n

    for path, body in bodies.items():
        before = _stats(client, engine)["aborted"]
        with socket.create_connection((host, int(port)), timeout=10) as sock:
            sock.sendall(raw_json_post(path, body))
            wait_until(partial(arrived, path), 10, f"{path} reached the engine")
        wait_until(partial(aborted, before + 1), 10, f"the engine aborted {path}")

    def left() -> list[int]:
        return [r["status"] for r in _access_log(sidecar) if r["route"] in ("responses", "messages")]

    assert wait_until(lambda: left() == [499, 499] and left(), 10, "both logged as a client that left")
