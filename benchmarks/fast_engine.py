"""A FAST fake engine for the relay benchmark: answers every generation with 64 SSE chunks at once.

Raw ASGI on uvicorn (uvloop + httptools): the cost per request is what a lean Python server pays,
so the relay's own overhead is what the benchmark shows. Also answers /health and /v1/models so
the sidecar can warm up in front of it. Run: python -m benchmarks.fast_engine PORT
"""

from __future__ import annotations

import sys
from collections.abc import Awaitable, Callable
from typing import Any

import uvicorn

CHUNKS = 64
EVENT = [b'data: {"object":"text_completion","choices":[{"index":0,"text":"tok%d"}]}\n\n' % i for i in range(CHUNKS)]
DONE = b"data: [DONE]\n\n"
# What vLLM adds when a request sets stream_options.include_usage (the sidecar asks for it on
# behalf of a tenant with a tokens limit, and removes it again).
USAGE = b'data: {"object":"text_completion","choices":[],"usage":{"prompt_tokens":1,"completion_tokens":64}}\n\n'
SSE_HEADERS = [(b"content-type", b"text/event-stream")]
JSON_HEADERS = [(b"content-type", b"application/json")]
MODELS = b'{"object":"list","data":[{"id":"palmyra-mini","object":"model","max_model_len":4096,"root":null}]}'
COMPLETION = (
    b'{"object":"text_completion","choices":[{"index":0,"text":"ok"}],'
    b'"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}'
)


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
            for event in EVENT:
                await send({"type": "http.response.body", "body": event, "more_body": True})
            usage = b'"include_usage":true' in body.replace(b" ", b"")
            await send({"type": "http.response.body", "body": USAGE + DONE if usage else DONE})
            return
        payload = COMPLETION
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
