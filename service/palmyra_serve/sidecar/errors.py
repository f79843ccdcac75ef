"""OpenAI-shaped errors: the one place that maps a failure to a status, a body and headers.

Upstream error bodies are relayed unchanged by the proxy; everything here is an error the sidecar
itself decides (its own rejections, or an engine it cannot talk to). The error code is also the
metric label: a rejection counts in palmyra_rejections_total{reason=<code>}, a failure talking to
the engine in palmyra_upstream_errors_total{kind=<code>} (reason == code, one vocabulary).
"""

from __future__ import annotations

from dataclasses import dataclass

import orjson


@dataclass(frozen=True)
class ApiError(Exception):
    status: int
    message: str
    type: str
    code: str
    param: str | None = None
    retry_after: int | None = None

    def body(self) -> bytes:
        return orjson.dumps(
            {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}
        )

    def headers(self, request_id: str) -> list[tuple[bytes, bytes]]:
        out = [(b"content-type", b"application/json"), (b"x-request-id", request_id.encode())]
        if self.retry_after is not None:
            out.append((b"retry-after", str(self.retry_after).encode()))
        return out

    def sse_event(self) -> bytes:
        """The same error as a final server-sent event, for streams that already started."""
        return b"data: " + self.body() + b"\n\ndata: [DONE]\n\n"


# Codes of failures talking to the engine (engine_pool.py raises them, upstream() maps them).
ENGINE_UNAVAILABLE = "engine_unavailable"  # connection refused or unreachable: nothing was sent
ENGINE_TIMEOUT = "engine_timeout"  # no connection, or silence past the read timeout
BAD_UPSTREAM = "bad_upstream"  # not HTTP, a head over the limits, closed with no answer
STREAM_INTERRUPTED = "stream_interrupted"  # closed in the middle of a body
UPSTREAM_CODES = (ENGINE_UNAVAILABLE, ENGINE_TIMEOUT, BAD_UPSTREAM, STREAM_INTERRUPTED)
# Codes of the sidecar's own refusals, pre-created as palmyra_rejections_total series; a code
# added below counts the same way (its series appears on first use).
REJECTION_CODES = ("queue_full", "queue_timeout", "request_too_large", "request_timeout", "max_tokens_too_large",
                   "invalid_json", "draining", "invalid_api_key")


def unauthorized() -> ApiError:
    return ApiError(401, "Invalid or missing API key. Send it as 'Authorization: Bearer <key>'.",
                    "authentication_error", "invalid_api_key")


def body_too_large(limit: int) -> ApiError:
    return ApiError(413, f"Request body exceeds the limit of {limit} bytes.", "invalid_request_error",
                    "request_too_large")


def body_timeout() -> ApiError:
    return ApiError(408, "The request body was not received in time.", "invalid_request_error", "request_timeout")


def max_tokens_too_large(asked: int, cap: int, param: str) -> ApiError:
    return ApiError(400, f"{param}={asked} exceeds this service's limit of {cap}.", "invalid_request_error",
                    "max_tokens_too_large", param=param)


def invalid_json() -> ApiError:
    return ApiError(400, "The request body is not valid JSON.", "invalid_request_error", "invalid_json")


def queue_full(retry_after: int) -> ApiError:
    return ApiError(429, "The service is at capacity; retry shortly.", "rate_limit_error", "queue_full",
                    retry_after=retry_after)


def queue_timeout(retry_after: int) -> ApiError:
    return ApiError(429, "The request waited too long for a free slot; retry shortly.", "rate_limit_error",
                    "queue_timeout", retry_after=retry_after)


def draining(retry_after: int) -> ApiError:
    return ApiError(503, "This replica is shutting down; retry on another.", "service_unavailable",
                    "draining", retry_after=retry_after)


def engine_unavailable(retry_after: int) -> ApiError:
    return ApiError(503, "The inference engine is not reachable.", "service_unavailable", "engine_unavailable",
                    retry_after=retry_after)


def engine_timeout() -> ApiError:
    return ApiError(504, "The inference engine did not answer in time.", "timeout", "engine_timeout")


def bad_upstream() -> ApiError:
    return ApiError(502, "The inference engine's answer could not be read.", "bad_gateway", "bad_upstream")


def stream_interrupted() -> ApiError:
    return ApiError(502, "The inference engine stopped in the middle of the stream.", "bad_gateway",
                    "stream_interrupted")


def upstream(code: str, retry_after: int) -> ApiError:
    """The error a client gets for a failure talking to the engine, by its code."""
    if code == ENGINE_UNAVAILABLE:
        return engine_unavailable(retry_after)
    if code == ENGINE_TIMEOUT:
        return engine_timeout()
    if code == STREAM_INTERRUPTED:
        return stream_interrupted()
    return bad_upstream()


def openai_shaped(status: int, body: bytes, reason: str) -> bytes | None:
    """None when an upstream error body is already OpenAI-shaped; else the same error rewrapped."""
    try:
        payload = orjson.loads(body) if body else None
    except orjson.JSONDecodeError:
        payload = None
    if isinstance(payload, dict) and isinstance(payload.get("error"), dict) and "message" in payload["error"]:
        return None
    if isinstance(payload, dict):
        detail = payload.get("detail", payload.get("error", payload.get("message")))
        message = detail if isinstance(detail, str) else orjson.dumps(detail).decode()
    else:
        message = body.decode("utf-8", "replace")[:500] or reason
    kind = "invalid_request_error" if status < 500 else "server_error"
    return orjson.dumps({"error": {"message": message, "type": kind, "param": None, "code": status}})
