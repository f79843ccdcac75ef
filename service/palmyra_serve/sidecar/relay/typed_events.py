"""Accounting of the Responses and Messages APIs: their typed event streams and their JSON bodies.

Both APIs stream named events (`event: <type>` then `data: {"type": <type>, ...}`), not chat's
choices, and always report usage, unasked: the Responses API in its last event
(`response.completed`, or `.incomplete` / `.failed`, under `response.usage`), the Messages API in
`message_start` (the prompt) and `message_delta` (the final count). Their counts are named
`input_tokens` and `output_tokens`; Anthropic's input leaves out the prompt tokens read from or
written to its cache, which are added back. They are kept under chat's names (`prompt_tokens`,
`completion_tokens`) so that the relay's accounting reads every API alike.

The streams reuse SseAccount's framing (relay/sse.py: events split at blank lines, an unfinished
one carried to the next read, an event over MAX_EVENT_BYTES skipped); only what an event means
differs. A token event is a text, reasoning or tool-argument delta; the events around them
(created, in progress, item and part added or done, block start and stop) carry none.

A non-streamed body is kept whole up to MAX_BODY_BYTES and parsed once at its end: these APIs echo
the request (instructions, tools and their schemas, metadata) in the response, so a `"usage"` key
can be written by the client at any depth, and only a parse tells the top-level one apart (chat's
byte scanner, relay/usage.py, relies on chat's responses echoing nothing). A body over the cap,
like a stream whose usage event was skipped, has no usage: the relay then charges the tenant its
whole reservation (relay/handler.py, tokens_spent), never less.
"""

from __future__ import annotations

from typing import Any

import orjson

from palmyra_serve.sidecar.core.routes import Api
from palmyra_serve.sidecar.relay.sse import MAX_EVENT_BYTES, SseAccount

# What a non-streamed body of these APIs may be to have its usage read: the same as one event of a
# stream (memory_budget.py counts one or the other per generation).
MAX_BODY_BYTES = MAX_EVENT_BYTES

RESPONSES_TOKEN_EVENTS = frozenset(
    {
        "response.output_text.delta",
        "response.reasoning_text.delta",
        "response.function_call_arguments.delta",
        "response.refusal.delta",
    }
)
RESPONSES_FINAL_EVENTS = frozenset({"response.completed", "response.incomplete", "response.failed"})


def usage_of(api: Api, usage: Any) -> dict[str, int] | None:
    """Usage in chat's names: prompt_tokens (Anthropic's input plus its cache reads and writes) and
    completion_tokens; None when `usage` is not a report."""
    if not isinstance(usage, dict):
        return None
    output = usage.get("output_tokens")
    prompt = usage.get("input_tokens")
    if output.__class__ is not int or prompt.__class__ is not int:
        return None
    if api is Api.MESSAGES:
        for cached in ("cache_read_input_tokens", "cache_creation_input_tokens"):
            if (more := usage.get(cached)).__class__ is int:
                prompt += more
    return {"prompt_tokens": prompt, "completion_tokens": output}


class TypedEventAccount(SseAccount):
    """SseAccount's framing; each event read by its `type` (typed())."""

    __slots__ = ()
    # No event of these APIs has `choices`: every read is parsed in full.
    plain_decoders = ()
    one_event_decoders = ()

    def _payload(self, payload: Any, now: float) -> None:
        if isinstance(payload, dict):
            self.typed(payload.get("type"), payload, now)
        else:
            self.unparsed += 1

    def typed(self, kind: Any, payload: dict[str, Any], now: float) -> None:
        raise NotImplementedError

    def _token(self, now: float) -> None:
        self.per_choice[0] = self.per_choice.get(0, 0) + 1
        self.token_events += 1
        if not self.first_token:
            self.first_token = now
        self.last_token = now


class ResponsesAccount(TypedEventAccount):
    __slots__ = ()

    def typed(self, kind: Any, payload: dict[str, Any], now: float) -> None:
        if kind in RESPONSES_TOKEN_EVENTS:
            if payload.get("delta"):
                self._token(now)
        elif kind in RESPONSES_FINAL_EVENTS:
            response = payload.get("response")
            if isinstance(response, dict) and (usage := usage_of(Api.RESPONSES, response.get("usage"))):
                self.usage = usage
            if kind == "response.failed":
                self.error = True  # the generation failed inside the engine
        elif kind == "error":
            self.error = True


class MessagesAccount(TypedEventAccount):
    __slots__ = ()

    def typed(self, kind: Any, payload: dict[str, Any], now: float) -> None:
        if kind == "content_block_delta":
            delta = payload.get("delta")
            if isinstance(delta, dict) and (delta.get("text") or delta.get("partial_json") or delta.get("thinking")):
                self._token(now)
        elif kind == "message_delta":
            if usage := usage_of(Api.MESSAGES, payload.get("usage")):
                self.usage = usage
        elif kind == "message_start":
            message = payload.get("message")
            if isinstance(message, dict) and (usage := usage_of(Api.MESSAGES, message.get("usage"))):
                self.usage = usage
        elif kind == "error":
            # Anthropic's error types name the party at fault: a request the engine refused mid-way
            # is the client's, anything else the engine's.
            error = payload.get("error")
            self.error = self.error or not (isinstance(error, dict) and error.get("type") == "invalid_request_error")


class BodyUsage:
    """The usage of a non-streamed body of these APIs: the body kept up to MAX_BODY_BYTES, parsed at
    its end for its top-level `usage`."""

    __slots__ = ("_api", "_held", "_size")

    def __init__(self, api: Api) -> None:
        self._api = api
        self._held: list[bytes] | None = []  # None once the body outgrew the cap
        self._size = 0

    def feed(self, chunk: bytes) -> None:
        if self._held is None:
            return
        self._size += len(chunk)
        if self._size > MAX_BODY_BYTES:
            self._held = None
            return
        self._held.append(chunk)

    def usage(self) -> dict[str, int] | None:
        if self._held is None:
            return None
        try:
            payload = orjson.loads(b"".join(self._held))
        except orjson.JSONDecodeError:
            return None
        return usage_of(self._api, payload.get("usage")) if isinstance(payload, dict) else None
