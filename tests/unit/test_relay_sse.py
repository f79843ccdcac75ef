"""SSE accounting (sidecar/relay/sse.py): events found at their blank line across any split of the reads,
tokens counted per choice, the engine's usage preferred. Scripted streams build the hard cases
(split markers, text that contains "data: ", CRLF framing); streams recorded from the real vLLM
engine (tests/unit/data/vllm-sse.json, read by the relay's own pool) check the counts against the
engine's own usage reports."""

from __future__ import annotations

import json
from pathlib import Path

import msgspec
import pytest

from palmyra_serve.sidecar.relay import sse
from palmyra_serve.sidecar.relay.sse import MAX_EVENT_BYTES, SseAccount

RECORDED = json.loads((Path(__file__).parent / "data" / "vllm-sse.json").read_text())["cases"]


def event(payload: dict | str) -> bytes:
    data = payload if isinstance(payload, str) else json.dumps(payload)
    return f"data: {data}\n\n".encode()


def text(t: str, index: int = 0) -> bytes:
    return event({"object": "text_completion", "choices": [{"index": index, "text": t, "finish_reason": None}]})


def delta(d: dict, index: int = 0, finish: str | None = None) -> bytes:
    return event(
        {"object": "chat.completion.chunk", "choices": [{"index": index, "delta": d, "finish_reason": finish}]}
    )


DONE = b"data: [DONE]\n\n"


def account(reads: list[bytes], step: float = 0.01) -> SseAccount:
    acc = SseAccount()
    for i, chunk in enumerate(reads):
        acc.feed(chunk, 1.0 + i * step)
    acc.finish()
    return acc


def every_split(stream: bytes) -> list[list[bytes]]:
    """The stream cut in two at every byte, and cut into single bytes."""
    return [[stream[:i], stream[i:]] for i in range(1, len(stream))] + [[bytes([b]) for b in stream]]


def totals(acc: SseAccount) -> tuple:
    return acc.events, acc.token_events, dict(acc.per_choice), acc.usage, acc.done, acc.unparsed


def test_a_data_marker_split_across_reads_is_one_event():
    acc = account([b"da", b"ta: ", json.dumps({"choices": [{"index": 0, "text": "a"}]}).encode() + b"\n", b"\n", DONE])
    assert (acc.token_events, acc.events, acc.done) == (1, 2, True)


def test_generated_text_containing_the_data_marker_is_one_token_event():
    stream = text("data: ") + text("x\n\ndata: y") + text("data: data: ") + DONE
    acc = account([stream])
    assert acc.token_events == 3 and acc.completion_tokens() == 3 and acc.unparsed == 0


def test_every_split_of_a_stream_gives_the_same_account():
    usage = {"prompt_tokens": 2, "completion_tokens": 2, "total_tokens": 4}
    stream = (
        delta({"role": "assistant", "content": ""})
        + delta({"content": "data: a"})
        + b": keep-alive\n\n"
        + delta({"content": "b"})
        + delta({}, finish="stop")
        + event({"object": "chat.completion.chunk", "choices": [], "usage": usage})
        + DONE
    )
    whole = totals(account([stream]))
    assert whole == (6, 2, {0: 2}, usage, True, 0)
    for reads in every_split(stream):
        assert totals(account(reads)) == whole, reads


def test_n_choices_are_counted_per_choice_and_itl_is_per_choice():
    reads = []
    for step in range(4):  # vLLM interleaves the choices' deltas, one event each
        reads.append(text(f"a{step}", 0) + text(f"b{step}", 1) + text(f"c{step}", 2))
    acc = SseAccount()
    for i, chunk in enumerate(reads):
        acc.feed(chunk, 10.0 + i * 0.05)
    acc.feed(DONE, 10.5)
    acc.finish()
    assert acc.token_events == 12 and acc.per_choice == {0: 4, 1: 4, 2: 4}
    assert acc.completion_tokens() == 12
    # Three gaps of 50 ms between each choice's four tokens (not eleven gaps among twelve events).
    assert acc.mean_event_gap() == pytest.approx(0.05)


