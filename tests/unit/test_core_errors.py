"""The error vocabulary as clients and dashboards see it, spelled out: each error's status, type
and code, the series /metrics shows from the first scrape, and the code of each failure talking
to the engine. Literals on purpose: they are the contract errors.ErrorCode must keep. Then an
engine's error bodies (errors.from_engine): rebuilt in OpenAI's shape, and a 5xx's text never
reaching the client."""

from __future__ import annotations

import json
import re

import aiohttp
import pytest
from multidict import CIMultiDict, CIMultiDictProxy
from prometheus_client import generate_latest
from yarl import URL

from palmyra_serve.sidecar.core import engine_errors, errors
from palmyra_serve.sidecar.core.metrics import SidecarMetrics
from palmyra_serve.sidecar.upstream.failures import (
    UPSTREAM_FAILURES,
    ConnectFailed,
    PageTooLarge,
    StreamInterrupted,
    UpstreamError,
    UpstreamTimeout,
    code_of,
)

ERRORS = [
    (errors.internal_error("r"), 500, "server_error", "internal_error"),
    (errors.unauthorized(), 401, "authentication_error", "invalid_api_key"),
    (errors.body_too_large(1), 413, "invalid_request_error", "request_too_large"),
    (errors.body_timeout(), 408, "invalid_request_error", "request_timeout"),
    (errors.max_tokens_too_large(2, 1, "max_tokens"), 400, "invalid_request_error", "max_tokens_too_large"),
    (errors.invalid_json(), 400, "invalid_request_error", "invalid_json"),
    (errors.queue_full(1), 429, "rate_limit_error", "queue_full"),
    (errors.queue_timeout(1), 429, "rate_limit_error", "queue_timeout"),
    (errors.slo_unreachable(1), 429, "rate_limit_error", "slo_unreachable"),
    (errors.draining(1), 503, "service_unavailable", "draining"),
    (errors.engine_unavailable(1), 503, "service_unavailable", "engine_unavailable"),
    (errors.engine_timeout(), 504, "timeout", "engine_timeout"),
    (errors.bad_upstream(), 502, "bad_gateway", "bad_upstream"),
    (errors.stream_interrupted(), 502, "bad_gateway", "stream_interrupted"),
    (errors.not_found("GET", "/x"), 404, "invalid_request_error", "not_found"),
    (errors.not_a_probe_path("GET", "/x", "/ready"), 404, "invalid_request_error", "not_found"),
    (errors.method_not_allowed("GET", "/x", "POST"), 405, "invalid_request_error", "method_not_allowed"),
    (errors.upgrade_refused(), 400, "invalid_request_error", "upgrade_not_supported"),
    (errors.invalid_parameter("n", "bad"), 400, "invalid_request_error", "invalid_parameter"),
    (errors.parameter_too_large("n", 2, 1), 400, "invalid_request_error", "parameter_too_large"),
    (errors.invalid_role("x", "user"), 400, "invalid_request_error", "invalid_role"),
    (errors.bodies_over_budget(1), 503, "service_unavailable", "bodies_over_budget"),
    (errors.header_too_large(1), 431, "invalid_request_error", "header_too_large"),
    (errors.chunk_framing_too_large(1), 431, "invalid_request_error", "header_too_large"),
    (errors.request_line_too_long(1), 414, "invalid_request_error", "uri_too_long"),
    (errors.too_many_connections(1), 503, "service_unavailable", "too_many_connections"),
    (errors.header_timeout(1), 408, "invalid_request_error", "header_timeout"),
    (errors.write_timeout(1), 408, "invalid_request_error", "write_timeout"),
    (
        errors.over_quota(errors.ErrorCode.RATE_LIMIT_REQUESTS, "t", 5, 3),
        429,
        "rate_limit_error",
        "rate_limit_requests",
    ),
    (errors.over_quota(errors.ErrorCode.RATE_LIMIT_TOKENS, "t", 5, 3), 429, "rate_limit_error", "rate_limit_tokens"),
    (errors.over_quota(errors.ErrorCode.TENANT_CONCURRENCY, "t", 5, 1), 429, "rate_limit_error", "tenant_concurrency"),
]


@pytest.mark.parametrize(("exc", "status", "kind", "code"), ERRORS, ids=[row[3] for row in ERRORS])
def test_each_error_keeps_its_status_type_and_code(exc: errors.ApiError, status: int, kind: str, code: str) -> None:
    assert (exc.status, exc.type, exc.code) == (status, kind, code)
    body = json.loads(exc.body())["error"]
    assert (body["type"], body["code"]) == (kind, code) and type(body["code"]) is str


def test_an_engine_5xx_is_engine_error_in_server_error_type() -> None:
    body = json.loads(engine_errors.from_engine(503, b"trace", "Service Unavailable", "rid"))["error"]
    assert (body["type"], body["code"]) == ("server_error", "engine_error")


