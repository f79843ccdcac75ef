"""The error shapes of the APIs a route speaks besides OpenAI's (errors.py writes OpenAI's).

Anthropic's Messages API answers `{"type": "error", "error": {"type": ..., "message": ...}}`, the
error type named by the status (Anthropic's own table), and in a stream an `error` event of the same
body; its SDK maps the status to its exception and reads the message from there. OpenAI's
Responses API ends a stream that fails with an `error` event whose data carries `type`, `code`,
`message` and `param`. Every error the sidecar writes on those routes, its own and the engine's
rebuilt ones, goes out in that route's shape; the request id rides along as Anthropic's does.
"""

from __future__ import annotations

import orjson

# Anthropic's error types by HTTP status (its API's errors page); any other status by its class.
ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    503: "overloaded_error",
    529: "overloaded_error",
}


def anthropic_type(status: int) -> str:
    return ANTHROPIC_TYPES.get(status) or ("invalid_request_error" if 400 <= status < 500 else "api_error")


def anthropic_body(status: int, message: str, request_id: str | None) -> bytes:
    body: dict[str, object] = {"type": "error", "error": {"type": anthropic_type(status), "message": message}}
    if request_id is not None:
        body["request_id"] = request_id
    return orjson.dumps(body)


def anthropic_event(status: int, message: str) -> bytes:
    """The same error as the stream's last event."""
    return b"event: error\ndata: " + anthropic_body(status, message, None) + b"\n\n"


def responses_event(code: str, message: str, param: str | None) -> bytes:
    """A Responses stream's `error` event (its sequence number unknown to the relay: 0)."""
    data = {"type": "error", "code": code, "message": message, "param": param, "sequence_number": 0}
    return b"event: error\ndata: " + orjson.dumps(data) + b"\n\n"


def anthropic_from_openai(status: int, openai_body: bytes, request_id: str | None) -> bytes:
    """An OpenAI-shaped error body (errors.from_engine's) in Anthropic's shape."""
    try:
        message = orjson.loads(openai_body)["error"]["message"]
    except (orjson.JSONDecodeError, KeyError, TypeError):
        message = None
    return anthropic_body(status, message if isinstance(message, str) else "error", request_id)
