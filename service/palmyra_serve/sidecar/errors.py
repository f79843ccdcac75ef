"""OpenAI-shaped errors: the one place that maps a failure to a status, a body and headers.

Upstream error bodies are relayed unchanged by the proxy; everything here is an error the sidecar
itself decides (its own rejections, or an engine it cannot talk to). The error code is also the
metric label: a rejection counts in palmyra_rejections_total{reason=<code>}, a failure talking to
the engine in palmyra_upstream_errors_total{kind=<code>} (reason == code, one vocabulary).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

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

    def headers(self, request_id: str | None) -> list[tuple[bytes, bytes]]:
        """Its headers; the request id's only when there is one (the probe port's refusals have none)."""
        out = [(b"content-type", b"application/json")]
        if request_id is not None:
            out.append((b"x-request-id", request_id.encode()))
        if self.retry_after is not None:
            out.append((b"retry-after", str(self.retry_after).encode()))
        return out

    def sse_event(self) -> bytes:
        """The same error as a final server-sent event, for streams that already started."""
        return b"data: " + self.body() + b"\n\ndata: [DONE]\n\n"


async def send_error(send: Any, exc: ApiError, request_id: str | None, close: bool = False) -> None:
    """Answer an ASGI request with `exc`: its body in one write with its length (not chunked: any
    client reads it), the request id when there is one, `Connection: close` when asked."""
    body = exc.body()
    headers = exc.headers(request_id)
    headers.append((b"content-length", b"%d" % len(body)))
    if close:
        headers.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": exc.status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


# Codes of failures talking to the engine (upstream/pool.py raises them, upstream() maps them).
ENGINE_UNAVAILABLE = "engine_unavailable"  # connection refused or unreachable: nothing was sent
ENGINE_TIMEOUT = "engine_timeout"  # no connection, or silence past the read timeout
BAD_UPSTREAM = "bad_upstream"  # not HTTP, a head over the limits, closed with no answer
STREAM_INTERRUPTED = "stream_interrupted"  # closed in the middle of a body
UPSTREAM_CODES = (ENGINE_UNAVAILABLE, ENGINE_TIMEOUT, BAD_UPSTREAM, STREAM_INTERRUPTED)
# Admission's refusals (admission/control.py, admission/limit.py): 429 with a Retry-After.
QUEUE_FULL = "queue_full"  # the queue is at its hard cap (or, before any measurement, one round long)
QUEUE_TIMEOUT = "queue_timeout"  # waited until the deadline without a slot
SLO_UNREACHABLE = "slo_unreachable"  # the queue ahead cannot be served within the TTFT SLO: refused at once
OVERLOAD_CODES = (QUEUE_FULL, QUEUE_TIMEOUT, SLO_UNREACHABLE)
# Codes of the sidecar's own refusals, pre-created as palmyra_rejections_total series; a code
# added below counts the same way (its series appears on first use).
REJECTION_CODES = (
    *OVERLOAD_CODES,
    "request_too_large",
    "request_timeout",
    "max_tokens_too_large",
    "invalid_json",
    "draining",
    "invalid_api_key",
)


INTERNAL_ERROR = "internal_error"


def internal_error(request_id: str) -> ApiError:
    return ApiError(
        500,
        f"The service failed on this request (request id {request_id}); it is logged.",
        "server_error",
        INTERNAL_ERROR,
    )


def unauthorized() -> ApiError:
    return ApiError(
        401,
        "Invalid or missing API key. Send it as 'Authorization: Bearer <key>'.",
        "authentication_error",
        "invalid_api_key",
    )


def body_too_large(limit: int) -> ApiError:
    return ApiError(
        413, f"Request body exceeds the limit of {limit} bytes.", "invalid_request_error", "request_too_large"
    )


def body_timeout() -> ApiError:
    return ApiError(408, "The request body was not received in time.", "invalid_request_error", "request_timeout")


def max_tokens_too_large(asked: int, cap: int, param: str) -> ApiError:
    return ApiError(
        400,
        f"{param}={asked} exceeds this service's limit of {cap}.",
        "invalid_request_error",
        "max_tokens_too_large",
        param=param,
    )


def invalid_json() -> ApiError:
    return ApiError(400, "The request body is not valid JSON.", "invalid_request_error", "invalid_json")


def queue_full(retry_after: int) -> ApiError:
    return ApiError(
        429, "The service is at capacity; retry shortly.", "rate_limit_error", QUEUE_FULL, retry_after=retry_after
    )


def queue_timeout(retry_after: int) -> ApiError:
    return ApiError(
        429,
        "The request waited too long for a free slot; retry shortly.",
        "rate_limit_error",
        QUEUE_TIMEOUT,
        retry_after=retry_after,
    )


def slo_unreachable(retry_after: int) -> ApiError:
    return ApiError(
        429,
        "The service is at capacity: the requests ahead cannot be served within the latency objective; "
        "retry after the indicated time.",
        "rate_limit_error",
        SLO_UNREACHABLE,
        retry_after=retry_after,
    )


def overloaded(reason: str, retry_after: int) -> ApiError:
    """Admission's refusal by its reason (one of OVERLOAD_CODES)."""
    if reason == SLO_UNREACHABLE:
        return slo_unreachable(retry_after)
    if reason == QUEUE_TIMEOUT:
        return queue_timeout(retry_after)
    return queue_full(retry_after)


