"""Removes the engine's usage report from a stream whose client did not ask for it.

A tenant with a tokens-per-minute limit needs every stream's real usage, which vLLM sends only when
the request sets stream_options.include_usage: one extra event, `choices: []` with a `usage`
object, just before `[DONE]`. The relay asks for it on the client's behalf (tenants/reservation.py)
and takes that event out here, so the client gets exactly the events it would have got. vLLM 0.18
(the Ascend image's) also writes `"usage":null` into every other event of such a stream; that
member is taken out too. Both are safe to find by their bytes: inside a JSON string every quote is
escaped, so generated text cannot contain `"choices":[]` or `,"usage":null` unescaped.

Cost: on an engine that writes `"usage":null` into its events (0.18, seen in the stream's first
whole event: `null_usage`) every read goes through here. On one that does not (0.32), a read the
stream's accounting proved to be nothing but plain token events (relay/sse.py: no usage report, no
[DONE]) passes unchanged without a call in here; the others go through (relay/pump.py decides
inline; until the first whole event tells which engine it is, and while part of an event is held,
every read does). A read is split only if it holds `"choices":[]` (vLLM's compact JSON), which
only the usage event carries; a read that ends inside an event is held until the event's end (vLLM
writes whole events, so in practice nothing waits).
A stream without the blank-line event separator is passed through once MAX_HELD bytes would be
held, never buffered whole.
"""

from __future__ import annotations

import orjson

EMPTY_CHOICES = b'"choices":[]'
NULL_USAGE = b',"usage":null'
MAX_HELD = 64 * 1024


def _usage_only(event: bytes) -> bool:
    if not event.startswith(b"data: {") or EMPTY_CHOICES not in event:
        return False
    try:
        payload = orjson.loads(event[6:])
    except orjson.JSONDecodeError:
        return False
    return isinstance(payload, dict) and payload.get("choices") == [] and isinstance(payload.get("usage"), dict)


class UsageEventFilter:
    __slots__ = ("_held", "holding", "null_usage", "removed")

    def __init__(self) -> None:
        self._held = b""
        self.holding = False  # bytes of an unfinished event are held: the next read must go through feed()
        # Whether the engine writes "usage":null into every event (vLLM 0.18: then every read must go
        # through feed()); None until the first whole event has been seen, in feed().
        self.null_usage: bool | None = None
        self.removed = 0

    def feed(self, chunk: bytes) -> bytes:
        """The bytes of `chunk` (after any held ones) to send now."""
        data = self._held + chunk if self._held else chunk
        self._held = b""
        self.holding = False
        end = data.rfind(b"\n\n") + 2
        if end < 2:
            if len(data) > MAX_HELD:
                return data
            self._held = data
            self.holding = True
            return b""
        if end < len(data):
            self._held = data[end:]
            self.holding = True
            data = data[:end]
        if self.null_usage is None:
            self.null_usage = NULL_USAGE in data
        if self.null_usage and NULL_USAGE in data:
            data = data.replace(NULL_USAGE, b"")
        # From the end: the report is the stream's last event before [DONE], so in a read that
        # holds much of the stream it is found without a search through the rest. Only the events
        # around a candidate are looked at, not every event of the read.
        at = data.rfind(EMPTY_CHOICES)
        while at >= 0:
            start = data.rfind(b"\n\n", 0, at) + 2 if at else 0
            start = 0 if start == 1 else start
            end = data.find(b"\n\n", at) + 2
            if _usage_only(data[start : end - 2]):
                data = data[:start] + data[end:]
                self.removed += 1
            at = data.rfind(EMPTY_CHOICES, 0, start)
        return data

    def flush(self) -> bytes:
        """What is still held when the stream ends (an event the engine never finished)."""
        held, self._held = self._held, b""
        self.holding = False
        return held