def _series(page: str, metric: str, label: str) -> list[str]:
    return re.findall(rf'^{metric}\{{{label}="([^"]+)"\}}', page, re.MULTILINE)


def test_a_fresh_metrics_page_has_every_reason_kind_and_route_in_order() -> None:
    page = generate_latest(SidecarMetrics().registry).decode()
    assert _series(page, "palmyra_rejections_total", "reason") == [
        "queue_full",
        "queue_timeout",
        "slo_unreachable",
        "rate_limit_requests",
        "rate_limit_tokens",
        "tenant_concurrency",
        "request_too_large",
        "request_timeout",
        "max_tokens_too_large",
        "invalid_json",
        "draining",
        "invalid_api_key",
    ]
    assert _series(page, "palmyra_upstream_errors_total", "kind") == [
        "engine_unavailable",
        "engine_timeout",
        "bad_upstream",
        "stream_interrupted",
    ]
    assert _series(page, "palmyra_output_tokens_total", "route") == [
        "completions",
        "chat_completions",
        "responses",
        "messages",
        "models",
        "tokenize",
        "other",
    ]


def test_a_front_end_refusal_counts_under_its_code_on_first_use() -> None:
    metrics = SidecarMetrics()
    metrics.reject(errors.header_too_large(1).code)
    page = generate_latest(metrics.registry).decode()
    assert 'palmyra_rejections_total{reason="header_too_large"} 1.0' in page


def _response_error() -> aiohttp.ClientResponseError:
    url = URL("http://engine/metrics")
    return aiohttp.ClientResponseError(
        aiohttp.RequestInfo(url, "GET", CIMultiDictProxy(CIMultiDict()), url), (), status=500
    )


FAILURES = [
    (ConnectFailed("refused"), "engine_unavailable"),
    (UpstreamTimeout("silent"), "engine_timeout"),
    (StreamInterrupted("closed mid-body"), "stream_interrupted"),
    (UpstreamError("not HTTP"), "bad_upstream"),
    (PageTooLarge("big"), "bad_upstream"),
    (TimeoutError(), "engine_timeout"),
    (aiohttp.ServerTimeoutError("read"), "engine_timeout"),  # a ClientError and a TimeoutError both
    (_response_error(), "bad_upstream"),
    (aiohttp.ClientConnectionError("refused"), "engine_unavailable"),
    (aiohttp.ClientPayloadError("cut"), "engine_unavailable"),
    (ConnectionRefusedError(), "engine_unavailable"),
]


@pytest.mark.parametrize(("exc", "code"), FAILURES, ids=[type(row[0]).__name__ for row in FAILURES])
def test_each_failure_talking_to_the_engine_has_its_code(exc: BaseException, code: str) -> None:
    assert isinstance(exc, UPSTREAM_FAILURES)
    assert code_of(exc) == code
    if isinstance(exc, UpstreamError):
        assert exc.code == code
    assert errors.upstream(code_of(exc), 3).code == code


def test_anything_else_is_not_named_an_engine_failure() -> None:
    with pytest.raises(TypeError):
        code_of(ValueError("a bug, not the engine"))


def test_engine_error_bodies_are_rebuilt_in_openai_shape_and_5xx_text_never_reaches_the_client():
    import orjson

    from palmyra_serve.sidecar.core.engine_errors import MAX_CLIENT_MESSAGE, from_engine

    shaped = b'{"error": {"message": "bad", "type": "BadRequestError", "param": "n", "code": 400, "extra": 1}}'
    assert orjson.loads(from_engine(400, shaped, "Bad Request", "rid"))["error"] == {
        "message": "bad",
        "type": "BadRequestError",
        "param": "n",
        "code": 400,
    }, "only OpenAI's four fields"
    for status, body, message in (
        (404, b'{"detail":"Not Found"}', "Not Found"),
        (401, b'{"error":"Unauthorized"}', "Unauthorized"),
        (400, b'{"detail":[{"msg":"bad utf-8"}]}', '[{"msg":"bad utf-8"}]'),
        (405, b"", "Method Not Allowed"),
    ):
        err = orjson.loads(from_engine(status, body, message if not body else "x", "rid"))["error"]
        assert err["message"] == message and err["code"] == status and err["param"] is None
        assert err["type"] == "invalid_request_error"
    long = orjson.dumps({"error": {"message": "m" * 10_000, "code": 400}})
    assert len(orjson.loads(from_engine(400, long, "x", "rid"))["error"]["message"]) == MAX_CLIENT_MESSAGE
    # A 5xx's text (here a traceback holding a token) stays in the log: the client gets the request id.
    secret = b'{"error": {"message": "Traceback ... api_key=sk-live-123", "code": 500}}'
    for status, body in ((500, secret), (502, b"<html>bad gateway</html>"), (503, b"")):
        err = orjson.loads(from_engine(status, body, "x", "req-7"))["error"]
        assert "sk-live" not in err["message"] and "html" not in err["message"] and "req-7" in err["message"]
        assert (err["type"], err["code"]) == ("server_error", "engine_error")
