"""The Responses and Messages APIs' fields (policy/conversation.py, their tables in fields.py): text in,
function tools only, stateless; their prompts and reservations estimated like chat's; their errors
in their own shapes (error_shapes.py)."""

from __future__ import annotations

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from palmyra_serve.sidecar.core import engine_errors, errors
from palmyra_serve.sidecar.core.prompt import messages_prompt, responses_prompt
from palmyra_serve.sidecar.core.routes import RELAYED, Api
from palmyra_serve.sidecar.policy import checks, structured
from palmyra_serve.sidecar.policy.inspect import inspect
from palmyra_serve.sidecar.policy.tables import BY_TARGET
from palmyra_serve.sidecar.tenants.reservation import demand

LIMITS = checks.Limits(
    max_tokens=2048,
    max_choices=8,
    max_logprobs=20,
    prompt_logprobs_max_tokens=512,
    structured=structured.StructuredLimits(max_bytes=16384, max_repeat=64, max_choices=1024, regex_and_grammar=True),
)
USER = [{"role": "user", "content": "hi"}]


def _check(path: str, payload: dict):
    return inspect(payload, BY_TARGET[path.encode()], LIMITS, RELAYED[path].api)


def _refusal(path: str, payload: dict) -> errors.ApiError:
    with pytest.raises(errors.ApiError) as caught:
        _check(path, payload)
    assert caught.value.status == 400
    return caught.value


def test_the_new_routes_are_generations_with_their_own_apis():
    assert RELAYED["/v1/responses"].api is Api.RESPONSES and RELAYED["/v1/messages"].api is Api.MESSAGES
    assert RELAYED["/v1/responses"].generates and not RELAYED["/v1/responses"].chat


@pytest.mark.parametrize(
    ("field", "value", "code"),
    [
        ("previous_response_id", "resp_1", "unsupported_parameter"),
        ("background", True, "unsupported_parameter"),
        ("prompt", {"id": "pmpt_1"}, "unsupported_parameter"),
        ("conversation", "conv_1", "unsupported_parameter"),
        ("previous_input_messages", [{"role": "user", "content": "x"}], "unsupported_parameter"),
        ("kv_transfer_params", {"do_remote_prefill": True}, "unsupported_parameter"),
        ("max_output_tokens", 999_999, "max_tokens_too_large"),
        ("max_output_tokens", "-1", "invalid_parameter"),
        ("top_logprobs", 21, "parameter_too_large"),
        ("tools", [{"type": "web_search_preview"}], "unsupported_parameter"),
        ("tools", [{"type": "mcp", "server_url": "http://169.254.169.254"}], "unsupported_parameter"),
        ("input", [{"type": "item_reference", "id": "msg_1"}], "unsupported_parameter"),
        (
            "input",
            [{"role": "user", "content": [{"type": "input_image", "image_url": "http://x"}]}],
            "unsupported_parameter",
        ),
        ("input", [{"role": "god", "content": "x"}], "invalid_role"),
        ("input", 3, "invalid_parameter"),
        ("metadata", {f"k{i}": "v" for i in range(17)}, "invalid_parameter"),
        ("include", ["x" * 101], "invalid_parameter"),
        (
            "text",
            {"format": {"type": "json_schema", "schema": {"type": "string", "maxLength": 8000}}},
            "parameter_too_large",
        ),
        ("misspelt_field", 1, "unknown_parameter"),
    ],
)
def test_responses_refusals(field, value, code):
    assert _refusal("/v1/responses", {"model": "m", "input": "hi", field: value}).code == code


def test_responses_passes_what_clients_send_and_strips_what_means_nothing_here():
    payload = {
        "model": "m",
        "input": [
            {"role": "developer", "content": [{"type": "input_text", "text": "be brief"}]},
            {"type": "message", "role": "user", "content": "hi"},
            {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c1", "output": "42"},
        ],
        "instructions": "x",
        "tools": [{"type": "function", "name": "f", "parameters": {"type": "object"}}],
        "store": True,
        "stream_options": {"include_obfuscation": False},
        "prompt_cache_key": "k",
        "max_output_tokens": "16",
        "stream": "true",
    }
    seen = _check("/v1/responses", payload)
    assert seen.streams and not seen.wants_usage  # its stream reports usage unasked
    assert "stream_options" not in payload and "prompt_cache_key" not in payload and payload["stream"] is True


@pytest.mark.parametrize(
    ("field", "value", "code"),
    [
        ("messages", [{"role": "system", "content": "x"}], "invalid_role"),
        ("messages", [{"role": "user", "content": [{"type": "image", "source": {}}]}], "unsupported_parameter"),
        ("messages", [{"role": "user", "content": [{"type": "document", "source": {}}]}], "unsupported_parameter"),
        (
            "messages",
            [
                {
                    "role": "user",
                    "content": [{"type": "tool_result", "tool_use_id": "t", "content": [{"type": "image"}]}],
                }
            ],
            "unsupported_parameter",
        ),
        ("system", [{"type": "image"}], "unsupported_parameter"),
        ("max_tokens", 999_999, "max_tokens_too_large"),
        ("tools", [{"type": "web_search_20250305", "name": "web_search"}], "unsupported_parameter"),
        ("stop_sequences", ["s"] * 17, "parameter_too_large"),
        ("thinking", {"type": "enabled", "budget_tokens": 10**9}, "parameter_too_large"),
        (
            "output_config",
            {"format": {"type": "json_schema", "schema": {"pattern": "a{0,9000}"}}},
            "parameter_too_large",
        ),
        ("vllm_xargs", {"a": 1}, "unsupported_parameter"),
        ("container", "c", "unknown_parameter"),
    ],
)
def test_messages_refusals(field, value, code):
    payload = {"model": "m", "max_tokens": 8, "messages": USER, field: value}
    assert _refusal("/v1/messages", payload).code == code


def test_messages_passes_tool_use_round_trips_and_strips_the_service_tier():
    payload = {
        "model": "m",
        "max_tokens": 8,
        "system": [{"type": "text", "text": "be brief"}],
        "messages": [
            {"role": "user", "content": "weather?"},
            {
                "role": "assistant",
                "content": [{"type": "tool_use", "id": "t1", "name": "w", "input": {"city": "Oslo"}}],
            },
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "sunny"}]},
        ],
        "tools": [{"name": "w", "input_schema": {"type": "object"}}],
        "service_tier": "auto",
    }
    seen = _check("/v1/messages", payload)
    assert "service_tier" not in payload
    assert seen.extra_prompt_bytes >= len(orjson.dumps({"city": "Oslo"}))  # the tool call's input, and the tools


