"""A FAST fake engine for the relay benchmark: answers every generation with 64 SSE chunks at once.

Raw ASGI on uvicorn (uvloop + httptools): the cost per request is what a lean Python server pays,
so the relay's own overhead is what the benchmark shows. Also answers /health and /v1/models so
the sidecar can warm up in front of it. Run: python -m benchmarks.fast_engine PORT

Each generation route streams in its own API's shape, 64 token deltas each, written as vLLM 0.32
writes them (tests/unit/data/vllm-typed-events.json holds its recordings):

- `/v1/completions`: 64 `data:` chunks, then the usage event when the request set
  stream_options.include_usage, then `[DONE]`;
- `/v1/chat/completions`: the same with chat's `delta.content`, behind a role-only first chunk;
- `/v1/responses`: typed events (`event: <type>` then `data: {...}`): `response.created`,
  `response.in_progress`, the output item and content part added, 64 `response.output_text.delta`,
  the text, part and item done, and `response.completed` with `response.usage`
  (input_tokens, output_tokens), the response echoed whole as vLLM echoes it;
- `/v1/messages`: Anthropic's events: `message_start` (with the prompt's usage),
  `content_block_start`, 64 `content_block_delta`, `content_block_stop`, `message_delta` with the
  final `usage`, `message_stop`.

The events around the deltas go in the same write as the first and the last delta, as vLLM's do.
A non-streamed generation gets one small body in its route's shape, usage included.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Awaitable, Callable
from typing import Any

import uvicorn

CHUNKS = 64
EVENT = [b'data: {"object":"text_completion","choices":[{"index":0,"text":"tok%d"}]}\n\n' % i for i in range(CHUNKS)]
DONE = b"data: [DONE]\n\n"
# What vLLM adds when a request sets stream_options.include_usage (the sidecar asks for it on every
# stream, and removes it again when the client did not ask).
USAGE = b'data: {"object":"text_completion","choices":[],"usage":{"prompt_tokens":1,"completion_tokens":64}}\n\n'
SSE_HEADERS = [(b"content-type", b"text/event-stream")]
JSON_HEADERS = [(b"content-type", b"application/json")]
MODELS = b'{"object":"list","data":[{"id":"palmyra-mini","object":"model","max_model_len":4096,"root":null}]}'
COMPLETION = (
    b'{"object":"text_completion","choices":[{"index":0,"text":"ok"}],'
    b'"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}'
)
TEXT = "".join(f"tok{i}" for i in range(CHUNKS))


def _compact(value: object) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()


def _typed(kind: str, payload: dict[str, Any]) -> bytes:
    return b"event: " + kind.encode() + b"\ndata: " + _compact(payload) + b"\n\n"


CHAT_ID = "chatcmpl-8f3a9c2e5b7d4e01"
CHAT_FIRST = (
    b'data: {"id":"%s","object":"chat.completion.chunk","created":1796640512,"model":"palmyra-mini",'
    b'"choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}\n\n'
    % CHAT_ID.encode()
)
CHAT_EVENT = [
    b'data: {"id":"%s","object":"chat.completion.chunk","created":1796640512,"model":"palmyra-mini",'
    b'"choices":[{"index":0,"delta":{"content":"tok%d"},"logprobs":null,"finish_reason":null}]}\n\n'
    % (CHAT_ID.encode(), i)
    for i in range(CHUNKS)
]
CHAT_USAGE = (
    b'data: {"id":"%s","object":"chat.completion.chunk","created":1796640512,"model":"palmyra-mini",'
    b'"choices":[],"usage":{"prompt_tokens":9,"total_tokens":73,"completion_tokens":64}}\n\n' % CHAT_ID.encode()
)
CHAT_COMPLETION = _compact(
    {
        "id": CHAT_ID,
        "object": "chat.completion",
        "created": 1796640512,
        "model": "palmyra-mini",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 9, "completion_tokens": 1, "total_tokens": 10},
    }
)

RESP_ID, MSG_ID = "resp_9dc2c6108e1fe7de", "msg_b810860b81e2ee1c"


def _response(status: str, output: list[Any], usage: dict[str, Any] | None) -> dict[str, Any]:
    """The Responses API's response object as vLLM 0.32 streams it (the request echoed)."""
    return {
        "id": RESP_ID,
        "created_at": 1796640512,
        "incomplete_details": None,
        "instructions": None,
        "metadata": None,
        "model": "palmyra-mini",
        "object": "response",
        "output": output,
        "parallel_tool_calls": True,
        "temperature": 1.0,
        "tool_choice": "none",
        "tools": [],
        "top_p": 1.0,
        "background": False,
        "max_output_tokens": CHUNKS,
        "max_tool_calls": None,
        "previous_response_id": None,
        "prompt": None,
        "reasoning": None,
        "service_tier": "auto",
        "status": status,
        "text": None,
        "top_logprobs": None,
        "truncation": "disabled",
        "usage": usage,
        "user": None,
        "presence_penalty": 0.0,
        "frequency_penalty": 0.0,
        "kv_transfer_params": None,
        "ec_transfer_params": None,
        "input_messages": None,
        "output_messages": None,
    }


