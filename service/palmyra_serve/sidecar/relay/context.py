"""One request's context: what the relay's steps (handler.py) pass along, in one place instead of
locals and parameter lists. The record (core/record.py) is the request's account, what the access
log, metrics and traces publish once when it ends; the context holds that record and the request's
control state besides it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from palmyra_serve.sidecar.admission.control import Ticket
from palmyra_serve.sidecar.core.record import RequestRecord
from palmyra_serve.sidecar.core.routes import Api, Route
from palmyra_serve.sidecar.tenants.reservation import Demand
from palmyra_serve.sidecar.tenants.tenancy import Lease, Tenant


@dataclass(slots=True)
class RequestContext:
    scope: dict
    receive: Any
    send: Any
    t0: float  # perf_counter at the request's head
    entry: Route | None  # its allow-list entry; None for a path off the list
    record: RequestRecord
    fwd: list[tuple[bytes, bytes]]  # the client's headers that go upstream
    authorization: bytes | None = None
    api_key: bytes | None = None
    content_length: bytes | None = None
    closing: bool = False  # draining: every answer says Connection: close
    body: bytes = b""
    body_read: bool = False
    held: int = 0  # bytes of the body counted against the bodies' budget
    tenant: Tenant | None = None
    demand: Demand | None = None  # the tokens a generation reserves against its tenant's limit
    lease: Lease | None = None
    ticket: Ticket | None = None
    # The relay asked the engine for a stream's usage on the client's behalf and removes that event
    # again (relay/usage_event.py).
    strip_usage: bool = False
    # The engine failed this request (a cut stream, an error event): admission then learns nothing
    # from it; failures are health's to judge, never a reason to lower the limit.
    engine_failed: bool = False
    ratelimit: list[tuple[bytes, bytes]] = field(default_factory=list)  # the tenant's x-ratelimit-*

    @property
    def api(self) -> Api | None:
        return self.entry.api if self.entry is not None else None

    @property
    def rid(self) -> str:
        return self.record.request_id

    def gap_to_learn(self) -> float | None:
        """The inter-token gap admission may learn from: only an engine-paced, successful
        generation's (a status under 300, no failure, no client pacing)."""
        record = self.record
        if record.status >= 300 or self.engine_failed or record.client_paced:
            return None
        return record.token_gap_s
