"""OpenAI's completions and chat completions: choices in every event, usage only when asked."""

from __future__ import annotations

from typing import Any

from palmyra_serve.sidecar.policy.inspect import Inspection
from palmyra_serve.sidecar.relay.apis.base import ApiRelay
from palmyra_serve.sidecar.relay.sse import ChatAccount, CompletionsAccount
from palmyra_serve.sidecar.relay.usage import UsageScanner


def ask_for_usage(payload: dict[str, Any], seen: Inspection) -> tuple[bool, bool]:
    """Tokens are counted from the engine's usage report, never from events: asked for on every
    stream, and removed again when the client did not ask for it (a client's continuous_usage_stats
    had no effect without include_usage, and must not start to)."""
    if not seen.streams:
        return False, False
    payload["stream_options"] = {
        "include_usage": True,
        "continuous_usage_stats": seen.continuous_usage and seen.wants_usage,
    }
    return True, not seen.wants_usage


COMPLETIONS = ApiRelay(
    rewrite=ask_for_usage, stream_account=CompletionsAccount, body_usage=UsageScanner, reports_usage=False
)
CHAT = ApiRelay(rewrite=ask_for_usage, stream_account=ChatAccount, body_usage=UsageScanner, reports_usage=False)