def test_usage_event_wins_over_counted_events_even_when_split_across_reads():
    usage = event({"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 9, "total_tokens": 14}})
    stream = text("a") + text("b") + usage + DONE
    cut = stream.index(b'"completion_tokens"') + 5
    acc = account([stream[:cut], stream[cut:]])
    assert acc.token_events == 2
    assert (acc.completion_tokens(), acc.prompt_tokens()) == (9, 5)


def test_continuous_usage_keeps_the_last_report():
    reads = [
        event({"choices": [{"index": 0, "text": "a"}], "usage": {"completion_tokens": 1, "prompt_tokens": 3}}),
        event({"choices": [{"index": 0, "text": "b"}], "usage": {"completion_tokens": 2, "prompt_tokens": 3}}),
        DONE,
    ]
    assert account(reads).completion_tokens() == 2


def test_no_usage_means_counted_events_and_no_prompt_tokens():
    acc = account(
        [
            delta({"role": "assistant"}),
            delta({"content": "x"}),
            delta({"reasoning_content": "y"}),
            delta({"tool_calls": [{"index": 0, "function": {"arguments": "{"}}]}),
            delta({}, finish="length"),
            DONE,
        ]
    )
    # The role-only opening and the empty closing delta carry no generated text.
    assert (acc.completion_tokens(), acc.prompt_tokens()) == (3, None)


def test_crlf_framing_and_a_cr_split_from_its_lf():
    stream = text("a").replace(b"\n", b"\r\n") + text("b").replace(b"\n", b"\r\n") + b"data: [DONE]\r\n\r\n"
    whole = totals(account([stream]))
    assert whole[:2] == (3, 2) and whole[4]
    for reads in every_split(stream):
        assert totals(account(reads)) == whole


def test_multi_line_data_and_fields_other_than_data():
    stream = (
        b'event: message\nid: 7\ndata: {"choices":\ndata: [{"index": 0, "text": "a"}]}\n\n'
        b"retry: 100\n\n" + b"data:" + json.dumps({"choices": [{"index": 0, "text": "b"}]}).encode() + b"\n\n"
    )
    acc = account([stream])
    assert (acc.events, acc.token_events, acc.unparsed) == (2, 2, 0)


def test_a_last_event_without_its_blank_line_still_counts():
    acc = account([text("a"), text("b")[:-1]])
    assert acc.token_events == 2


def test_data_that_is_not_json_is_counted_as_unparsed_not_as_a_token():
    acc = account([event("not json"), event("[1, 2]"), text("a"), DONE])
    assert (acc.unparsed, acc.token_events) == (2, 1)


def test_an_oversized_event_is_skipped_not_held_and_accounting_resumes_after_it():
    acc = SseAccount()
    acc.feed(b"data: " + b"x" * (MAX_EVENT_BYTES + 1), 1.0)
    assert acc.skipping and len(acc._tail) <= 1
    acc.feed(b"x" * MAX_EVENT_BYTES + b"\n", 1.05)  # still the same event, not held either
    assert acc.skipping and len(acc._tail) <= 1
    acc.feed(text("a"), 1.1)  # its first blank line ends the oversized event, which it belonged to
    assert acc.oversized == 1 and acc.token_events == 0 and not acc.skipping
    acc.feed(text("b") + text("c"), 1.2)
    assert acc.token_events == 2


@pytest.mark.parametrize("ending", [b"\n\n", b"\r\n\r\n", b"\r\r"])
def test_the_blank_line_after_an_oversized_event_is_found_across_reads(ending):
    acc = SseAccount()
    data = b"data: " + b"x" * (MAX_EVENT_BYTES + 1) + ending + text("a") + text("b")
    for k in range(0, len(data), 7):
        acc.feed(data[k : k + 7], 1.0)
    acc.finish()
    assert (acc.oversized, acc.token_events) == (1, 2)


@pytest.mark.parametrize("case", RECORDED, ids=[c["name"] for c in RECORDED])
def test_recorded_vllm_streams_count_what_the_engine_reports(case: dict):
    reads = [r.encode("latin-1") for r in case["reads"]]
    acc = account(reads)
    n = case["request"].get("n", 1)
    assert acc.done and acc.unparsed == 0
    assert len(acc.per_choice) == n
    if acc.usage is not None:
        # Every token the engine generated was one event of one choice: the counts agree exactly.
        assert acc.token_events == acc.usage["completion_tokens"]
    stream = b"".join(reads)
    for cut in range(1, len(stream), max(1, len(stream) // 200)):
        assert totals(account([stream[:cut], stream[cut:]])) == totals(acc)
    assert totals(account([bytes([b]) for b in stream])) == totals(acc)


def test_an_engine_error_event_marks_the_stream_failed_but_a_client_error_does_not():
    engine_died = event({"error": {"message": "EngineCore died", "type": "InternalServerError", "code": 500}})
    assert account([text("a"), engine_died, DONE]).error
    assert account([text("a"), event({"error": "unexpected"}), DONE]).error
    client_error = event({"error": {"message": "bad logprobs", "type": "BadRequestError", "code": 400}})
    acc = account([text("a"), client_error, DONE])
    assert not acc.error and acc.token_events == 1


# The strict decode of plain token events (relay/sse.py's fast path) must account for every read exactly
# as the general parse does. Each stream below is fed as one read, and again with the fast path
# switched off; both accounts must agree on everything, including the error flag and token times.
STRICT_CASES = {
    "plain text events": text("a") + text("b"),
    "plain chat deltas": delta({"content": "a"}) + delta({"content": "b", "reasoning_content": None}),
    "usage null is plain": event({"choices": [{"index": 0, "text": "a"}], "usage": None}),
    "usage reported": event({"choices": [{"index": 0, "text": "a"}], "usage": {"completion_tokens": 7}}),
    "error null": event({"choices": [{"index": 0, "text": "a"}], "error": None}),
    "error object": text("a") + event({"choices": [{"index": 0, "text": "b"}], "error": {"code": 500}}),
    "empty text": text("a") + text(""),
    "text not a string": event({"choices": [{"index": 0, "text": 5}]}),
    "choice 1": text("a", 1) + text("b", 1),
    "index as float": event({"choices": [{"index": 0.0, "text": "a"}]}),
    "index absent": event({"choices": [{"text": "a"}]}),
    "two choices in one event": event({"choices": [{"index": 0, "text": "a"}, {"index": 1, "text": "b"}]}),
    "no choices": event({"choices": []}),
    "role-only delta": delta({"role": "assistant", "content": ""}) + delta({"content": "a"}),
    "escaped text": text('a "quoted" \\ line\nbreak \u00e9 \U0001f600'),
    "top-level array": event("[1]") + text("a"),
    "duplicate choices key": b'data: {"choices":[{"index":0,"text":"a"}],"choices":[]}\n\n',
    "two values in one event": b'data: {"choices":[{"index":0,"text":"a"}]},{"choices":[]}\n\n' + text("b"),
    "done after tokens": text("a") + text("b") + DONE,
    # A whole stream in one read: plain tokens between ends that are not (parsed alone).
    "whole chat stream": delta({"role": "assistant", "content": ""})
    + delta({"content": "a"})
    + delta({"content": "b"})
    + delta({}, finish="stop")
    + event({"choices": [], "usage": {"prompt_tokens": 2, "completion_tokens": 2}})
    + DONE,
    "ends that are not JSON": event("not json") + text("a") + text("b") + event("{bad"),
    "two values at an end": b'data: {"choices":[]},{"choices":[]}\n\n' + text("a") + text("b") + text(""),
    "error at the end": text("a") + text("b") + text("c") + event({"error": {"message": "x", "code": 500}}),
    "usage at the start": event({"choices": [], "usage": {"completion_tokens": 9}}) + text("a") + text("b") + text(""),
    "two choices at both ends": event({"choices": [{"index": 0, "text": "a"}, {"index": 1, "text": "b"}]})
    + text("c")
    + text("d")
    + event({"choices": [{"index": 1, "text": "e"}]}),
    "a non-plain event between the ends": text("") + text("a") + text("") + text("b") + text(""),
}


@pytest.mark.parametrize("shape", [SseAccount, sse.CompletionsAccount, sse.ChatAccount], ids=lambda c: c.__name__)
@pytest.mark.parametrize("stream", STRICT_CASES.values(), ids=STRICT_CASES.keys())
def test_the_strict_token_event_decode_accounts_exactly_as_the_general_parse(stream, shape, monkeypatch):
    """Whichever API's account reads it (each tries only its own shape's decode)."""
    fast = shape()
    fast.feed(stream, 2.0)
    fast.finish()
    monkeypatch.setattr(sse.SseAccount, "plain_decoders", ())
    monkeypatch.setattr(sse.SseAccount, "one_event_decoders", ())
    general = SseAccount()
    general.feed(stream, 2.0)
    general.finish()
    seen_fast = (*totals(fast), fast.error, fast.first_token, fast.last_token)
    seen_general = (*totals(general), general.error, general.first_token, general.last_token)
    assert seen_fast == seen_general


def test_plain_token_reads_take_the_strict_decode(monkeypatch):
    """The fast paths are taken where they should be (else the cases above would compare the general
    parse with itself): a read of several events decodes them as one array, a read of one event
    alone by the one-event decode, whose failure sends it to the general parse."""
    calls = []
    real = sse.SseAccount._plain_tokens

    def spy(self, array, events, now):
        calls.append(real(self, array, events, now))
        return calls[-1]

    decoded: list[bool] = []

    class Counting:
        def __init__(self, decoder):
            self.decoder = decoder

        def decode(self, data):
            try:
                result = self.decoder.decode(data)
            except msgspec.DecodeError:
                decoded.append(False)
                raise
            decoded.append(True)
            return result

    monkeypatch.setattr(sse.SseAccount, "_plain_tokens", spy)
    monkeypatch.setattr(sse.SseAccount, "one_event_decoders", tuple(map(Counting, sse.SseAccount.one_event_decoders)))
    acc = account([text("a") + text("b"), delta({"content": "c"}), delta({"content": "d"}), text(""), DONE])
    assert calls == [True]
    # Completions' decode first, then chat's, which is tried first from then on; the empty text
    # fits neither.
    assert decoded == [False, True, True, False, False]
    assert (acc.token_events, acc.events, acc.done) == (4, 6, True)


def usage_event(text: str, usage: int | None = None) -> bytes:
    payload: dict = {"choices": [{"index": 0, "text": text}]}
    if usage is not None:
        payload["usage"] = {"prompt_tokens": 3, "completion_tokens": usage}
    return b"data: " + json.dumps(payload).encode() + b"\n\n"


def test_token_gap_counts_tokens_from_usage_when_events_carry_several() -> None:
    acc = SseAccount()
    # Four events 0.1 s apart, each carrying 4 tokens (vLLM coalesces under load), usage at the end.
    for i in range(4):
        acc.feed(usage_event("abcd"), 1.0 + 0.1 * i)
    assert acc.tokens_so_far() == 4 and acc.mean_token_gap() == pytest.approx(0.3 / 3)
    acc.feed(b'data: {"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":16}}\n\ndata: [DONE]\n\n', 1.4)
    assert acc.tokens_so_far() == 16
    assert acc.mean_token_gap() == pytest.approx(0.3 / 15), "per token, not per event"
    assert acc.mean_event_gap() == pytest.approx(0.1), "the per-event metric is unchanged"


def test_continuous_usage_gives_the_running_count_mid_stream() -> None:
    acc = SseAccount()
    acc.feed(usage_event("ab", usage=2), 1.0)
    acc.feed(usage_event("cdef", usage=6), 1.2)
    assert acc.tokens_so_far() == 6


def test_two_choices_count_events_not_the_summed_usage() -> None:
    acc = SseAccount()
    for i in range(3):
        acc.feed(b'data: {"choices":[{"index":0,"text":"a"},{"index":1,"text":"b"}]}\n\n', 1.0 + 0.1 * i)
    acc.feed(b'data: {"choices":[],"usage":{"completion_tokens":6}}\n\n', 1.3)
    assert acc.tokens_so_far() == 3


USAGE_REPORT = b'data: {"id":"c","choices":[],"usage":{"prompt_tokens":3,"completion_tokens":2}}\n\n'
# Each read with what feed() says of it: True only for whole plain token events (the relay's usage
# filter passes those without a look, relay/pump.py), for the stream reads in this order.
PLAIN_OR_NOT = [
    ("role-only delta first", delta({"role": "assistant", "content": ""}), False),
    ("one token event", delta({"content": "a"}), True),
    ("two token events", delta({"content": "b"}) + delta({"content": "c"}), True),
    ("an event cut short", delta({"content": "d"})[:20], False),
    # Completing an event begun in the read before may be plain: the filter was given that read
    # (not plain) and holds the event's start itself, so it sees this one too.
    ("its rest", delta({"content": "d"})[20:], True),
    ("CRLF framing", delta({"content": "e"}).replace(b"\n", b"\r\n"), False),
    ("token then the usage report", delta({"content": "f"}) + USAGE_REPORT, False),
    ("null usage on a token event", b'data: {"choices":[{"index":0,"delta":{"content":"g"}}],"usage":null}\n\n', True),
    (
        "two choices",
        b'data: {"choices":[{"index":0,"delta":{"content":"h"}},{"index":1,"delta":{"content":"i"}}]}\n\n',
        False,
    ),
    ("finish event", delta({}, finish="stop"), False),
    ("done", DONE, False),
]


@pytest.mark.parametrize("shape", [SseAccount, sse.ChatAccount], ids=lambda c: c.__name__)
def test_feed_says_plain_only_of_reads_of_whole_plain_token_events(shape):
    acc = shape()
    said = {name: acc.feed(chunk, 1.0 + i) for i, (name, chunk, _) in enumerate(PLAIN_OR_NOT)}
    assert said == {name: plain for name, _, plain in PLAIN_OR_NOT}
    assert acc.usage == {"prompt_tokens": 3, "completion_tokens": 2} and acc.done


def test_no_read_is_plain_once_an_event_was_oversized():
    acc = SseAccount()
    assert acc.feed(delta({"content": "a"}) + b"data: " + b"x" * (MAX_EVENT_BYTES + 10), 1.0) is False
    assert acc.skipping
    assert acc.feed(b"x\n\n" + delta({"content": "b"}), 2.0) is False
    assert acc.feed(delta({"content": "c"}), 3.0) is False
    assert (acc.token_events, acc.oversized) == (3, 1)