def test_a_tool_input_nested_past_json_encoding_is_the_clients_400():
    deep: object = 1
    for _ in range(300):
        deep = [deep]
    payload = {
        "model": "m",
        "max_tokens": 8,
        "messages": [{"role": "assistant", "content": [{"type": "tool_use", "input": deep}]}],
    }
    assert _refusal("/v1/messages", payload).code == "invalid_parameter"


def test_prompt_estimates_count_instructions_items_and_blocks():
    assert responses_prompt({"instructions": "abcd" * 10, "input": "abcd"}) == 10 + 4 + 1
    items = [
        {"role": "user", "content": [{"type": "input_text", "text": "abcd" * 3}]},
        {"type": "function_call_output", "output": "abcdabcd"},
    ]
    assert responses_prompt({"input": items}) == (4 + 3) + (4 + 2)
    blocks = [{"type": "text", "text": "abcd"}, {"type": "tool_result", "content": "abcdabcd"}]
    assert messages_prompt({"system": "abcd", "messages": [{"role": "user", "content": blocks}]}) == 1 + 4 + 1 + 2


@given(
    asked=st.integers(0, 2048),
    spell=st.sampled_from([int, str, float]),
    api=st.sampled_from([Api.RESPONSES, Api.MESSAGES]),
)
def test_the_reservation_covers_the_cap_however_it_is_spelt(asked, spell, api):
    field = "max_output_tokens" if api is Api.RESPONSES else "max_tokens"
    payload = {"input": "hi"} if api is Api.RESPONSES else {"messages": USER}
    payload[field] = spell(asked)
    assert demand(payload, api, 256, 2048).completion_tokens == asked


def test_the_reservation_defaults_when_no_cap_is_given():
    assert demand({"input": "hi"}, Api.RESPONSES, 256, 2048).completion_tokens == 256
    assert demand({"input": "hi", "ignore_eos": "true"}, Api.RESPONSES, 256, 2048).completion_tokens == 2048


def test_errors_take_the_routes_own_shape():
    exc = errors.max_tokens_too_large(9000, 2048, "max_tokens")
    anthropic = orjson.loads(exc.body_for(Api.MESSAGES, "rid"))
    assert anthropic == {
        "type": "error",
        "error": {"type": "invalid_request_error", "message": exc.message},
        "request_id": "rid",
    }
    assert orjson.loads(exc.body_for(Api.RESPONSES, "rid"))["error"]["code"] == "max_tokens_too_large"
    assert orjson.loads(errors.unauthorized().body_for(Api.MESSAGES, None))["error"]["type"] == "authentication_error"
    overloaded = errors.overloaded(errors.ErrorCode.QUEUE_FULL, 1)
    assert orjson.loads(overloaded.body_for(Api.MESSAGES, None))["error"]["type"] == "rate_limit_error"
    event = errors.stream_interrupted().sse_event(Api.MESSAGES)
    assert event.startswith(b"event: error\ndata: ") and b'"type":"api_error"' in event
    assert errors.stream_interrupted().sse_event(Api.RESPONSES).startswith(b'event: error\ndata: {"type":"error"')


def test_an_engine_error_on_the_messages_route_is_rebuilt_in_anthropics_shape():
    vllm = (
        b'{"error":{"message":"max_tokens: Field required","type":"Bad Request","param":"body.max_tokens","code":400}}'
    )
    body = orjson.loads(engine_errors.from_engine(400, vllm, "Bad Request", "rid", Api.MESSAGES))
    assert body["type"] == "error" and body["error"] == {
        "type": "invalid_request_error",
        "message": "max_tokens: Field required",
    }
    hidden = orjson.loads(engine_errors.from_engine(500, b"Traceback: secret", "err", "rid", Api.MESSAGES))
    assert hidden["error"]["type"] == "api_error" and "secret" not in hidden["error"]["message"]
