"""What one request did, as the relay measured it: one typed record per request.

The relay fills it in as the request goes (relay/handler.py) and publishes it once when it ends
(relay/finish.py): the access log writes `log_fields()`, the record's one rendering; metrics, the
trace and the tenant's settlement read its fields; admission learns the gap it measured
(relay/context.py). The request's control state lives in its context, not here. Nothing reads the
log back: times stay in seconds here and become rounded milliseconds only in the rendering.

The access log's keys and what each means: ACCESS_LOG_KEYS below (docs/api.md is generated from it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# Every key log_fields() writes, each present only when it applies, in the order written. Around
# them each line carries the keys of every log line: ts, level, logger ("palmyra.access"), msg.
ACCESS_LOG_KEYS: dict[str, str] = {
    "request_id": "the request's id: the client's X-Request-Id, or one made for it; sent back in X-Request-Id",
    "method": "HTTP method",
    "path": "the path as the client sent it, without the query",
    "route": "the allow-listed route it matched (`other` for none): the metrics' `route` label",
    "queue_ms": "time waited for an admission slot",
    "upstream_error": "a failure talking to the engine, as its error code (`engine_unavailable`, `engine_timeout`, "
    "`stream_interrupted`, `bad_upstream`)",
    "upstream_detail": "what that failure was, in a few words",
    "ttft_ms": "time to the first byte of the engine's answer relayed to the client",
    "itl_ms": "a generation's mean gap per token, streamed or not",
    "client_paced": "that gap was set by the client's reading, not by the engine",
    "engine_error_event": "the engine ended the stream with an error event of its own",
    "trace_id": "the request's trace (W3C trace id, 32 hex digits), when tracing records it",
    "tenant": "the tenant whose key the request carried (`default` for the plain keys)",
    "completion_tokens": "tokens generated, as the engine counted them",
    "prompt_tokens": "prompt tokens, as the engine counted them",
    "usage_missing": "the Responses or Messages API's usage report was past what accounting holds: "
    "the tenant was charged its whole reservation",
    "truncated": "the answer was cut short: the engine failed after its status line was sent",
    "error": "the code of the sidecar's own error answer (the metrics' `reason` and error codes)",
    "client_disconnected": "the client left before the answer ended (status 499)",
    "status": "the HTTP status sent, or 499 for a client that left",
    "duration_ms": "from the request's head, read, to its answer's end",
}


@dataclass(slots=True)
class RequestRecord:
    request_id: str
    method: str
    path: str
    route: str
    status: int = 500
    duration_s: float = 0.0
    queue_wait_s: float = 0.0
    ttft_s: float | None = None
    # A generation's mean gap per token, and whether its client's reading set that pace (then
    # admission ignores it: the relay's writes had to wait on the client).
    token_gap_s: float | None = None
    client_paced: bool = False
    completion_tokens: int | None = None
    prompt_tokens: int | None = None
    error: str | None = None
    upstream_error: str | None = None
    upstream_detail: str | None = None
    truncated: bool = False
    engine_error_event: bool = False
    client_disconnected: bool = False
    tenant: str | None = None
    tokens_seen: int = 0  # token events relayed (a stream cut short is charged these)
    # An API that always reports usage (Responses, Messages) ended without a readable report (its
    # body or last event over the accounting's cap): the tenant is charged its whole reservation.
    usage_missing: bool = False
    sent_at: float = 0.0  # perf_counter when the request went to the engine
    # Not logged, tracing only (observability/tracing.py; perf_counter times): the request's
    # RequestTrace, when admission began, when a new engine connection opened for it, the engine's
    # status, when its answer ended, and the model the body named.
    trace: Any = None
    trace_id: str | None = None
    admit_at: float = 0.0
    connected_at: float = 0.0
    engine_status: int = 0
    engine_done_at: float = 0.0
    model: str | None = None

    def log_fields(self) -> dict[str, Any]:
        fields: dict[str, Any] = {
            "request_id": self.request_id,
            "method": self.method,
            "path": self.path,
            "route": self.route,
        }
        if self.queue_wait_s:
            fields["queue_ms"] = round(self.queue_wait_s * 1000, 2)
        if self.upstream_error is not None:
            fields["upstream_error"] = self.upstream_error
            fields["upstream_detail"] = self.upstream_detail
        if self.ttft_s is not None:
            fields["ttft_ms"] = round(self.ttft_s * 1000, 2)
        if self.token_gap_s is not None:
            fields["itl_ms"] = round(self.token_gap_s * 1000, 3)
            if self.client_paced:
                fields["client_paced"] = True
        if self.engine_error_event:
            fields["engine_error_event"] = True
        if self.trace_id is not None:
            fields["trace_id"] = self.trace_id
        if self.tenant is not None:
            fields["tenant"] = self.tenant
        if self.completion_tokens is not None:
            fields["completion_tokens"] = self.completion_tokens
        if self.prompt_tokens is not None:
            fields["prompt_tokens"] = self.prompt_tokens
        if self.usage_missing:
            fields["usage_missing"] = True
        if self.truncated:
            fields["truncated"] = True
        if self.error is not None:
            fields["error"] = self.error
        if self.client_disconnected:
            fields["client_disconnected"] = True
        fields["status"] = self.status
        fields["duration_ms"] = round(self.duration_s * 1000, 2)
        return fields