def draining(retry_after: int) -> ApiError:
    return ApiError(
        503,
        "This replica is shutting down; retry on another.",
        "service_unavailable",
        "draining",
        retry_after=retry_after,
    )


def engine_unavailable(retry_after: int) -> ApiError:
    return ApiError(
        503,
        "The inference engine is not reachable.",
        "service_unavailable",
        "engine_unavailable",
        retry_after=retry_after,
    )


def engine_timeout() -> ApiError:
    return ApiError(504, "The inference engine did not answer in time.", "timeout", "engine_timeout")


def bad_upstream() -> ApiError:
    return ApiError(502, "The inference engine's answer could not be read.", "bad_gateway", "bad_upstream")


def stream_interrupted() -> ApiError:
    return ApiError(
        502, "The inference engine stopped in the middle of the stream.", "bad_gateway", "stream_interrupted"
    )


def upstream(code: str, retry_after: int) -> ApiError:
    """The error a client gets for a failure talking to the engine, by its code."""
    if code == ENGINE_UNAVAILABLE:
        return engine_unavailable(retry_after)
    if code == ENGINE_TIMEOUT:
        return engine_timeout()
    if code == STREAM_INTERRUPTED:
        return stream_interrupted()
    return bad_upstream()


# An engine error body is read whole to reshape it (vLLM's are under 1 KiB: its validation
# handler truncates what it echoes); a larger one is a misbehaving engine (502). Counted per
# request in memory_budget.py.
MAX_ERROR_BODY = 64 * 1024


# What of an engine's 4xx message a client gets: vLLM's say what was wrong with the request
# (a context length, a bad parameter) and echo at most a little of it.
MAX_CLIENT_MESSAGE = 1000
ENGINE_ERROR = "engine_error"


def from_engine(status: int, body: bytes, reason: str, request_id: str) -> bytes:
    """The body a client gets for an engine error, always rebuilt, never relayed as it came.

    A 5xx says only that the engine failed, and where the details are: the engine's own text
    (a traceback can hold a prompt, a path or a token) goes to the sidecar's log under the request
    id. A 4xx is the request's own fault, and its message is what the client needs: kept, bounded
    to MAX_CLIENT_MESSAGE characters, with OpenAI's four fields and nothing else. vLLM's framework
    level bodies ({"detail": ...} for an undecodable body, {"error": "Unauthorized"}) are read the
    same way."""
    if status >= 500:
        return orjson.dumps(
            {
                "error": {
                    "message": f"The inference engine failed on this request (request id {request_id}).",
                    "type": "server_error",
                    "param": None,
                    "code": ENGINE_ERROR,
                }
            }
        )
    try:
        payload = orjson.loads(body) if body else None
    except orjson.JSONDecodeError:
        payload = None
    error = payload.get("error") if isinstance(payload, dict) else None
    kind: object = None
    if isinstance(error, dict):
        message, param, code = error.get("message"), error.get("param"), error.get("code", status)
        kind = error.get("type")
    elif isinstance(payload, dict):
        message = payload.get("detail", error if error is not None else payload.get("message"))
        param, code = None, status
    else:
        message, param, code = body.decode("utf-8", "replace") or reason, None, status
    if not isinstance(message, str):
        message = orjson.dumps(message).decode()
    return orjson.dumps(
        {
            "error": {
                "message": message[:MAX_CLIENT_MESSAGE] or reason,
                "type": kind if isinstance(kind, str) and 0 < len(kind) <= 64 else "invalid_request_error",
                "param": param[:200] if isinstance(param, str) else None,
                "code": code if isinstance(code, int | str) and not isinstance(code, bool) else status,
            }
        }
    )


# --- the front end's refusals (routes, protocol limits, request cost) ------------------------
# Each code is also the metric reason of palmyra_rejections_total.


