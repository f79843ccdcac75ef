"""OpenAI-shaped errors: the one place that maps a failure to a status, a body and headers (in
the route's own API shape where it speaks another: error_shapes.py).

Upstream error bodies are relayed unchanged by the proxy; everything here is an error the sidecar
itself decides (its own rejections, or an engine it cannot talk to). Every code it can send is a
member of ErrorCode, with its status, its OpenAI type and its family; the code is also the metric
label: a rejection counts in palmyra_rejections_total{reason=<code>}, a failure talking to the
engine in palmyra_upstream_errors_total{kind=<code>} (reason == code, one vocabulary).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from enum import Enum, StrEnum
from typing import Any, Self

import orjson

from palmyra_serve.sidecar.core import error_shapes
from palmyra_serve.sidecar.core.routes import Api


class Family(Enum):
    """How a code is counted; the code sets below are read from it."""

    UPSTREAM = "upstream"  # a failure talking to the engine: palmyra_upstream_errors{kind}, pre-created
    OVERLOAD = "overload"  # admission's refusals (429 + Retry-After): palmyra_rejections{reason}, pre-created
    QUOTA = "quota"  # a tenant over its own limits (429 + Retry-After): palmyra_rejections{reason}, pre-created
    REFUSAL = "refusal"  # the relay's other refusals: palmyra_rejections{reason}, pre-created
    FRONT_END = "front_end"  # routes, protocol limits, request cost: palmyra_rejections{reason}, on first use
    FAULT = "fault"  # the sidecar's or the engine's own failure: no rejection, no upstream kind


class ErrorCode(StrEnum):
    """Every `code` the sidecar sends. A member is its string (JSON bodies and metric labels read
    the same as a plain str), and carries its HTTP status, OpenAI `type` and Family.

    Order matters: the pre-created series of each family appear on /metrics in this order."""

    _value_: str
    status: int | None  # None: the engine's own status, kept (engine_error)
    type: str
    family: Family

    def __new__(cls, code: str, status: int | None, kind: str, family: Family) -> ErrorCode:
        member = str.__new__(cls, code)
        member._value_ = code
        member.status, member.type, member.family = status, kind, family
        return member

    # Failures talking to the engine (upstream/failures.py names which failure is which): refused
    # or unreachable (nothing was sent); no connection, or silence past the read timeout; not HTTP,
    # a head over the limits, or closed with no answer; closed in the middle of a body.
    ENGINE_UNAVAILABLE = "engine_unavailable", 503, "service_unavailable", Family.UPSTREAM
    ENGINE_TIMEOUT = "engine_timeout", 504, "timeout", Family.UPSTREAM
    BAD_UPSTREAM = "bad_upstream", 502, "bad_gateway", Family.UPSTREAM
    STREAM_INTERRUPTED = "stream_interrupted", 502, "bad_gateway", Family.UPSTREAM
    # Admission's refusals (admission/control.py, admission/limit.py): the queue at its hard cap
    # (before any measurement, one round long); waited until the deadline without a slot; the
    # queue ahead cannot be served within the TTFT SLO, refused at once.
    QUEUE_FULL = "queue_full", 429, "rate_limit_error", Family.OVERLOAD
    QUEUE_TIMEOUT = "queue_timeout", 429, "rate_limit_error", Family.OVERLOAD
    SLO_UNREACHABLE = "slo_unreachable", 429, "rate_limit_error", Family.OVERLOAD
    # A tenant over a limit of its own (tenants/quota.py): requests or tokens in the last minute,
    # requests at once on this replica. Not overload: the service may be idle.
    RATE_LIMIT_REQUESTS = "rate_limit_requests", 429, "rate_limit_error", Family.QUOTA
    RATE_LIMIT_TOKENS = "rate_limit_tokens", 429, "rate_limit_error", Family.QUOTA
    TENANT_CONCURRENCY = "tenant_concurrency", 429, "rate_limit_error", Family.QUOTA
    # The relay's other refusals.
    REQUEST_TOO_LARGE = "request_too_large", 413, "invalid_request_error", Family.REFUSAL
    REQUEST_TIMEOUT = "request_timeout", 408, "invalid_request_error", Family.REFUSAL
    MAX_TOKENS_TOO_LARGE = "max_tokens_too_large", 400, "invalid_request_error", Family.REFUSAL
    INVALID_JSON = "invalid_json", 400, "invalid_request_error", Family.REFUSAL
    DRAINING = "draining", 503, "service_unavailable", Family.REFUSAL
    INVALID_API_KEY = "invalid_api_key", 401, "authentication_error", Family.REFUSAL
    # Failures of the sidecar's own code, and an engine's 5xx (from_engine).
    INTERNAL_ERROR = "internal_error", 500, "server_error", Family.FAULT
    ENGINE_ERROR = "engine_error", None, "server_error", Family.FAULT
    # The front end's refusals: routes, protocol limits (edge/protocol.py), request cost.
    NOT_FOUND = "not_found", 404, "invalid_request_error", Family.FRONT_END
    METHOD_NOT_ALLOWED = "method_not_allowed", 405, "invalid_request_error", Family.FRONT_END
    # 400, not 426: 426 asks the client to switch protocols, the opposite of what is meant here.
    UPGRADE_NOT_SUPPORTED = "upgrade_not_supported", 400, "invalid_request_error", Family.FRONT_END
    INVALID_PARAMETER = "invalid_parameter", 400, "invalid_request_error", Family.FRONT_END
    PARAMETER_TOO_LARGE = "parameter_too_large", 400, "invalid_request_error", Family.FRONT_END
    INVALID_ROLE = "invalid_role", 400, "invalid_request_error", Family.FRONT_END
    UNKNOWN_PARAMETER = "unknown_parameter", 400, "invalid_request_error", Family.FRONT_END
    UNSUPPORTED_PARAMETER = "unsupported_parameter", 400, "invalid_request_error", Family.FRONT_END
    BODIES_OVER_BUDGET = "bodies_over_budget", 503, "service_unavailable", Family.FRONT_END
    HEADER_TOO_LARGE = "header_too_large", 431, "invalid_request_error", Family.FRONT_END
    URI_TOO_LONG = "uri_too_long", 414, "invalid_request_error", Family.FRONT_END
    TOO_MANY_CONNECTIONS = "too_many_connections", 503, "service_unavailable", Family.FRONT_END
    HEADER_TIMEOUT = "header_timeout", 408, "invalid_request_error", Family.FRONT_END
    WRITE_TIMEOUT = "write_timeout", 408, "invalid_request_error", Family.FRONT_END


def codes(*families: Family) -> tuple[ErrorCode, ...]:
    """The codes of these families, in ErrorCode's order."""
    return tuple(code for code in ErrorCode if code.family in families)


