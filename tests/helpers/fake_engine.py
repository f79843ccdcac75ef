"""A FAKE engine that misbehaves on purpose, for the app tier (faults the real vLLM cannot be made
to produce on demand). It speaks just enough of vLLM's surface: /health, /v1/models and
/v1/completions + /v1/chat/completions, streaming and not.

The behaviour of a generation request is picked by its prompt (or the last chat message):
  "fake:die"       stream 3 chunks, then drop the connection
  "fake:hang"      accept and never answer
  "fake:garbage"   answer bytes that are not HTTP
  "fake:error"     400 with an OpenAI error body
  "fake:leaky-500"    500 whose body holds a traceback with a token, with set-cookie, a CORS grant
                      and an internal x- header (none of which may reach a client)
  "fake:slow"      stream chunks 0.3 s apart
  "fake:fat-tokens"   stream tokens of 16 KiB each (a slow reader's buffers fill at once)
  "fake:tricky-sse"   a stream whose reads split the `data: ` marker and the usage event, whose
                      text contains "data: ", with two choices (n=2) and a usage report
  "fake:interim"      100 Continue and 103 Early Hints before the real (JSON) answer
  "fake:close-delimited"  a JSON answer with neither length nor chunks, ended by closing
  "fake:trailers"     a chunked JSON answer with trailer fields after its last chunk
  "fake:big-head"     a response head with 500 header fields
  "fake:cut-body"     a JSON answer whose connection closes halfway through its Content-Length
  "fake:read-and-close"  read the request, then close without a byte (counted in stats)
anything else: a normal answer (max_tokens chunks when streaming).
/v1/responses and /v1/messages answer in their APIs' shapes (as vLLM writes them: typed events,
usage unasked), picked by the input (the last message's text): "fake:hang" as above, "fake:echo"
an answer whose last event (or body) echoes 100 KB, past what the relay's accounting holds.
POST /fake/control {"health": "ok"|"fail"|"hang", "generate": "ok"|"fail"|"hang",
"metrics": "ok"|"huge"|"fail", "metrics_bytes": N, "first_delay_s": S, "token_delay_s": S, "generate_delay": S}
changes the
default behaviour (first/token delays: the latency of a normal stream, before its first chunk and
between chunks, which the adaptive-admission tests turn up and down; generate_delay: every
generation waits that long before answering at all; "one_write": true writes a whole stream, [DONE]
included, in one write, as a fast engine or a coalescing network delivers it; "tokenize_delay_s": S,
how long /tokenize takes; "max_running": N, at most N generations at once, the rest waiting in
arrival order before they start, as vLLM's scheduler keeps requests waiting while its batch is
full (0: no limit; with first_delay_s and one_write it is an engine of a known capacity,
N / first_delay_s requests per second: benchmarks/overload.py); metrics_bytes: GET /metrics
renders a page of about N bytes whose first series, fake_rendered_at_seconds, is the wall-clock
time it was rendered at; 0: the small page);
GET /fake/stats reports what it saw (aborted streams, request ids, `metrics_renders`: how many
/metrics pages it rendered). GET /metrics is a small Prometheus page in vLLM's names.
Run: python fake_engine.py PORT [--start-delay S] [--generate-delay S]
(--start-delay: listen only after S seconds, as an engine loading and compiling; --generate-delay:
every generation waits S seconds first, as a cold engine's first requests do.)
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from typing import Any, TypedDict

from aiohttp import web
from aiohttp.typedefs import Handler

# The fault knobs: set from the tests' JSON (STATE.update), so any value; read through float()/int().
STATE: dict[str, Any] = {
    "health": "ok",
    "generate": "ok",
    "metrics": "ok",
    "metrics_bytes": 0,
    "first_delay_s": 0.0,
    "token_delay_s": 0.0,
    "generate_delay": 0.0,
    "one_write": False,
    "tokenize_delay_s": 0.0,
    "max_running": 0,
}
LEAKED_SECRET = "sk-live-LEAKED-0123"  # in the leaky 500's body: a client must never see it
METRICS_PAGE = (
    b"# HELP vllm:num_requests_running Number of requests in model execution batches.\n"
    b"# TYPE vllm:num_requests_running gauge\n"
    b'vllm:num_requests_running{engine="0",model_name="palmyra-mini"} 0.0\n'
    b"# HELP vllm:num_requests_waiting Number of requests waiting to be processed.\n"
    b"# TYPE vllm:num_requests_waiting gauge\n"
    b'vllm:num_requests_waiting{engine="0",model_name="palmyra-mini"} 0.0\n'
)
METRICS_TYPE = "text/plain; version=0.0.4; charset=utf-8"
USAGE_TRICKY = {"prompt_tokens": 3, "completion_tokens": 6, "total_tokens": 9}


class Stats(TypedDict):
    """What the engine saw, for the tests to assert on."""

    requests: int
    aborted: int
    completed: int
    request_ids: list[str | None]
    auth: list[str | None]
    traceparents: list[str | None]
    paths: list[str]
    headers: dict[str, str]
    tokenizing: int
    tokenizing_max: int
    metrics_renders: int
    running: int
    waiting: int
    bodies: list[dict]


STATS: Stats = {
    "requests": 0,
    "aborted": 0,
    "completed": 0,
    "request_ids": [],
    "auth": [],
    "traceparents": [],
    "paths": [],
    "headers": {},
    "tokenizing": 0,
    "tokenizing_max": 0,
    "metrics_renders": 0,
    "running": 0,
    "waiting": 0,
    "bodies": [],
}
SLOTS: dict[int, asyncio.Semaphore] = {}  # one per max_running value, made on first use


@web.middleware
async def record(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Every client request that reached the engine (raw target and headers): what the sidecar let through."""
    if not request.path.startswith("/fake/") and request.path != "/health":
        STATS["paths"].append(request.raw_path)
        STATS["headers"] = dict(request.headers)
    return await handler(request)


