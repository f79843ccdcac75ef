"""Accounting of the Responses and Messages APIs (sidecar/relay/typed_events.py): their streams and
bodies recorded from the real engines (tests/unit/data/vllm-typed-events.json, by
tests/helpers/record_typed_events.py) give the engine's own usage under chat's names, whole and
split at any byte; a client's own `usage` keys, echoed in the response, never stand in for the
engine's; a report the accounting could not hold is missing, never guessed."""

from __future__ import annotations

import json
from pathlib import Path

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from palmyra_serve.sidecar.core.routes import Api
from palmyra_serve.sidecar.relay.sse import MAX_EVENT_BYTES
from palmyra_serve.sidecar.relay.typed_events import (
    MAX_BODY_BYTES,
    BodyUsage,
    MessagesAccount,
    ResponsesAccount,
    usage_of,
)

RECORDED = json.loads((Path(__file__).parent / "data" / "vllm-typed-events.json").read_text())["versions"]
CASES = [(version, case) for version, cases in sorted(RECORDED.items()) for case in cases]
ACCOUNTS = {"/v1/responses": ResponsesAccount, "/v1/messages": MessagesAccount}
API = {"/v1/responses": Api.RESPONSES, "/v1/messages": Api.MESSAGES}


def _stream(case: dict) -> bytes:
    return "".join(case["reads"]).encode()


def _account(path: str, reads: list[bytes]):
    acc = ACCOUNTS[path]()
    for i, chunk in enumerate(reads):
        acc.feed(chunk, 1.0 + i * 0.01)
    acc.finish()
    return acc


def test_both_engine_versions_were_recorded():
    assert {"0.32.0", "0.18.0"} <= set(RECORDED), "rerun tests/helpers/record_typed_events.py against each engine"


@pytest.mark.parametrize(("version", "case"), [c for c in CASES if c[1]["request"].get("stream")], ids=lambda c: str(c))
def test_a_recorded_stream_reports_the_engines_usage_and_its_tokens(version, case):
    acc = _account(case["path"], [r.encode() for r in case["reads"]])
    asked = case["request"].get("max_output_tokens") or case["request"].get("max_tokens")
    assert acc.usage is not None and acc.completion_tokens() == asked  # the stand-in never stops early
    assert acc.prompt_tokens() and acc.prompt_tokens() > 0
    assert 1 <= acc.token_events <= asked  # text deltas; the engine may pack several tokens in one
    assert not acc.error and acc.first_token and acc.last_token >= acc.first_token


@given(st.data())
def test_any_split_of_a_recorded_stream_accounts_the_same(data):
    _version, case = data.draw(st.sampled_from([c for c in CASES if c[1]["request"].get("stream")]))
    stream = _stream(case)
    cuts = sorted(data.draw(st.sets(st.integers(1, len(stream) - 1), max_size=8)))
    reads = [stream[a:b] for a, b in zip([0, *cuts], [*cuts, len(stream)], strict=True)]
    whole = _account(case["path"], [stream])
    split = _account(case["path"], reads)
    assert (split.usage, split.token_events, split.error) == (whole.usage, whole.token_events, whole.error)


@pytest.mark.parametrize(("version", "case"), [c for c in CASES if not c[1]["request"].get("stream")], ids=str)
def test_a_recorded_body_reports_the_engines_usage(version, case):
    scanner = BodyUsage(API[case["path"]])
    for read in case["reads"]:
        scanner.feed(read.encode())
    usage = scanner.usage()
    assert usage is not None and usage["completion_tokens"] == case["request"].get(
        "max_output_tokens", case["request"].get("max_tokens")
    )


def test_usage_keys_a_client_wrote_into_the_echo_are_not_the_report():
    """The Responses API echoes tools and metadata: a schema property named usage, however nested,
    is not the top-level report (chat's byte scanner would have seen two and given up)."""
    tools = [{"type": "function", "name": "f", "parameters": {"properties": {"usage": {"type": "object"}}}}]
    body = {
        "tools": tools,
        "metadata": {"usage": '{"output_tokens": 0}'},
        "output": [{"content": [{"text": '"usage":{"input_tokens":0,"output_tokens":0}'}]}],
        "usage": {"input_tokens": 7, "output_tokens": 900},
    }
    scanner = BodyUsage(Api.RESPONSES)
    raw = orjson.dumps(body)
    for i in range(0, len(raw), 7):
        scanner.feed(raw[i : i + 7])
    assert scanner.usage() == {"prompt_tokens": 7, "completion_tokens": 900}


def test_a_body_over_the_cap_has_no_usage_rather_than_a_guess():
    scanner = BodyUsage(Api.RESPONSES)
    scanner.feed(b'{"instructions":"' + b"x" * MAX_BODY_BYTES + b'",')
    scanner.feed(b'"usage":{"input_tokens":1,"output_tokens":1}}')
    assert scanner.usage() is None


def test_a_stream_whose_last_event_outgrew_the_cap_has_no_usage():
    """An echo of 128 KiB of instructions makes response.completed larger than the account holds."""
    big = {
        "type": "response.completed",
        "response": {"instructions": "x" * 2 * MAX_EVENT_BYTES, "usage": {"input_tokens": 5, "output_tokens": 3}},
    }
    delta = {"type": "response.output_text.delta", "delta": "hi"}
    stream = b"".join(f"event: {e['type']}\ndata: {json.dumps(e)}\n\n".encode() for e in (delta, big))
    acc = _account("/v1/responses", [stream[i : i + 4096] for i in range(0, len(stream), 4096)])
    assert acc.usage is None and acc.token_events == 1 and acc.oversized == 1


def test_anthropic_input_counts_its_cache_reads_and_writes_back_in():
    usage = {"input_tokens": 10, "cache_read_input_tokens": 32, "cache_creation_input_tokens": 16, "output_tokens": 4}
    assert usage_of(Api.MESSAGES, usage) == {"prompt_tokens": 58, "completion_tokens": 4}
    assert usage_of(Api.RESPONSES, {"input_tokens": 3, "output_tokens": 2}) == {
        "prompt_tokens": 3,
        "completion_tokens": 2,
    }
    bad: object
    for bad in (None, [], {"input_tokens": "3", "output_tokens": 2}, {"output_tokens": True, "input_tokens": 1}):
        assert usage_of(Api.MESSAGES, bad) is None


def _events(*payloads: dict) -> bytes:
    return b"".join(f"event: {p['type']}\ndata: {json.dumps(p)}\n\n".encode() for p in payloads)


def test_error_events_tell_the_engines_fault_from_the_clients():
    failed = _account("/v1/responses", [_events({"type": "response.failed", "response": {"usage": None}})])
    assert failed.error
    client = _account("/v1/messages", [_events({"type": "error", "error": {"type": "invalid_request_error"}})])
    engine = _account("/v1/messages", [_events({"type": "error", "error": {"type": "api_error"}})])
    assert not client.error and engine.error


def test_deltas_without_text_are_not_tokens():
    acc = _account(
        "/v1/messages",
        [
            _events(
                {"type": "content_block_delta", "delta": {"type": "text_delta", "text": ""}},
                {"type": "content_block_delta", "delta": {"type": "input_json_delta", "partial_json": '{"a"'}},
                {"type": "content_block_start", "content_block": {"type": "text", "text": "x"}},
            )
        ],
    )
    assert acc.token_events == 1