UPSTREAM_CODES = codes(Family.UPSTREAM)
OVERLOAD_CODES = codes(Family.OVERLOAD)
QUOTA_CODES = codes(Family.QUOTA)
# Pre-created as palmyra_rejections_total series (front-end codes count the same way, their series
# appears on first use).
REJECTION_CODES = codes(Family.OVERLOAD, Family.QUOTA, Family.REFUSAL)
FRONT_END_CODES = codes(Family.FRONT_END)


@dataclass(frozen=True)
class ApiError(Exception):
    status: int
    message: str
    type: str
    code: ErrorCode
    param: str | None = None
    retry_after: int | None = None
    extra_headers: tuple[tuple[bytes, bytes], ...] = ()  # a tenant's x-ratelimit-* (tenants/quota.py)

    @classmethod
    def of(cls, code: ErrorCode, message: str, **fields: Any) -> Self:
        """The error `code` names, its status and type from the code's row."""
        assert code.status is not None, f"{code} takes the engine's status"
        return cls(code.status, message, code.type, code, **fields)

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
        out.extend(self.extra_headers)
        return out

    def with_headers(self, headers: list[tuple[bytes, bytes]] | None) -> Self:
        """The same error, carrying a tenant's x-ratelimit-* headers too (tenants/quota.py)."""
        if not headers:
            return self
        return dataclasses.replace(self, extra_headers=(*self.extra_headers, *headers))

    def body_for(self, api: Api | None, request_id: str | None) -> bytes:
        """The body in the shape of the route's API."""
        if api is Api.MESSAGES:
            return error_shapes.anthropic_body(self.status, self.message, request_id)
        return self.body()

    def sse_event(self, api: Api | None = None) -> bytes:
        """The same error as a final server-sent event, for streams that already started."""
        if api is Api.MESSAGES:
            return error_shapes.anthropic_event(self.status, self.message)
        if api is Api.RESPONSES:
            return error_shapes.responses_event(self.code, self.message, self.param)
        return b"data: " + self.body() + b"\n\ndata: [DONE]\n\n"


async def send_error(
    send: Any, exc: ApiError, request_id: str | None, close: bool = False, api: Api | None = None
) -> None:
    """Answer an ASGI request with `exc`: its body in one write with its length (not chunked: any
    client reads it), in the shape of the route's API, the request id when there is one,
    `Connection: close` when asked."""
    body = exc.body_for(api, request_id)
    headers = exc.headers(request_id)
    headers.append((b"content-length", b"%d" % len(body)))
    if close:
        headers.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": exc.status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


