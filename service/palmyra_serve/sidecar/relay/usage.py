"""The usage report of a non-streamed JSON response, found as the body passes, never kept whole.

The relay forwards the engine's bytes unchanged; this watches them for the `"usage"` key and keeps
only its value (a few dozen bytes). vLLM writes usage after `choices` but before fields such as
`prompt_logprobs` and `kv_transfer_params`, so nothing here relies on usage being last, first or
at any offset.

Why a byte search finds only real keys: inside a JSON string every `"` is escaped, so the byte
before it is a backslash. A `"usage"` whose opening quote is not preceded by a backslash opens a
string (a closing quote followed by `usage"` is not JSON), and when `:` follows, that string is an
object key. Generated text, tool arguments and every other string value cannot produce one.

What is not known without parsing everything is the key's depth. vLLM's responses carry no other
`usage` key, so exactly one is the report; two or more (an unknown nested object) is ambiguous and
yields none, as does a value that is not a JSON object of at most MAX_USAGE_BYTES. Cost per read:
one bytes.find, plus a walk of the value's few bytes.
"""

from __future__ import annotations

from typing import Any

import orjson

KEY = b'"usage"'
# OpenAI's usage with vLLM's details is under 200 bytes; more is not a usage report.
MAX_USAGE_BYTES = 4 * 1024
# Whitespace tolerated between the key, its colon and the value (vLLM writes none): a candidate
# whose value has not begun within this many bytes is dropped.
MAX_GAP_BYTES = 256
_WS = frozenset(b" \t\r\n")
_OPEN, _CLOSE, _QUOTE, _BACKSLASH, _COLON = ord("{"), ord("}"), ord('"'), ord("\\"), ord(":")


class UsageScanner:
    __slots__ = ("_capture", "_depth", "_escape", "_in_string", "_tail", "found", "overlong")

    def __init__(self) -> None:
        self._tail = b""  # unsearched end of the previous read (a key or its colon split across reads)
        self._capture: bytearray | None = None  # the usage object being collected
        self._depth = 0
        self._in_string = False
        self._escape = False
        self.found: list[Any] = []  # every parsed value of a `"usage": {...}` key
        self.overlong = False

    def feed(self, chunk: bytes) -> None:
        data = self._tail + chunk if self._tail else chunk
        self._tail = b""
        pos = 0
        if self._capture is not None:
            pos = self._collect(data, 0)
            if pos < 0:
                return
        size = len(data)
        while True:
            i = data.find(KEY, pos)
            if i < 0:
                # A key may start in the last len(KEY) - 1 bytes; keep them and the byte before.
                self._tail = data[max(pos, size - len(KEY)) :]
                return
            if i == 0 or data[i - 1] == _BACKSLASH:
                pos = i + 1  # inside a string (or no byte before it to tell): not a key
                continue
            j = _skip_space(data, i + len(KEY))
            if j < size and data[j] == _COLON:
                j = _skip_space(data, j + 1)
                if j < size and data[j] == _OPEN:
                    self._capture = bytearray()
                    self._depth = 0
                    self._in_string = self._escape = False
                    pos = self._collect(data, j)
                    if pos < 0:
                        return
                    continue
            if j >= size:  # the read ended before the value began: resume here with the next one
                if size - i <= MAX_GAP_BYTES:
                    self._tail = data[i - 1 :]
                return
            pos = j  # a string "usage" that is a value, or a usage that is not an object

    def _collect(self, data: bytes, start: int) -> int:
        """Add the usage object's bytes from data[start:]; the index after it, or -1 if it goes on."""
        capture = self._capture
        assert capture is not None
        depth, in_string, escape = self._depth, self._in_string, self._escape
        end = -1
        stop = min(len(data), start + MAX_USAGE_BYTES + 1 - len(capture))
        for k in range(start, stop):
            c = data[k]
            if in_string:
                if escape:
                    escape = False
                elif c == _BACKSLASH:
                    escape = True
                elif c == _QUOTE:
                    in_string = False
            elif c == _QUOTE:
                in_string = True
            elif c == _OPEN:
                depth += 1
            elif c == _CLOSE:
                depth -= 1
                if depth == 0:
                    end = k + 1
                    break
        if end < 0:
            capture += data[start:stop]
            if len(capture) > MAX_USAGE_BYTES:
                self.overlong = True
                self._capture = None
                return stop
            self._depth, self._in_string, self._escape = depth, in_string, escape
            return -1
        capture += data[start:end]
        self._capture = None
        try:
            self.found.append(orjson.loads(capture))
        except orjson.JSONDecodeError:
            self.overlong = True  # not JSON after all: no report can be trusted
        return end

    def usage(self) -> dict[str, Any] | None:
        """The engine's usage report: the one `usage` object in the body, else None."""
        if len(self.found) != 1 or self.overlong or self._capture is not None:
            return None
        usage = self.found[0]
        return usage if isinstance(usage, dict) else None


def _skip_space(data: bytes, j: int) -> int:
    size = len(data)
    while j < size and data[j] in _WS:
        j += 1
    return j
