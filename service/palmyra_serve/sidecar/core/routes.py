"""The one place that names the sidecar's routes: what is relayed, what the sidecar answers itself,
and the route labels metrics and logs use.

The relay is an allow-list of exact (method, path) pairs. Anything else is answered by the sidecar
(404, or 405 with Allow for a known path and a wrong method) and never reaches the engine: vLLM
also serves `/v1/chat/completions/batch`, stored responses (`/v1/responses/{id}`),
`/v1/messages/count_tokens`, `/invocations`, LoRA admin routes and more, none of which this
service documents or bounds.

Matching is on the path uvicorn already percent-decoded, compared byte for byte: no prefix
matching, no slash folding, no dot-segment resolution, so `//v1/completions`, `/v1/completions/`
and `/v1/%2e%2e/invocations` simply do not match. What goes upstream is the entry's own canonical
target (plus the query string), never the client's raw path.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class Api(StrEnum):
    """The request and response shape a generation route speaks: what its body holds (policy/), how
    its usage is reported (relay/), and in which shape its errors are written (errors.py)."""

    COMPLETIONS = "completions"
    CHAT = "chat"
    RESPONSES = "responses"  # OpenAI's Responses API
    MESSAGES = "messages"  # Anthropic's Messages API

    @property
    def anthropic(self) -> bool:
        return self is Api.MESSAGES


@dataclass(frozen=True)
class Route:
    label: str  # the `route` label of metrics and the access log
    methods: frozenset[str]
    target: bytes  # the path sent to the engine
    api: Api | None = None  # a generation's API: its body is checked for cost before admission
    tokenizes: bool = False  # admitted by the tokenizer's own small gate (relay/handler.py)

    @property
    def generates(self) -> bool:
        return self.api is not None

    @property
    def chat(self) -> bool:
        """The body carries OpenAI chat messages (roles checked)."""
        return self.api is Api.CHAT

    @property
    def allow(self) -> str:
        return ", ".join(sorted(self.methods))


RELAYED: dict[str, Route] = {
    "/v1/completions": Route("completions", frozenset({"POST"}), b"/v1/completions", Api.COMPLETIONS),
    "/v1/chat/completions": Route("chat_completions", frozenset({"POST"}), b"/v1/chat/completions", Api.CHAT),
    # Stateless: no stored response is kept or read (policy/fields.py, `store` and
    # `previous_response_id`), so the routes that read stored ones stay off the list.
    "/v1/responses": Route("responses", frozenset({"POST"}), b"/v1/responses", Api.RESPONSES),
    "/v1/messages": Route("messages", frozenset({"POST"}), b"/v1/messages", Api.MESSAGES),
    "/v1/models": Route("models", frozenset({"GET"}), b"/v1/models"),
    # Not OpenAI's, but how a client learns a prompt's length in tokens, which it needs to pick a
    # max_tokens within max-model-len (the cap policy/cost.py enforces). No generation; the body
    # is bounded like any other.
    "/tokenize": Route("tokenize", frozenset({"POST"}), b"/tokenize", tokenizes=True),
    "/detokenize": Route("tokenize", frozenset({"POST"}), b"/detokenize", tokenizes=True),
}

# Answered by the sidecar's own control app (FastAPI): health, readiness, metrics, the API document.
# `/engine/metrics` is the engine's own metrics relayed on the sidecar's port.
CONTROL_PATHS = frozenset(
    {
        "/health",
        "/health/sidecar",
        "/ready",
        "/metrics",
        "/engine/metrics",
        "/docs",
        "/docs/oauth2-redirect",
        "/openapi.json",
    }
)

# The API document lists every relayed route: it is for callers, so it asks for their key (when
# keys are on), like the routes it describes. Health, readiness and metrics stay open: probes and
# scrapers send no key (the client port's /metrics has no per-tenant series for that reason).
KEYED_CONTROL_PATHS = frozenset({"/docs", "/docs/oauth2-redirect", "/openapi.json"})
assert KEYED_CONTROL_PATHS <= CONTROL_PATHS

# All the probe port serves (settings.probe_port), the operator's port, never published: the
# kubelet's probes (and Compose's healthcheck) keep their own door, so clients holding every
# connection the main port allows cannot make a busy replica look dead and get its containers
# restarted; and Prometheus reads the full /metrics there, per-tenant series included, which the
# client port's /metrics leaves out (core/metrics.py, ClientView).
PROBE_PATHS = frozenset({"/health", "/health/sidecar", "/ready", "/metrics"})
assert PROBE_PATHS <= CONTROL_PATHS

GENERATION_ROUTES = frozenset(r.label for r in RELAYED.values() if r.generates)
OTHER = "other"  # refused requests that match no route
ROUTE_LABELS = tuple(dict.fromkeys([r.label for r in RELAYED.values()] + [OTHER]))
