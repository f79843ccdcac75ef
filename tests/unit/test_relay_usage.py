"""The usage report of a non-streamed body, read as it passes (sidecar/relay/usage.py)."""

from __future__ import annotations

import orjson
import pytest

from palmyra_serve.sidecar.relay.usage import MAX_USAGE_BYTES, UsageScanner

USAGE = {"prompt_tokens": 3, "total_tokens": 8, "completion_tokens": 5, "prompt_tokens_details": None}


def scan(body: bytes, size: int | None = None) -> UsageScanner:
    scanner = UsageScanner()
    size = size or len(body) or 1
    for k in range(0, len(body), size):
        scanner.feed(body[k : k + size])
    return scanner


def vllm_chat(text: str, **extra: object) -> bytes:
    """vLLM's field order: usage after choices, prompt_logprobs and kv_transfer_params after usage."""
    message = {"role": "assistant", "content": text}
    body = {"id": "chatcmpl-1", "object": "chat.completion", "choices": [{"index": 0, "message": message}]}
    return orjson.dumps({**body, "usage": USAGE, **extra})


@pytest.mark.parametrize("size", [1, 2, 7, 64, None], ids=lambda s: f"reads of {s or 'all'}")
def test_usage_found_wherever_the_reads_split_it(size):
    body = vllm_chat("hello", prompt_logprobs=[None, {"9": {"logprob": -0.5, "rank": 1, "decoded_token": "x"}}])
    assert scan(body, size).usage() == USAGE


@pytest.mark.parametrize(
    "text",
    ['"usage": {"prompt_tokens": 999}', '\\"usage\\": {}', '{"usage":{"completion_tokens":1}}', "usage", '"usage"'],
)
def test_generated_text_cannot_forge_a_usage_key(text):
    body = vllm_chat(text)
    for size in (1, 5, None):
        assert scan(body, size).usage() == USAGE


def test_usage_is_not_assumed_last_or_compact():
    body = b'{ "usage" :\n {"prompt_tokens": 3, "completion_tokens": 5, "x": {"y": "}"}},\n "choices": []}'
    assert scan(body, 3).usage() == {"prompt_tokens": 3, "completion_tokens": 5, "x": {"y": "}"}}


def test_no_ambiguous_or_oversized_or_cut_report():
    assert scan(b'{"choices": []}').usage() is None
    assert scan(b'{"usage": null, "object": "usage"}').usage() is None
    assert scan(b'{"usage":{"trunc').usage() is None
    nested = b'{"usage": {"completion_tokens": 5}, "kv": {"usage": {"completion_tokens": 7}}}'
    assert scan(nested).usage() is None, "two usage keys: which is the top level's is not known"
    padding = b" " * MAX_USAGE_BYTES
    assert scan(b'{"usage": {"completion_tokens": 5,' + padding + b'"prompt_tokens": 1}}', 512).usage() is None


def test_a_large_body_keeps_nothing_but_the_report():
    scanner = UsageScanner()
    text = orjson.dumps("x" * (8 * 2**20))
    for k in range(0, len(text), 65536):
        scanner.feed(text[k : k + 65536])
        assert len(scanner._tail) < 8  # a read's last bytes, never the body
    scanner.feed(b',"usage":' + orjson.dumps(USAGE) + b"}")
    assert scanner.usage() == USAGE