def _responses_stream() -> list[bytes]:
    part: dict[str, Any] = {"annotations": [], "text": TEXT, "type": "output_text", "logprobs": None}
    item: dict[str, Any] = {
        "id": MSG_ID,
        "content": [part],
        "role": "assistant",
        "status": "completed",
        "type": "message",
        "phase": None,
    }
    usage = {
        "input_tokens": 1,
        "input_tokens_details": {
            "cached_tokens": 0,
            "cache_write_tokens": 0,
            "input_tokens_per_turn": [],
            "cached_tokens_per_turn": [],
        },
        "output_tokens": CHUNKS,
        "output_tokens_details": {
            "reasoning_tokens": 0,
            "tool_output_tokens": 0,
            "output_tokens_per_turn": [],
            "tool_output_tokens_per_turn": [],
        },
        "total_tokens": 1 + CHUNKS,
    }
    seq = iter(range(10_000))
    head = _typed(
        "response.created",
        {"response": _response("in_progress", [], None), "sequence_number": next(seq), "type": "response.created"},
    ) + _typed(
        "response.in_progress",
        {"response": _response("in_progress", [], None), "sequence_number": next(seq), "type": "response.in_progress"},
    )
    opening = _typed(
        "response.output_item.added",
        {
            "item": {**item, "content": [], "status": "in_progress"},
            "output_index": 0,
            "sequence_number": next(seq),
            "type": "response.output_item.added",
        },
    ) + _typed(
        "response.content_part.added",
        {
            "content_index": 0,
            "item_id": MSG_ID,
            "output_index": 0,
            "part": {**part, "text": "", "logprobs": []},
            "sequence_number": next(seq),
            "type": "response.content_part.added",
        },
    )
    deltas = [
        _typed(
            "response.output_text.delta",
            {
                "content_index": 0,
                "delta": f"tok{i}",
                "item_id": MSG_ID,
                "logprobs": [],
                "output_index": 0,
                "sequence_number": next(seq),
                "type": "response.output_text.delta",
            },
        )
        for i in range(CHUNKS)
    ]
    closing = (
        _typed(
            "response.output_text.done",
            {
                "content_index": 0,
                "item_id": MSG_ID,
                "logprobs": [],
                "output_index": 0,
                "sequence_number": next(seq),
                "text": TEXT,
                "type": "response.output_text.done",
            },
        )
        + _typed(
            "response.content_part.done",
            {
                "content_index": 0,
                "item_id": MSG_ID,
                "output_index": 0,
                "part": part,
                "sequence_number": next(seq),
                "type": "response.content_part.done",
            },
        )
        + _typed(
            "response.output_item.done",
            {"item": item, "output_index": 0, "sequence_number": next(seq), "type": "response.output_item.done"},
        )
    )
    completed = _typed(
        "response.completed",
        {
            "response": _response("completed", [item], usage),
            "sequence_number": next(seq),
            "type": "response.completed",
        },
    )
    return [head, opening + deltas[0], *deltas[1:-1], deltas[-1] + closing, completed]


