"""The tools' view of an OpenAI-compatible endpoint: /v1/models, errors, SSE, token ids."""

from __future__ import annotations

import pytest

from palmyra_serve.tools import endpoint
from palmyra_serve.tools.endpoint import EndpointError


def test_parse_models_reads_max_model_len_of_the_wanted_model() -> None:
    body = {"data": [{"id": "other", "max_model_len": 10}, {"id": "palmyra-mini", "max_model_len": 8192}]}
    info = endpoint.parse_models(body, "palmyra-mini")
    assert (info.id, info.max_model_len) == ("palmyra-mini", 8192)


def test_parse_models_without_max_model_len_and_unknown_name() -> None:
    assert endpoint.parse_models({"data": [{"id": "x"}]}, None).max_model_len is None
    with pytest.raises(EndpointError, match="not served"):
        endpoint.parse_models({"data": [{"id": "x"}]}, "palmyra-mini")
    with pytest.raises(EndpointError, match="no model"):
        endpoint.parse_models({"data": []}, None)


def test_check_response_surfaces_openai_error_message() -> None:
    assert endpoint.check_response(200, '{"a": 1}') == {"a": 1}
    with pytest.raises(EndpointError, match="HTTP 401: bad key"):
        endpoint.check_response(401, '{"error": {"message": "bad key", "type": "auth"}}')
    with pytest.raises(EndpointError, match="unreadable"):
        endpoint.check_response(502, "<html>")


def test_sse_events_stop_at_done_and_raise_on_error_events() -> None:
    lines = ["", 'data: {"x": 1}', ": comment", "data: [DONE]", 'data: {"x": 2}']
    assert list(endpoint.sse_events(iter(lines))) == [{"x": 1}]
    with pytest.raises(EndpointError, match="stream error"):
        list(endpoint.sse_events(iter(['data: {"error": {"message": "boom"}}'])))


def test_token_id_exact_and_fallback() -> None:
    assert endpoint.token_id("token_id:151642") == 151642

    class Tok:
        def encode(self, text, add_special_tokens=False):
            return {"a": [5], "ab": [5, 6]}[text]

    assert endpoint.token_id("a", Tok()) == 5
    assert endpoint.token_id("ab", Tok()) is None
    assert endpoint.token_id("a") is None


def test_headers_carry_the_key_only_when_given() -> None:
    assert "Authorization" not in endpoint.headers(None)
    assert endpoint.headers("k")["Authorization"] == "Bearer k"
