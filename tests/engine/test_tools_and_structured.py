"""Tool calling and structured output as today's OpenAI SDK clients use them, through the sidecar,
on the engine the service starts (hermes tool parser, xgrammar without free whitespace): on vLLM
0.32 here and on 0.18.0 in the vllm018 tier. The stand-in's weights are random, so the claims are
the ones a grammar makes true whatever the weights: a named tool choice returns a call of that tool
with JSON arguments (what they hold is the model's: with the hermes parser vLLM does not hold them
to the tool's schema, and the random stand-in writes `true`); `required` and `auto` are served;
`parse` with a two-value schema finishes well inside its token budget."""

from __future__ import annotations

import json

import openai
import pytest

from tests.helpers.api import ASK, MODEL, WEATHER, Verdict

pytestmark = pytest.mark.engine_contract


@pytest.fixture(scope="module")
def sdk(sidecar_server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{sidecar_server.url}/v1", api_key="unused", max_retries=0)


def test_a_named_tool_choice_returns_a_call_of_that_tool_with_json_arguments(sdk):
    resp = sdk.chat.completions.create(
        model=MODEL,
        messages=ASK,
        tools=[WEATHER],
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
        max_tokens=48,
        temperature=0,
    )
    (call,) = resp.choices[0].message.tool_calls
    assert call.function.name == "get_weather"
    json.loads(call.function.arguments)  # JSON, whatever it holds


def test_required_tool_choice_is_served(sdk):
    resp = sdk.chat.completions.create(
        model=MODEL, messages=ASK, tools=[WEATHER], tool_choice="required", max_tokens=32, temperature=0
    )
    assert resp.choices[0].finish_reason in ("stop", "length", "tool_calls")


def test_auto_tool_choice_is_served_and_a_tool_result_round_trip_too(sdk):
    auto = sdk.chat.completions.create(model=MODEL, messages=ASK, tools=[WEATHER], tool_choice="auto", max_tokens=16)
    assert auto.choices[0].finish_reason in ("stop", "length", "tool_calls")
    call = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    follow = sdk.chat.completions.create(
        model=MODEL,
        messages=[
            *ASK,
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21 C"},
        ],
        tools=[WEATHER],
        max_tokens=16,
    )
    assert follow.usage is not None and follow.usage.completion_tokens > 0


def test_parse_with_a_strict_two_value_schema_completes(sdk):
    """Without compact JSON the random stand-in filled the schema's whitespace until the budget ran
    out (the SDK's LengthFinishReasonError)."""
    resp = sdk.chat.completions.parse(
        model=MODEL,
        messages=[{"role": "user", "content": "Is water wet? Answer yes or no."}],
        response_format=Verdict,
        max_tokens=32,
    )
    parsed = resp.choices[0].message.parsed
    assert parsed is not None and parsed.answer in ("yes", "no")
    assert resp.usage is not None and resp.usage.completion_tokens < 32