FAT_TOKEN_BYTES = 16384


def _chunk(i: int, chat: bool, pad: int = 0) -> bytes:
    text = f"t{i}".ljust(pad, "x")
    if chat:
        payload = {"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"content": text}}]}
    else:
        payload = {"object": "text_completion", "choices": [{"index": 0, "text": text}]}
    return b"data: " + json.dumps(payload).encode() + b"\n\n"


def _socket(request: web.Request) -> asyncio.Transport:
    transport = request.transport
    assert transport is not None, "the client's connection is already gone"
    return transport


def _raw(request: web.Request, data: bytes) -> None:
    """Write bytes straight to the socket (faults aiohttp would not produce) and close it."""
    transport = _socket(request)
    transport.write(data)
    transport.close()


def _tricky_stream() -> list[bytes]:
    """Reads of a stream the old count-the-markers accounting got wrong: 6 tokens in 2 choices."""

    def ev(choice: int, text: str) -> bytes:
        return (
            b"data: "
            + json.dumps({"object": "text_completion", "choices": [{"index": choice, "text": text}]}).encode()
            + b"\n\n"
        )

    usage = b"data: " + json.dumps({"object": "text_completion", "choices": [], "usage": USAGE_TRICKY}).encode()
    stream = (
        ev(0, "data: ")
        + ev(1, "a")
        + ev(0, "x\n\ndata: y")
        + ev(1, "b")
        + ev(0, "c")
        + ev(1, "data: [DONE]")
        + usage
        + b"\n\ndata: [DONE]\n\n"
    )
    cuts = [2, stream.index(b"data: ", 10) + 3, stream.index(b'"completion_tokens"') + 4, len(stream) - 3]
    return [stream[a:b] for a, b in zip([0, *cuts], [*cuts, len(stream)], strict=True)]


async def engine_metrics(_: web.Request) -> web.Response:
    STATS["metrics_renders"] += 1
    if STATE["metrics"] == "fail":
        return web.Response(status=500, text="metrics broke")
    if STATE["metrics_bytes"]:
        stamp = b"fake_rendered_at_seconds %.6f\n" % time.time()
        body = stamp + METRICS_PAGE * max(0, (int(STATE["metrics_bytes"]) - len(stamp)) // len(METRICS_PAGE))
    else:
        body = METRICS_PAGE * (200_000 if STATE["metrics"] == "huge" else 1)
    return web.Response(body=body, headers={"Content-Type": METRICS_TYPE})


async def health(_: web.Request) -> web.Response:
    if STATE["health"] == "hang":
        await asyncio.sleep(3600)
    if STATE["health"] == "fail":
        return web.Response(status=503, text="engine dead")
    return web.Response(text="")


async def models(_: web.Request) -> web.Response:
    return web.json_response(
        {
            "object": "list",
            "data": [{"id": "palmyra-mini", "object": "model", "root": "/nonexistent/fake", "max_model_len": 2048}],
        }
    )


async def stats(_: web.Request) -> web.Response:
    return web.json_response(STATS)


async def control(request: web.Request) -> web.Response:
    STATE.update(await request.json())
    return web.json_response(STATE)


async def generate(request: web.Request) -> web.StreamResponse:
    """A generation, in one of max_running slots when that is set (GET /fake/stats: running, waiting)."""
    limit = int(STATE["max_running"])
    if not limit:
        return await _generate(request)
    slots = SLOTS.setdefault(limit, asyncio.Semaphore(limit))
    STATS["waiting"] += 1
    try:
        await slots.acquire()
    finally:
        STATS["waiting"] -= 1
    STATS["running"] += 1
    try:
        return await _generate(request)
    finally:
        STATS["running"] -= 1
        slots.release()


async def _generate(request: web.Request) -> web.StreamResponse:
    STATS["requests"] += 1
    STATS["request_ids"].append(request.headers.get("x-request-id"))
    STATS["auth"].append(request.headers.get("authorization"))
    STATS["traceparents"].append(request.headers.get("traceparent"))
    body = await request.json()
    STATS["bodies"] = [*STATS["bodies"][-19:], body]  # the last 20, as the engine got them
    if STATE["generate_delay"]:
        await asyncio.sleep(float(STATE["generate_delay"]))
    chat = "messages" in body
    prompt = body["messages"][-1]["content"] if chat else body.get("prompt")
    mode = prompt if isinstance(prompt, str) and prompt.startswith("fake:") else f"fake:{STATE['generate']}"
    n = int(body.get("max_tokens") or 4)
    if mode == "fake:hang":
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:  # the caller went away: what vLLM counts as an abort
            STATS["aborted"] += 1
            raise
    if mode == "fake:fail":
        return web.json_response(
            {"error": {"message": "engine core died", "type": "InternalServerError", "param": None, "code": 500}},
            status=500,
        )
    if mode == "fake:leaky-500":
        detail = f'Traceback (most recent call last):\n  File "/srv/engine.py"\nKeyError: api_key={LEAKED_SECRET}'
        return web.json_response(
            {"error": {"message": detail, "type": "InternalServerError", "param": None, "code": 500}},
            status=500,
            headers={"set-cookie": "session=abc", "access-control-allow-origin": "*", "x-engine-internal": "node-7"},
        )
    if mode == "fake:error":
        return web.json_response(
            {
                "error": {
                    "message": "bad sampling parameter",
                    "type": "BadRequestError",
                    "param": "temperature",
                    "code": 400,
                }
            },
            status=400,
        )
    if mode == "fake:huge-404":
        # What vLLM does with an unknown model name of 70 KB: echoes it in its 404's message.
        message = "The model `" + "x" * 100_000 + "` does not exist."
        return web.json_response(
            {"error": {"message": message, "type": "NotFoundError", "param": "model", "code": 404}}, status=404
        )
    if mode == "fake:read-and-close":
        _socket(request).close()
        await asyncio.sleep(0.1)
        return web.Response()
    answer = json.dumps(
        {
            "object": "text_completion",
            "choices": [{"index": 0, "text": "t0t1"}],
            "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5},
        }
    ).encode()
    raw = {
        "fake:interim": (
            b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nlink: </x>\r\n\r\n"
            b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nconnection: close\r\n"
            b"content-length: %d\r\n\r\n%s" % (len(answer), answer)
        ),
        "fake:close-delimited": b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n\r\n" + answer,
        "fake:trailers": (
            b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n"
            b"trailer: x-smuggled\r\nconnection: close\r\n\r\n%x\r\n%s\r\n0\r\n"
            b"x-smuggled: 1\r\nset-cookie: evil=1\r\n\r\n" % (len(answer), answer)
        ),
        "fake:big-head": (
            b"HTTP/1.1 200 OK\r\n" + b"".join(b"x-h%d: v\r\n" % i for i in range(500)) + b"content-length: 2\r\n\r\n{}"
        ),
        "fake:cut-body": (
            b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s"
            % (len(answer) * 2, answer)
        ),
    }
    if mode in raw:
        _raw(request, raw[mode])
        await asyncio.sleep(0.1)
        return web.Response()
    if mode == "fake:tricky-sse":
        resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await resp.prepare(request)
        for piece in _tricky_stream():
            await resp.write(piece)
            await asyncio.sleep(0.02)  # separate reads at the relay
        await resp.write_eof()
        STATS["completed"] += 1
        return resp
    if mode == "fake:garbage":
        _raw(request, b"\x00\x01 this is not HTTP\r\n\r\n")
        await asyncio.sleep(0.1)
        return web.Response()
    if not body.get("stream"):
        text = "".join(f"t{i}" for i in range(n))
        STATS["completed"] += 1
        return web.json_response(
            {
                "object": "text_completion",
                "choices": [{"index": 0, "text": text}],
                "usage": {"prompt_tokens": 3, "completion_tokens": n, "total_tokens": n + 3},
            }
        )
    resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
    await resp.prepare(request)
    delay = 0.3 if mode == "fake:slow" else float(STATE["token_delay_s"])
    try:
        if STATE["first_delay_s"]:
            await asyncio.sleep(float(STATE["first_delay_s"]))
        if STATE["one_write"]:
            await resp.write(b"".join(_chunk(i, chat) for i in range(n)) + b"data: [DONE]\n\n")
            n = 0
        for i in range(n):
            if mode == "fake:die" and i == 3:
                _socket(request).close()  # the engine vanishes mid-stream
                return resp
            await resp.write(_chunk(i, chat, FAT_TOKEN_BYTES if mode == "fake:fat-tokens" else 0))
            if delay:
                await asyncio.sleep(delay)
        options = body.get("stream_options")
        if n and isinstance(options, dict) and options.get("include_usage"):
            # As vLLM writes it: compact JSON, no choices, just before [DONE].
            usage = {"prompt_tokens": 3, "completion_tokens": n, "total_tokens": n + 3}
            event = {"id": "cmpl-fake", "object": "text_completion", "choices": [], "usage": usage}
            await resp.write(b"data: " + json.dumps(event, separators=(",", ":")).encode() + b"\n\n")
        if n:
            await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        STATS["completed"] += 1
    except (ConnectionResetError, asyncio.CancelledError):
        STATS["aborted"] += 1
        raise
    return resp


def _typed_event(payload: dict[str, Any]) -> bytes:
    return f"event: {payload['type']}\ndata: {json.dumps(payload, separators=(',', ':'))}\n\n".encode()


async def typed_generate(request: web.Request) -> web.StreamResponse:
    """The Responses and Messages APIs: usage in their own names, always reported."""
    STATS["requests"] += 1
    body = await request.json()
    STATS["bodies"] = [*STATS["bodies"][-19:], body]
    messages = request.path == "/v1/messages"
    given = body.get("messages")[-1]["content"] if messages else body.get("input")
    mode = given if isinstance(given, str) and given.startswith("fake:") else "fake:ok"
    n = int(body.get("max_tokens" if messages else "max_output_tokens") or 4)
    if mode == "fake:hang":
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            STATS["aborted"] += 1
            raise
    echo = "x" * 100_000 if mode == "fake:echo" else None
    n = 1 if echo else n  # a short answer whose report the relay cannot hold: it charges the reservation
    text = "".join(f"t{i}" for i in range(n))
    usage = {"input_tokens": 3, "output_tokens": n}
    whole: dict[str, Any]
    if messages:
        blocks = [{"type": "text", "text": text}] + ([{"type": "text", "text": echo}] if echo else [])
        whole = {"type": "message", "role": "assistant", "content": blocks, "usage": usage}
    else:
        whole = {"object": "response", "instructions": echo, "output": [{"content": [{"text": text}]}], "usage": usage}
    if not body.get("stream"):
        STATS["completed"] += 1
        return web.json_response(whole)
    resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
    await resp.prepare(request)
    try:
        if messages:
            start = {"type": "message", "role": "assistant", "content": [], "usage": {**usage, "output_tokens": 0}}
            await resp.write(_typed_event({"type": "message_start", "message": start}))
        for i in range(n):
            delta = {"type": "text_delta", "text": f"t{i}"}
            event = {"type": "content_block_delta", "index": 0, "delta": delta}
            await resp.write(
                _typed_event(event if messages else {"type": "response.output_text.delta", "delta": f"t{i}"})
            )
            if STATE["token_delay_s"]:
                await asyncio.sleep(float(STATE["token_delay_s"]))
        if messages:
            if echo:
                await resp.write(
                    _typed_event({"type": "content_block_delta", "delta": {"type": "text_delta", "text": echo}})
                )
            await resp.write(
                _typed_event({"type": "message_delta", "delta": {"stop_reason": "max_tokens"}, "usage": usage})
            )
            await resp.write(_typed_event({"type": "message_stop"}))
        else:
            await resp.write(_typed_event({"type": "response.completed", "response": whole}))
        await resp.write_eof()
        STATS["completed"] += 1
    except (ConnectionResetError, asyncio.CancelledError):
        STATS["aborted"] += 1
        raise
    return resp


async def tokenize(request: web.Request) -> web.Response:
    """/tokenize and /detokenize: how many run at once is what the sidecar's gate bounds."""
    await request.read()
    STATS["tokenizing"] += 1
    STATS["tokenizing_max"] = max(STATS["tokenizing_max"], STATS["tokenizing"])
    try:
        await asyncio.sleep(float(STATE["tokenize_delay_s"]))
    finally:
        STATS["tokenizing"] -= 1
    return web.json_response({"count": 2, "max_model_len": 2048, "tokens": [1, 2]})


def main() -> None:
    port = int(sys.argv[1])
    if "--start-delay" in sys.argv:
        time.sleep(float(sys.argv[sys.argv.index("--start-delay") + 1]))
    if "--generate-delay" in sys.argv:
        STATE["generate_delay"] = float(sys.argv[sys.argv.index("--generate-delay") + 1])
    app = web.Application(middlewares=[record])
    app.router.add_get("/health", health)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/metrics", engine_metrics)
    app.router.add_post("/v1/completions", generate)
    app.router.add_post("/v1/chat/completions", generate)
    app.router.add_post("/v1/responses", typed_generate)
    app.router.add_post("/v1/messages", typed_generate)
    app.router.add_post("/tokenize", tokenize)
    app.router.add_post("/detokenize", tokenize)
    app.router.add_get("/fake/stats", stats)
    app.router.add_post("/fake/control", control)
    web.run_app(app, host="127.0.0.1", port=port, print=None, handler_cancellation=True)


if __name__ == "__main__":
    main()
