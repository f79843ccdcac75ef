"""Accounting of a relayed server-sent-event stream, parsed at event boundaries.

The relay forwards the engine's bytes unchanged; this only watches them. A socket read may end
anywhere (inside the `data: ` marker, inside the JSON, between the two newlines that end an
event), so the unfinished tail of one read is kept and completed by the next. Events are told
apart by their blank line, never by searching for `data: `: generated text may contain it, and
JSON escapes every newline inside a string, so a blank line only ever ends an event.

Per event: `[DONE]` ends the stream; an `error` object marks the stream failed; a `usage` object
(the engine sends one when the request set `stream_options.include_usage`, on every event with
`continuous_usage_stats`) is kept, the last one winning; every choice in `choices` that carries
generated text (completions' `text`, chat's `delta.content`, reasoning or tool calls) counts one
token event for its `index`, so `n>1` streams count each choice. Chat's opening role-only delta
and the final empty delta that carries `finish_reason` carry no text and do not count.

Cost: one bytes search per read for the last event boundary, then one parse of the read's events.
Nearly every event of a stream is a plain token event (one choice, index 0, non-empty text, no
usage, no error); a read made only of those is decoded by msgspec against exactly that shape, which
builds no object for the fields accounting ignores and leaves no Python loop to run: when the
decode succeeds, each event is proven to be a token event of choice 0. A read of one such event
alone (an engine that is not saturated writes one event per read) skips even the framing: two
bytes searches prove it one event of one line, and its JSON is decoded where it lies. Any other
read (the first and last events, usage, errors, n>1, logprobs) fails that decode and is parsed in
full by orjson. Each API's account tries only its own shape's decode (a failed decode raises, which
costs more than a decode). Measured by benchmarks/sse_accounting.py and reported in
docs/reliability.md.
"""

# Longer than 400 lines: one class, a stream's accounting, whose per-read paths are written inline
# for speed (a call per read is measurable); the shapes it decodes live in plain_events.py.

from __future__ import annotations

from typing import Any

import msgspec
import orjson

from palmyra_serve.sidecar.relay.plain_events import CHAT_TOKEN, CHAT_TOKENS, COMPLETIONS_TOKEN, COMPLETIONS_TOKENS

# An event larger than this is not held: it is skipped up to its blank line (counted in
# `oversized`, the relay goes on) and accounting resumes with the next event. vLLM's token events
# are under 4 KiB even with 20 top logprobs; a stream's first event with prompt_logprobs can be
# larger, and is the one skipped. Held per stream: memory_budget.py counts it.
MAX_EVENT_BYTES = 64 * 1024
DONE = b"[DONE]"
# Only the usage report has no choices (vLLM writes compact JSON; inside a string the quotes would
# be escaped, so generated text cannot hold these bytes).
USAGE_ONLY = b'"choices":[]'