def _messages_stream() -> list[bytes]:
    start = _typed(
        "message_start",
        {
            "type": "message_start",
            "message": {
                "id": "chatcmpl-89c2a0165626ce9f",
                "type": "message",
                "role": "assistant",
                "content": [],
                "model": "palmyra-mini",
                "stop_reason": None,
                "stop_sequence": None,
                "usage": {"input_tokens": 1, "output_tokens": 0},
            },
        },
    ) + _typed(
        "content_block_start",
        {"type": "content_block_start", "content_block": {"type": "text", "text": ""}, "index": 0},
    )
    deltas = [
        _typed(
            "content_block_delta",
            {"type": "content_block_delta", "delta": {"type": "text_delta", "text": f"tok{i}"}, "index": 0},
        )
        for i in range(CHUNKS)
    ]
    stop = _typed("content_block_stop", {"type": "content_block_stop", "index": 0})
    end = _typed(
        "message_delta",
        {
            "type": "message_delta",
            "delta": {"stop_reason": "max_tokens", "stop_sequence": None},
            "usage": {"input_tokens": 1, "output_tokens": CHUNKS},
        },
    ) + _typed("message_stop", {"type": "message_stop"})
    return [start + deltas[0], *deltas[1:], stop, end]


RESPONSES_STREAM = _responses_stream()
MESSAGES_STREAM = _messages_stream()
RESPONSE_BODY = _compact(
    _response(
        "completed",
        [
            {
                "id": MSG_ID,
                "content": [{"annotations": [], "text": "ok", "type": "output_text", "logprobs": None}],
                "role": "assistant",
                "status": "completed",
                "type": "message",
            }
        ],
        {"input_tokens": 1, "output_tokens": 1, "total_tokens": 2},
    )
)
MESSAGE_BODY = _compact(
    {
        "id": "chatcmpl-89c2a0165626ce9f",
        "type": "message",
        "role": "assistant",
        "content": [{"type": "text", "text": "ok"}],
        "model": "palmyra-mini",
        "stop_reason": "end_turn",
        "stop_sequence": None,
        "usage": {"input_tokens": 1, "output_tokens": 1},
    }
)


def stream_of(path: str, body: bytes) -> list[bytes]:
    """The writes of a streamed generation on `path`, as this engine sends them for `body`."""
    if path == "/v1/responses":
        return RESPONSES_STREAM
    if path == "/v1/messages":
        return MESSAGES_STREAM
    usage = b'"include_usage":true' in body.replace(b" ", b"")
    if path == "/v1/chat/completions":
        return [CHAT_FIRST + CHAT_EVENT[0], *CHAT_EVENT[1:], CHAT_USAGE + DONE if usage else DONE]
    return [*EVENT, USAGE + DONE if usage else DONE]


BODIES = {"/v1/chat/completions": CHAT_COMPLETION, "/v1/responses": RESPONSE_BODY, "/v1/messages": MESSAGE_BODY}

Message = dict[str, Any]


async def app(
    scope: dict[str, Any], receive: Callable[[], Awaitable[Message]], send: Callable[[Message], Awaitable[None]]
) -> None:
    if scope["type"] == "lifespan":
        while True:
            msg = await receive()
            if msg["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            else:
                await send({"type": "lifespan.shutdown.complete"})
                return
    path = scope["path"]
    if scope["method"] == "POST":
        body = b""
        more = True
        while more:
            msg = await receive()
            body += msg.get("body", b"")
            more = msg.get("more_body", False)
        if b'"stream":true' in body.replace(b" ", b""):
            await send({"type": "http.response.start", "status": 200, "headers": SSE_HEADERS})
            *writes, last = stream_of(path, body)
            for write in writes:
                await send({"type": "http.response.body", "body": write, "more_body": True})
            await send({"type": "http.response.body", "body": last})
            return
        payload = BODIES.get(path, COMPLETION)
    elif path == "/v1/models":
        payload = MODELS
    else:
        payload = b"{}"
    await send({"type": "http.response.start", "status": 200, "headers": JSON_HEADERS})
    await send({"type": "http.response.body", "body": payload})


if __name__ == "__main__":
    uvicorn.run(
        app,
        host="127.0.0.1",
        port=int(sys.argv[1]),
        loop="uvloop",
        http="httptools",
        access_log=False,
        log_level="warning",
        backlog=4096,
    )
