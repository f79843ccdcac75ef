"""The interface each API's module fills in (see __init__.py)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from palmyra_serve.sidecar.policy.inspect import Inspection
from palmyra_serve.sidecar.relay.sse import SseAccount


class BodyUsage(Protocol):
    """A non-streamed JSON body's usage, read as the body passes (relay/usage.py, typed_events.py)."""

    def feed(self, chunk: bytes) -> None: ...

    def usage(self) -> dict[str, Any] | None: ...


@dataclass(frozen=True, slots=True)
class ApiRelay:
    # Rewrite a checked generation body for the relay's accounting; returns (changed, strip_usage):
    # whether the body changed, and whether the stream's usage event must be taken out again.
    rewrite: Callable[[dict[str, Any], Inspection], tuple[bool, bool]]
    stream_account: Callable[[], SseAccount]
    body_usage: Callable[[], BodyUsage]
    reports_usage: bool  # the API reports usage unasked: a missing report costs the whole reservation
