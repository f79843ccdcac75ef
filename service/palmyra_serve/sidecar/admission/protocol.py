"""What every admission answers, so the relay (relay/handler.py) does not care which it has.

Two implement it: fixed mode's Admission (admission/control.py) and AdaptiveAdmission
(admission/adaptive.py); admission/control.py's build_admission() picks one. Refusals are
exceptions the caller turns into HTTP (errors.py owns the shape): `Refused` is a 429 with its
reason and Retry-After, counted under palmyra_rejections{reason}; `Draining` a 503 with the
caller's own Retry-After. `Drainable` is the drain both share, on core/drain.py's state.
"""

from __future__ import annotations

import asyncio
from typing import Protocol

from palmyra_serve.sidecar.admission.limit import Decision, Outcome, Ticket
from palmyra_serve.sidecar.core.drain import DrainState
from palmyra_serve.sidecar.core.errors import ErrorCode
from palmyra_serve.sidecar.core.share import Share


class Refused(Exception):
    def __init__(self, reason: ErrorCode, retry_after_s: int) -> None:
        super().__init__(reason)
        self.reason = reason
        self.retry_after_s = retry_after_s

    @classmethod
    def of(cls, decision: Decision) -> Refused:
        assert decision.reason is not None and decision.retry_after_s is not None
        return cls(decision.reason, decision.retry_after_s)


class Draining(Exception):
    """Admission is closed for good (SIGTERM): the caller answers 503 with its own Retry-After."""


class AdmissionControl(Protocol):
    @property
    def draining(self) -> bool: ...  # acquire() raises Draining from now on
    @property
    def probe_tokens(self) -> int: ...  # the relay reports a stream's mean gap after this many tokens (0: never)

    @property
    def in_flight(self) -> int: ...
    @property
    def queued(self) -> int: ...
    @property
    def limit(self) -> int: ...
    @property
    def ceiling(self) -> int: ...
    def max_queue_wait_s(self) -> float: ...
    async def acquire(self, share: Share = ...) -> Ticket: ...
    def first_token(self, ticket: Ticket) -> None: ...
    def inter_token(self, ticket: Ticket, itl_s: float) -> None: ...
    def release(self, ticket: Ticket, itl_s: float | None = None, outcome: Outcome = "ok") -> None: ...
    async def drain(self, timeout_s: float) -> bool: ...


class Drainable:
    """The drain of both admissions: drain() closes the drain state (shared with readiness when the
    app passes one; core/drain.py says who sets and reads it) and waits for `_idle`, which the
    subclass sets whenever nothing is in flight or queued and clears when something is."""

    def __init__(self, drain: DrainState | None = None) -> None:
        self.drain_state = drain if drain is not None else DrainState()
        self._idle = asyncio.Event()
        self._idle.set()

    @property
    def draining(self) -> bool:
        return self.drain_state.closed

    async def drain(self, timeout_s: float) -> bool:
        """Refuse new requests from now on; wait until nothing is in flight or queued. True if it emptied."""
        self.drain_state.close()
        try:
            async with asyncio.timeout(timeout_s):
                await self._idle.wait()
            return True
        except TimeoutError:
            return False