# --- the relay's own refusals and failures --------------------------------------------------


def internal_error(request_id: str) -> ApiError:
    return ApiError.of(
        ErrorCode.INTERNAL_ERROR, f"The service failed on this request (request id {request_id}); it is logged."
    )


def unauthorized() -> ApiError:
    return ApiError.of(
        ErrorCode.INVALID_API_KEY,
        "Invalid or missing API key. Send it as 'Authorization: Bearer <key>' or 'x-api-key: <key>'.",
    )


def body_too_large(limit: int) -> ApiError:
    return ApiError.of(ErrorCode.REQUEST_TOO_LARGE, f"Request body exceeds the limit of {limit} bytes.")


def body_timeout() -> ApiError:
    return ApiError.of(ErrorCode.REQUEST_TIMEOUT, "The request body was not received in time.")


def max_tokens_too_large(asked: int, cap: int, param: str) -> ApiError:
    return ApiError.of(
        ErrorCode.MAX_TOKENS_TOO_LARGE, f"{param}={asked} exceeds this service's limit of {cap}.", param=param
    )


def invalid_json() -> ApiError:
    return ApiError.of(ErrorCode.INVALID_JSON, "The request body is not valid JSON.")


def not_a_json_object() -> ApiError:
    return ApiError.of(ErrorCode.INVALID_JSON, "The request body must be a JSON object.")


def queue_full(retry_after: int) -> ApiError:
    return ApiError.of(ErrorCode.QUEUE_FULL, "The service is at capacity; retry shortly.", retry_after=retry_after)


def queue_timeout(retry_after: int) -> ApiError:
    return ApiError.of(
        ErrorCode.QUEUE_TIMEOUT,
        "The request waited too long for a free slot; retry shortly.",
        retry_after=retry_after,
    )


def slo_unreachable(retry_after: int) -> ApiError:
    return ApiError.of(
        ErrorCode.SLO_UNREACHABLE,
        "The service is at capacity: the requests ahead cannot be served within the latency objective; "
        "retry after the indicated time.",
        retry_after=retry_after,
    )


def overloaded(reason: ErrorCode, retry_after: int) -> ApiError:
    """Admission's refusal by its code (one of OVERLOAD_CODES)."""
    if reason is ErrorCode.SLO_UNREACHABLE:
        return slo_unreachable(retry_after)
    if reason is ErrorCode.QUEUE_TIMEOUT:
        return queue_timeout(retry_after)
    return queue_full(retry_after)


_QUOTA_WORDS = {
    ErrorCode.RATE_LIMIT_REQUESTS: "requests per minute",
    ErrorCode.RATE_LIMIT_TOKENS: "tokens per minute",
    ErrorCode.TENANT_CONCURRENCY: "requests at once",
}


def over_quota(code: ErrorCode, tenant: str, limit: int, retry_after: int) -> ApiError:
    """A tenant over one of its own limits (one of QUOTA_CODES)."""
    return ApiError.of(
        code,
        f"Rate limit reached for tenant {tenant} on {_QUOTA_WORDS[code]}: limit {limit}; retry after {retry_after} s.",
        retry_after=retry_after,
    )


def draining(retry_after: int) -> ApiError:
    return ApiError.of(ErrorCode.DRAINING, "This replica is shutting down; retry on another.", retry_after=retry_after)


def engine_unavailable(retry_after: int) -> ApiError:
    return ApiError.of(ErrorCode.ENGINE_UNAVAILABLE, "The inference engine is not reachable.", retry_after=retry_after)


def engine_timeout() -> ApiError:
    return ApiError.of(ErrorCode.ENGINE_TIMEOUT, "The inference engine did not answer in time.")


def bad_upstream() -> ApiError:
    return ApiError.of(ErrorCode.BAD_UPSTREAM, "The inference engine's answer could not be read.")


def stream_interrupted() -> ApiError:
    return ApiError.of(ErrorCode.STREAM_INTERRUPTED, "The inference engine stopped in the middle of the stream.")


def upstream(code: str, retry_after: int) -> ApiError:
    """The error a client gets for a failure talking to the engine, by its code (one of
    UPSTREAM_CODES: upstream/failures.py names the code of a failure)."""
    if code == ErrorCode.ENGINE_UNAVAILABLE:
        return engine_unavailable(retry_after)
    if code == ErrorCode.ENGINE_TIMEOUT:
        return engine_timeout()
    if code == ErrorCode.STREAM_INTERRUPTED:
        return stream_interrupted()
    return bad_upstream()