@dataclass(frozen=True)
class ApiErrorWithHeaders(ApiError):
    """An ApiError that needs headers of its own (Allow on a 405, Connection: close)."""

    extra: tuple[tuple[bytes, bytes], ...] = ()

    def headers(self, request_id: str | None) -> list[tuple[bytes, bytes]]:
        return super().headers(request_id) + list(self.extra)


def not_found(method: str, path: str) -> ApiError:
    # OpenAI answers an unknown route with "Invalid URL (METHOD /path)"; the path is the decoded one,
    # already bounded by the front end's request-line limit.
    return ApiError(404, f"Invalid URL ({method} {path[:200]})", "invalid_request_error", "not_found")


def not_a_probe_path(method: str, path: str, probe_paths: str) -> ApiError:
    """On the probe port, everything but the probes: the same code as an unknown route."""
    return ApiError(
        404,
        f"Invalid URL ({method} {path[:200]}): this port serves only {probe_paths}.",
        "invalid_request_error",
        "not_found",
    )


def method_not_allowed(method: str, path: str, allow: str) -> ApiError:
    return ApiErrorWithHeaders(
        405,
        f"Method {method[:20]} is not allowed on {path}; use {allow}.",
        "invalid_request_error",
        "method_not_allowed",
        extra=((b"allow", allow.encode()),),
    )


def upgrade_refused() -> ApiError:
    # 400, not 426: 426 asks the client to switch protocols, the opposite of what is meant here.
    return ApiError(
        400,
        "Protocol upgrades (Upgrade header) are not supported here.",
        "invalid_request_error",
        "upgrade_not_supported",
    )


def invalid_parameter(param: str, message: str) -> ApiError:
    return ApiError(400, message, "invalid_request_error", "invalid_parameter", param=param)


def parameter_too_large(param: str, asked: int, cap: int) -> ApiError:
    return ApiError(
        400,
        f"{param}={asked} exceeds this service's limit of {cap}.",
        "invalid_request_error",
        "parameter_too_large",
        param=param,
    )


def invalid_role(role: object, allowed: str) -> ApiError:
    shown = role[:40] if isinstance(role, str) else type(role).__name__
    return ApiError(
        400,
        f"Message role {shown!r} is not one of {allowed}.",
        "invalid_request_error",
        "invalid_role",
        param="messages",
    )


def bodies_over_budget(retry_after: int) -> ApiError:
    return ApiError(
        503,
        "Too many request bodies are held at once; retry shortly.",
        "service_unavailable",
        "bodies_over_budget",
        retry_after=retry_after,
    )


# Written by the HTTP protocol itself (edge/protocol.py), before any request object exists.
def header_too_large(limit: int) -> ApiError:
    return ApiError(
        431,
        f"Request headers exceed {limit} bytes or the header count limit.",
        "invalid_request_error",
        "header_too_large",
    )


def chunk_framing_too_large(limit: int) -> ApiError:
    """A chunked body's trailer fields, or chunk lines padded with extensions: counted against
    the header limits (edge/protocol.py), and the same code as an oversized head."""
    return ApiError(
        431,
        f"A chunked body's trailer fields or chunk extensions exceed {limit} bytes or the header count limit.",
        "invalid_request_error",
        "header_too_large",
    )


def request_line_too_long(limit: int) -> ApiError:
    return ApiError(414, f"The request line exceeds {limit} bytes.", "invalid_request_error", "uri_too_long")


def too_many_connections(retry_after: int) -> ApiError:
    return ApiError(
        503,
        "Too many open connections; retry shortly.",
        "service_unavailable",
        "too_many_connections",
        retry_after=retry_after,
    )


def header_timeout(seconds: float) -> ApiError:
    return ApiError(
        408, f"The request head did not arrive within {seconds:g} s.", "invalid_request_error", "header_timeout"
    )


def write_timeout(seconds: float) -> ApiError:
    # Never sent (the client stopped reading); named so that its metric reason is its code too.
    return ApiError(408, f"The client read nothing for {seconds:g} s.", "invalid_request_error", "write_timeout")


# Every code above in this block: the metric reasons the front end adds to palmyra_rejections_total.
FRONT_END_CODES = (
    "not_found",
    "method_not_allowed",
    "upgrade_not_supported",
    "invalid_parameter",
    "parameter_too_large",
    "invalid_role",
    "bodies_over_budget",
    "header_too_large",
    "uri_too_long",
    "too_many_connections",
    "header_timeout",
    "write_timeout",
)
