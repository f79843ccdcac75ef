"""benchmarks/fast_engine.py speaks each route's API as vLLM 0.32 does, so the relay benchmark's
per-route figures are the relay's real work: its Responses and Messages streams carry the event
types, in the order and with the fields of the engine's own recordings
(tests/unit/data/vllm-typed-events.json), and the sidecar's own accounting reads 64 tokens and the
usage from every route's stream. Also benchmarks/relay.py's routes and its per-route report."""

from __future__ import annotations

import json
from pathlib import Path
from types import ModuleType

import pytest

from palmyra_serve.sidecar.relay.sse import SseAccount
from palmyra_serve.sidecar.relay.typed_events import MessagesAccount, ResponsesAccount

RECORDED = {
    r["name"]: r["reads"]
    for r in json.loads((Path(__file__).parent / "data" / "vllm-typed-events.json").read_text())["versions"]["0.32.0"]
}
ASKED = b'{"stream":true,"stream_options":{"include_usage":true}}'


@pytest.fixture(scope="module")
def fast() -> ModuleType:
    from benchmarks import fast_engine

    return fast_engine


def typed_events(stream: bytes) -> list[tuple[str, dict]]:
    events = []
    for block in stream.decode().split("\n\n"):
        if block:
            head, data = block.split("\n")
            assert head.startswith("event: ") and data.startswith("data: "), block
            payload = json.loads(data[6:])
            assert payload["type"] == head[7:], "the event's name is its data's type"
            events.append((head[7:], payload))
    return events


def collapsed(types: list[str]) -> list[str]:
    """The event types with each run of one type written once (64 deltas or 6, the same shape)."""
    return [t for i, t in enumerate(types) if i == 0 or types[i - 1] != t]


def shape(value: object) -> object:
    """An event's keys, nested, without the values; `incomplete_details` left out (the recording's
    response ran into its token limit, the fake's completes)."""
    if isinstance(value, dict):
        return {k: shape(v) for k, v in value.items() if k != "incomplete_details"}
    return None


@pytest.mark.parametrize(
    ("path", "recorded"), [("/v1/responses", "responses-stream"), ("/v1/messages", "messages-stream")]
)
def test_the_typed_streams_are_the_engines_shape(fast, path: str, recorded: str) -> None:
    ours = typed_events(b"".join(fast.stream_of(path, b'{"stream":true}')))
    theirs = typed_events("".join(RECORDED[recorded]).encode())
    assert collapsed([t for t, _ in ours]) == collapsed([t for t, _ in theirs])
    deltas = "response.output_text.delta" if path == "/v1/responses" else "content_block_delta"
    assert sum(t == deltas for t, _ in ours) == 64
    first_of: dict[str, dict] = {}
    for kind, payload in theirs:
        first_of.setdefault(kind, payload)
    for kind, payload in ours:
        assert shape(payload) == shape(first_of[kind]), kind


@pytest.mark.parametrize(
    ("path", "account", "prompt"),
    [
        ("/v1/completions", SseAccount, 1),
        ("/v1/chat/completions", SseAccount, 9),
        ("/v1/responses", ResponsesAccount, 1),
        ("/v1/messages", MessagesAccount, 1),
    ],
)
def test_the_sidecars_accounting_reads_64_tokens_and_the_usage(fast, path: str, account: type, prompt: int) -> None:
    for one_read in (False, True):
        writes = fast.stream_of(path, ASKED)
        acc = account()
        for i, write in enumerate([b"".join(writes)] if one_read else writes):
            acc.feed(write, float(i))
        acc.finish()
        assert acc.tokens_so_far() == 64 and acc.token_events == 64
        assert acc.completion_tokens() == 64 and acc.prompt_tokens() == prompt
        assert not acc.error and acc.unparsed == 0


def test_completions_streams_are_what_workload_a_always_measured(fast) -> None:
    """64 chunks then [DONE], the usage event only when asked: the before/after comparisons hold."""
    assert fast.stream_of("/v1/completions", b'{"stream": true}') == [*fast.EVENT, fast.DONE]
    assert fast.stream_of("/v1/completions", ASKED)[-1] == fast.USAGE + fast.DONE


def test_each_route_is_a_streamed_request_with_its_key() -> None:
    from benchmarks import relay

    assert relay.ROUTES["completions"].lua() == relay.WRK_LUA.format(
        body=relay.BODY, header="Authorization", value=f"Bearer {relay.API_KEY}"
    )
    assert (b"x-api-key", relay.API_KEY.encode()) in relay.ROUTES["messages"].headers()
    for route in relay.ROUTES.values():
        body = json.loads(route.body)
        assert body["stream"] is True and 64 in (body.get("max_tokens"), body.get("max_output_tokens"))


def test_the_per_route_report_sets_each_route_against_completions() -> None:
    from benchmarks import relay

    def point(cpu: float) -> dict:
        row = {"rps": 1000.0, "chunks_per_s": 64000.0, "ttft_p50_ms": 1.0, "ttft_p99_ms": 2.0}
        return {"32": {**row, "proxy_cpu_s_per_1000": cpu}}

    routes = {
        name: {"path": relay.ROUTES[name].path, "targets": {"direct": point(0.1), "sidecar": point(cpu)}}
        for name, cpu in (("responses", 0.45), ("completions", 0.3))
    }
    md = relay.report(
        {"concurrency": [32], "load": "wrk", "targets": routes["responses"]["targets"], "routes": routes}, None
    )
    assert "### responses (`/v1/responses`)" in md and "### Per route" in md
    assert "| 32 | responses | 1000 | 100.0% | 0.450 | 1.50× |" in md
    assert "| 32 | completions | 1000 | 100.0% | 0.300 | 1.00× |" in md