# --- the front end's refusals (routes, protocol limits, request cost) ------------------------
# Family.FRONT_END: each code is also the metric reason of palmyra_rejections_total.


@dataclass(frozen=True)
class ApiErrorWithHeaders(ApiError):
    """An ApiError that needs headers of its own (Allow on a 405, Connection: close)."""

    extra: tuple[tuple[bytes, bytes], ...] = ()

    def headers(self, request_id: str | None) -> list[tuple[bytes, bytes]]:
        return super().headers(request_id) + list(self.extra)


def not_found(method: str, path: str) -> ApiError:
    # OpenAI answers an unknown route with "Invalid URL (METHOD /path)"; the path is the decoded one,
    # already bounded by the front end's request-line limit.
    return ApiError.of(ErrorCode.NOT_FOUND, f"Invalid URL ({method} {path[:200]})")


def not_a_probe_path(method: str, path: str, probe_paths: str) -> ApiError:
    """On the probe port, everything but the probes: the same code as an unknown route."""
    return ApiError.of(
        ErrorCode.NOT_FOUND, f"Invalid URL ({method} {path[:200]}): this port serves only {probe_paths}."
    )


def method_not_allowed(method: str, path: str, allow: str) -> ApiError:
    return ApiErrorWithHeaders.of(
        ErrorCode.METHOD_NOT_ALLOWED,
        f"Method {method[:20]} is not allowed on {path}; use {allow}.",
        extra=((b"allow", allow.encode()),),
    )


def upgrade_refused() -> ApiError:
    return ApiError.of(ErrorCode.UPGRADE_NOT_SUPPORTED, "Protocol upgrades (Upgrade header) are not supported here.")


def invalid_parameter(param: str, message: str) -> ApiError:
    return ApiError.of(ErrorCode.INVALID_PARAMETER, message, param=param)


def parameter_too_large(param: str, asked: int, cap: int) -> ApiError:
    return ApiError.of(
        ErrorCode.PARAMETER_TOO_LARGE, f"{param}={asked} exceeds this service's limit of {cap}.", param=param
    )


def unknown_parameter(param: str) -> ApiError:
    # OpenAI answers a field it does not know with a 400 naming it; vLLM would accept and ignore it.
    return ApiError.of(
        ErrorCode.UNKNOWN_PARAMETER, f"Unrecognized request argument supplied: {param[:80]}", param=param[:80]
    )


def unsupported_parameter(param: str, why: str) -> ApiError:
    return ApiError.of(ErrorCode.UNSUPPORTED_PARAMETER, f"{param} is not accepted by this service: {why}", param=param)


def invalid_role(role: object, allowed: str) -> ApiError:
    shown = role[:40] if isinstance(role, str) else type(role).__name__
    return ApiError.of(ErrorCode.INVALID_ROLE, f"Message role {shown!r} is not one of {allowed}.", param="messages")


def bodies_over_budget(retry_after: int) -> ApiError:
    return ApiError.of(
        ErrorCode.BODIES_OVER_BUDGET,
        "Too many request bodies are held at once; retry shortly.",
        retry_after=retry_after,
    )


# Written by the HTTP protocol itself (edge/protocol.py), before any request object exists.
def header_too_large(limit: int) -> ApiError:
    return ApiError.of(ErrorCode.HEADER_TOO_LARGE, f"Request headers exceed {limit} bytes or the header count limit.")


def chunk_framing_too_large(limit: int) -> ApiError:
    """A chunked body's trailer fields, or chunk lines padded with extensions: counted against
    the header limits (edge/protocol.py), and the same code as an oversized head."""
    return ApiError.of(
        ErrorCode.HEADER_TOO_LARGE,
        f"A chunked body's trailer fields or chunk extensions exceed {limit} bytes or the header count limit.",
    )


def request_line_too_long(limit: int) -> ApiError:
    return ApiError.of(ErrorCode.URI_TOO_LONG, f"The request line exceeds {limit} bytes.")


def too_many_connections(retry_after: int) -> ApiError:
    return ApiError.of(
        ErrorCode.TOO_MANY_CONNECTIONS, "Too many open connections; retry shortly.", retry_after=retry_after
    )


def header_timeout(seconds: float) -> ApiError:
    return ApiError.of(ErrorCode.HEADER_TIMEOUT, f"The request head did not arrive within {seconds:g} s.")


def write_timeout(seconds: float) -> ApiError:
    # Never sent (the client stopped reading); named so that its metric reason is its code too.
    return ApiError.of(ErrorCode.WRITE_TIMEOUT, f"The client read nothing for {seconds:g} s.")