class SseAccount:
    """A stream of either shape (completions' or chat's). The relay uses each API's own account
    (CompletionsAccount, ChatAccount; the typed-event streams of relay/typed_events.py try no
    strict decode)."""

    # The strict decoders tried, the one that last succeeded first (an account remembers which
    # shape its stream speaks): for reads of several events, and for a read of one.
    plain_decoders: tuple[msgspec.json.Decoder[Any], ...] = (COMPLETIONS_TOKENS, CHAT_TOKENS)
    one_event_decoders: tuple[msgspec.json.Decoder[Any], ...] = (COMPLETIONS_TOKEN, CHAT_TOKEN)

    __slots__ = (
        "_one",
        "_plain",
        "_tail",
        "done",
        "error",
        "events",
        "first_read_tokens",
        "first_token",
        "last_token",
        "oversized",
        "per_choice",
        "skipping",
        "token_events",
        "unparsed",
        "usage",
    )

    def __init__(self) -> None:
        self._tail = b""
        self._plain = self.plain_decoders
        self._one = self.one_event_decoders
        self.events = 0  # data-bearing events, [DONE] included
        self.token_events = 0  # choice deltas that carried generated text, all choices together
        self.per_choice: dict[int, int] = {}
        self.usage: dict[str, Any] | None = None
        self.done = False
        self.error = False  # an engine error event (vLLM sends one when a generation fails mid-stream)
        self.first_token = 0.0
        self.last_token = 0.0
        self.first_read_tokens = -1  # tokens of the reads stamped first_token (known from the next read on)
        self.unparsed = 0  # data that was not JSON (counted, not guessed at)
        self.oversized = 0  # events over MAX_EVENT_BYTES, skipped
        self.skipping = False  # inside such an event: its bytes are dropped until its blank line

    def feed(self, chunk: bytes, now: float) -> bool:
        """Account for one read of the stream, `now` being when it arrived. True when the events
        the read completed were all plain token events (the strict decode's proof), it left nothing
        unfinished and no event of the stream was ever oversized: then it holds no usage report,
        no error and no [DONE], which lets the relay's usage-event filter (relay/usage_event.py)
        pass it without a look. (Such a read may complete an event begun in the read before; that
        read was not plain, so the filter saw it and holds the event's start.)"""
        if self.first_read_tokens < 0 and self.first_token:
            self.first_read_tokens = self.tokens_so_far()  # what the first token-bearing read held
        if self._tail:
            chunk = self._tail + chunk
        elif (
            # The read a stream is mostly made of: one whole event of one data line, whose only
            # LFs are the two that end it (find() stops at the first), and no CR. Its JSON goes to
            # the strict decode as it is, with none of the general path's searches and copies.
            chunk.find(b"\n") == len(chunk) - 2
            and chunk.endswith(b"\n\n")
            and chunk.startswith(b"data: {")
            and chunk.find(b"\r") < 0
            and not self.skipping
        ):
            for decoder in self._one:
                try:
                    decoder.decode(chunk[6:-2])
                except msgspec.DecodeError:  # ValidationError included: not that shape
                    continue
                if decoder is not self._one[0]:
                    self._one = self._one[::-1]
                self.events += 1
                self.token_events += 1
                per_choice = self.per_choice
                per_choice[0] = per_choice.get(0, 0) + 1
                if not self.first_token:
                    self.first_token = now
                self.last_token = now
                return not self.oversized
            self._event(chunk[:-2], now)  # any other event: parsed in full
            return False
        if self.skipping:
            rest = self._skip(chunk)
            if rest is None:
                return False
            chunk = rest
        if b"\r" in chunk:
            # CR and CRLF line ends are legal SSE; vLLM writes LF. Normalised on this copy only,
            # holding back a final CR whose LF may come with the next read.
            held = chunk.endswith(b"\r")
            chunk = (chunk[:-1] if held else chunk).replace(b"\r\n", b"\n").replace(b"\r", b"\n")
            self._scan(chunk, now)
            if held:
                self._tail += b"\r"
            return False
        return self._scan(chunk, now)

    def _skip(self, data: bytes) -> bytes | None:
        """The bytes after an oversized event's blank line; None while it goes on (only its last
        byte or two are kept, in case they are the start of that blank line)."""
        held = data.endswith(b"\r")
        if b"\r" in data:
            data = (data[:-1] if held else data).replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        end = data.find(b"\n\n")
        if end < 0:
            self._tail = (b"\n" if data.endswith(b"\n") else b"") + (b"\r" if held else b"")
            return None
        self.skipping = False
        self._tail = b""
        return data[end + 2 :] + (b"\r" if held else b"")

    def _scan(self, data: bytes, now: float) -> bool:
        """Account for the whole events of `data`, keeping its unfinished tail; True as feed()."""
        if data.endswith(b"\n\n"):  # the usual read: whole events
            self._tail = b""
            complete = data[:-2]
            if not complete:
                return False
        else:
            end = data.rfind(b"\n\n")
            self._tail = data[end + 2 :] if end >= 0 else data
            if len(self._tail) > MAX_EVENT_BYTES:  # the unfinished event is never held beyond this
                self.oversized += 1
                self.skipping = True
                self._tail = b"\n" if data.endswith(b"\n") else b""  # half of its blank line
            if end <= 0:
                return False
            complete = data[:end]
        # Fast path, vLLM's shape: every event one `data: ` line. Then the events of this read are
        # turned into one JSON array and parsed in one C call (a third cheaper than one call per
        # event). The shape check is exact: a raw newline never occurs inside JSON, so when every
        # newline belongs to a "\n\ndata: " separator, each separator starts an event. An array
        # that does not parse into one value per event (some event is not one JSON value) is
        # parsed again event by event.
        separators = complete.count(b"\n\ndata: ")
        if complete.startswith(b"data: ") and complete.count(b"\n") == 2 * separators:
            events = separators + 1
            done = complete.endswith(b"data: [DONE]")
            if done:
                complete = complete[:-12]
                events -= 1
            report = None
            if events:
                # The usage report (choices: []) ends a stream that asked for it: accounted on
                # its own, after the events before it, which keep the fast path. Looked for in the
                # last event only (found from the end, never by a search through the whole read).
                last = complete.rfind(b"\n\ndata: ", 0, len(complete) - 2)
                tail = complete[last + 2 :] if last >= 0 else complete
                if USAGE_ONLY in tail:
                    report = tail.rstrip(b"\n")
                    complete = complete[: last + 2] if last >= 0 else b""
                    events -= 1
                    separators -= 1
            plain = False
            if events:
                body = complete[6:-2] if done else complete[6:]
                array = b"[" + body.replace(b"\n\ndata: ", b",") + b"]" if separators else b"[" + body + b"]"
                plain = self._plain_tokens(array, events, now)
                if not plain and not (events > 2 and self._ends_apart(body, events, now)):
                    self._parse_all(array, complete, events, now)
            if report is not None:
                self._event(report, now)
                plain = False
            if done:
                self.events += 1
                self.done = True
                plain = False
            return plain and not self._tail and not self.oversized
        for block in complete.split(b"\n\n"):
            if block:
                self._event(block, now)
        return False

    def _plain_tokens(self, array: bytes, events: int, now: float) -> bool:
        """Account for a read of plain token events of choice 0 in one strict decode; False (and
        nothing counted) when any event is anything else."""
        for decoder in self._plain:
            try:
                decoded = decoder.decode(array)
            except msgspec.DecodeError:  # ValidationError included: not that shape
                continue
            if len(decoded) != events:
                return False  # an event held more than one JSON value: the general path says which
            if decoder is not self._plain[0]:
                self._plain = self._plain[::-1]
            self.events += events
            self.token_events += events
            self.per_choice[0] = self.per_choice.get(0, 0) + events
            if not self.first_token:
                self.first_token = now
            self.last_token = now
            return True
        return False

    def _ends_apart(self, body: bytes, events: int, now: float) -> bool:
        """A read of plain token events between a first and a last event that are not (a whole
        stream in one read, as a fast engine's reads often are: chat's role-only opening delta and
        the closing event around the tokens): the events between decoded strictly in one call,
        the two ends parsed alone. False, nothing counted, when those between are not all plain.
        `body`: the read's events from the first one's JSON on, "\n\ndata: " between them."""
        first = body.find(b"\n\ndata: ")
        last = body.rfind(b"\n\ndata: ")
        between = b"[" + body[first + 8 : last].replace(b"\n\ndata: ", b",") + b"]"
        if not self._plain_tokens(between, events - 2, now):
            return False
        self._json_event(body[:first], now)
        self._json_event(body[last + 8 :], now)
        return True

    def _parse_all(self, array: bytes, complete: bytes, events: int, now: float) -> None:
        """The read's events as one JSON array, or event by event when that array does not hold
        exactly one JSON value per event (some event is not one JSON value)."""
        try:
            payloads = orjson.loads(array)
        except orjson.JSONDecodeError:
            payloads = None  # one of them is not JSON: find which, event by event
        if payloads is not None and len(payloads) == events:
            self.events += events
            self._payloads(payloads, now)
            return
        for block in complete.split(b"\n\n"):
            if block:
                self._event(block, now)

    def _event(self, block: bytes, now: float) -> None:
        data: bytes | None
        if block.startswith(b"data: ") and b"\n" not in block:
            data = block[6:]  # the usual shape: one data line
        else:
            data = _data_of(block)
            if data is None:
                return  # a comment (": ping"), an `event:`/`id:`/`retry:`-only block
        if data == DONE:
            self.events += 1
            self.done = True
            return
        self._json_event(data, now)

    def _json_event(self, data: bytes, now: float) -> None:
        """One event's data: counted, parsed, accounted (counted as unparsed when not JSON)."""
        self.events += 1
        try:
            payload = orjson.loads(data)
        except orjson.JSONDecodeError:
            self.unparsed += 1
            return
        self._payload(payload, now)

    def _payloads(self, payloads: list[Any], now: float) -> None:
        """_payload for each, with the usual shape (one choice with text, no usage, no error)
        handled inline: this loop is most of the accounting's cost per event."""
        per_choice = self.per_choice
        counted = 0
        for payload in payloads:
            if payload.__class__ is dict and "error" not in payload and payload.get("usage") is None:
                choices = payload.get("choices")
                if choices.__class__ is list and len(choices) == 1:
                    choice = choices[0]
                    if choice.__class__ is dict:
                        text = choice.get("text")
                        if text is None:  # chat: the text is the delta's content
                            delta = choice.get("delta")
                            text = delta.get("content") if delta.__class__ is dict else None
                        if text:
                            index = choice.get("index", 0)
                            if index.__class__ is int:
                                per_choice[index] = per_choice.get(index, 0) + 1
                                counted += 1
                                continue
            self._payload(payload, now)
        if counted:
            self.token_events += counted
            if not self.first_token:
                self.first_token = now
            self.last_token = now

    def _payload(self, payload: Any, now: float) -> None:
        if not isinstance(payload, dict):
            self.unparsed += 1
            return
        if "error" in payload:
            # The engine's failure, unless it names a client error (4xx): what a client can
            # provoke must not count against the engine (nor drop readiness, see relay/handler.py).
            error = payload["error"]
            code = error.get("code") if isinstance(error, dict) else None
            self.error = self.error or not (isinstance(code, int) and 400 <= code < 500)
            return
        usage = payload.get("usage")
        if usage is not None and isinstance(usage, dict):
            self.usage = usage
        choices = payload.get("choices")
        if not choices or not isinstance(choices, list):
            return
        for choice in choices:
            if isinstance(choice, dict) and _carries_text(choice):
                index = choice.get("index", 0)
                if index.__class__ is not int:
                    index = 0
                per_choice = self.per_choice
                per_choice[index] = per_choice.get(index, 0) + 1
                self.token_events += 1
                if not self.first_token:
                    self.first_token = now
                self.last_token = now

    def finish(self) -> None:
        """The stream ended: an event the engine did not close with a blank line still counts."""
        tail = self._tail.rstrip(b"\r\n")
        self._tail = b""
        if tail and not self.skipping:
            self._event(tail, self.last_token or 0.0)

    def completion_tokens(self) -> int:
        """The engine's own count when it reported usage, else the token events seen."""
        reported = self.usage.get("completion_tokens") if self.usage else None
        return reported if isinstance(reported, int) else self.token_events

    def prompt_tokens(self) -> int | None:
        reported = self.usage.get("prompt_tokens") if self.usage else None
        return reported if isinstance(reported, int) else None

    def tokens_so_far(self) -> int:
        """Tokens of the busiest choice so far: the engine's running count when it reports usage on
        every event (`continuous_usage_stats`) for a one-choice stream, else its token events. Under
        load vLLM puts several tokens in one event, so events alone undercount (never overcount)."""
        events = max(self.per_choice.values(), default=0)
        reported = self.usage.get("completion_tokens") if self.usage else None
        if isinstance(reported, int) and len(self.per_choice) <= 1:
            return max(events, reported)
        return events

    def mean_token_gap(self) -> float | None:
        """The engine's mean time per generated token after its first read (the ITL the SLO speaks
        of; admission's sample): the time from the first token-bearing read to the last, over the
        tokens that arrived after that first read (the engine's own count when it reported usage for
        a one-choice stream). The tokens of one read share its timestamp, so they are one sample of
        the gap before that read, never gaps of 0: a stream whose tokens all came in one read
        measures no gap (None), nor does one with fewer than one token after its first read."""
        if self.first_read_tokens < 0:
            return None
        after = self.tokens_so_far() - self.first_read_tokens
        span = self.last_token - self.first_token
        if after < 1 or not span > 0:
            return None
        return span / after

    def mean_event_gap(self) -> float | None:
        """Mean gap between the token events of one choice (the busiest one), None under two: what
        palmyra_inter_token_latency_seconds observes. Admission's sample is mean_token_gap: under
        load vLLM puts several tokens in one event, and only the per-token gap stays comparable."""
        steps = max(self.per_choice.values(), default=0)
        if steps < 2:
            return None
        return (self.last_token - self.first_token) / (steps - 1)


class CompletionsAccount(SseAccount):
    __slots__ = ()
    plain_decoders = (COMPLETIONS_TOKENS,)
    one_event_decoders = (COMPLETIONS_TOKEN,)


class ChatAccount(SseAccount):
    __slots__ = ()
    plain_decoders = (CHAT_TOKENS,)
    one_event_decoders = (CHAT_TOKEN,)


def _data_of(block: bytes) -> bytes | None:
    """The data of an event in its general shape: its `data:` lines joined with LF, the one
    optional space after the colon removed; None when it has no data line."""
    lines = [line[5:] for line in block.split(b"\n") if line.startswith(b"data:")]
    if not lines:
        return None
    return b"\n".join(line[1:] if line.startswith(b" ") else line for line in lines)


def _carries_text(choice: dict[str, Any]) -> bool:
    if choice.get("text"):
        return True
    delta = choice.get("delta")
    if not isinstance(delta, dict):
        return False
    return bool(
        delta.get("content") or delta.get("reasoning_content") or delta.get("reasoning") or delta.get("tool_calls")
    )
