"""The asyncio side of adaptive admission: waiters with deadlines in front of a ConcurrencyGate,
served fairly between tenants (admission/fair_queue.py), in arrival order within one.

The gate (admission/limit.py) decides; this keeps the waiting requests and their timers, and
learns from the relay's latency reports. It answers admission/protocol.py's AdmissionControl, as
fixed mode's Admission does (docs/admission.md, "Wiring"), and raises its refusals and Draining.

The relay's reports only teach the limit; they must never break the request that makes them. A
fault while learning (a bug in the limiter's arithmetic, whatever a sample held) is caught here:
the slot is still released, the request goes on under the last good limit, the fault is counted
(`faults`, palmyra_admission_faults_total) and logged at most once per FAULT_LOG_INTERVAL_S.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from palmyra_serve.sidecar.admission.fair_queue import FairQueue
from palmyra_serve.sidecar.admission.limit import QUEUE_TIMEOUT, ConcurrencyGate, Outcome, Ticket
from palmyra_serve.sidecar.admission.protocol import Drainable, Draining, Refused
from palmyra_serve.sidecar.core.drain import DrainState
from palmyra_serve.sidecar.core.share import DEFAULT_SHARE, Share

log = logging.getLogger("palmyra.sidecar")

# A fault that repeats on every report is logged once per this many seconds (the count says how many).
FAULT_LOG_INTERVAL_S = 10.0


class AdaptiveAdmission(Drainable):
    def __init__(self, gate: ConcurrencyGate, drain: DrainState | None = None) -> None:
        super().__init__(drain)
        self.gate = gate
        self.faults = 0  # learning calls that raised (each one left the limit as it was)
        self.on_fault: Callable[[], None] | None = None  # the metric's increment, bound by the app
        self._fault_logged_at: float | None = None
        self._waiters: FairQueue[_Waiter] = FairQueue()

    @property
    def in_flight(self) -> int:
        return self.gate.in_flight

    @property
    def queued(self) -> int:
        return self.gate.queued

    @property
    def limit(self) -> int:
        return self.gate.limit

    @property
    def ceiling(self) -> int:
        return self.gate.ceiling

    @property
    def probe_tokens(self) -> int:
        return self.gate.config.probe_tokens

    def max_queue_wait_s(self) -> float:
        return self.gate.max_queue_wait_s()

    async def acquire(self, share: Share = DEFAULT_SHARE) -> Ticket:
        """A slot in the engine, after a wait the TTFT SLO allows; Refused (at once when the queue
        cannot be served in time) or Draining otherwise."""
        if self.draining:
            raise Draining
        gate = self.gate
        try:
            decision = gate.arrive(share, self._waiters.ahead_of(share) if self._waiters else 0)
        except Exception as exc:  # the queue policy's arithmetic failed: admit within the limit, or refuse
            self._fault(exc)
            decision = gate.arrive_plain(share)
        if decision.action == "admit":
            assert decision.ticket is not None
            self._idle.clear()
            return decision.ticket
        if decision.action == "refuse":
            raise Refused.of(decision)
        assert decision.deadline is not None
        enqueued_at = gate.clock()
        waiter = _Waiter(asyncio.get_running_loop().create_future(), enqueued_at, share.tenant)
        fut = waiter.fut
        self._waiters.push(share, waiter)
        self._idle.clear()
        try:
            async with asyncio.timeout(max(0.0, decision.deadline - enqueued_at)):
                return await fut
        except TimeoutError:
            if fut.done() and not fut.cancelled():
                return fut.result()  # the slot arrived at the deadline: keep it
            self._forget(waiter)
            raise Refused.of(gate.refusal(QUEUE_TIMEOUT, share)) from None
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled():
                self.release(fut.result(), outcome="ignore")  # handed a slot it will never use
            else:
                self._forget(waiter)
            raise

    # --- the relay's reports --------------------------------------------------------------
    def first_token(self, ticket: Ticket) -> None:
        try:
            self.gate.first_token(ticket)
        except Exception as exc:
            self._fault(exc)
        self._hand_out()  # a window may have closed and raised the limit

    def inter_token(self, ticket: Ticket, itl_s: float) -> None:
        try:
            self.gate.inter_token(ticket, itl_s)
        except Exception as exc:
            self._fault(exc)
        self._hand_out()

    def release(self, ticket: Ticket, itl_s: float | None = None, outcome: Outcome = "ok") -> None:
        try:
            self.gate.finish(ticket, itl_s, outcome)  # frees the slot before it learns anything
        except Exception as exc:
            self._fault(exc)
        self._hand_out()
        self._check_idle()

    def _fault(self, exc: Exception) -> None:
        self.faults += 1
        if self.on_fault is not None:
            self.on_fault()
        now = time.monotonic()
        if self._fault_logged_at is None or now - self._fault_logged_at >= FAULT_LOG_INTERVAL_S:
            self._fault_logged_at = now
            log.error(
                "adaptive admission fault: the limit stays where it was",
                exc_info=exc,
                extra={"fields": {"faults": self.faults, "limit": self.gate.limit}},
            )

    # --- internals ---------------------------------------------------------------------------
    def _hand_out(self) -> None:
        """Free slots go to the waiters the fair queue picks: the oldest of the tenant whose turn it
        is, so within a tenant a waiter is never overtaken by a newcomer."""
        while self._waiters and self.gate.can_dispatch():
            waiter = self._waiters.pop()
            if waiter.fut.done():
                continue  # timed out or cancelled; it already left the gate's queue
            waiter.fut.set_result(self.gate.dispatch(waiter.enqueued_at, waiter.tenant))

    def _forget(self, waiter: _Waiter) -> None:
        self._waiters.remove(waiter.tenant, waiter)
        waiter.fut.cancel()
        self.gate.leave_queue(waiter.tenant)
        self._check_idle()

    def _check_idle(self) -> None:
        if self.gate.in_flight == 0 and self.gate.queued == 0:
            self._idle.set()


@dataclass(slots=True, eq=False)
class _Waiter:
    fut: asyncio.Future[Ticket]
    enqueued_at: float
    tenant: str
