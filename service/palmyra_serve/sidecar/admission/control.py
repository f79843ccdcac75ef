"""Admission control: which requests the engine gets, which wait, which are refused; and drain.

Two modes (PALMYRA_ADMISSION_MODE, docs/admission.md):
- adaptive (the default): admission/adaptive.py's AdaptiveAdmission over admission/limit.py's
  ConcurrencyGate, whose limit follows the measured latency against the SLOs under a ceiling read
  from the engine, and whose queue only holds what can still start within the TTFT SLO.
- fixed: `Admission` below, a bounded number of requests in flight, a bounded queue with a
  timeout (max_in_flight, max_queue, queue_timeout_s).

Both queues are shared between tenants by weight (admission/fair_queue.py): each tenant holds at
most its share of max_queue, and a freed slot goes to the tenant whose turn it is.

Both answer admission/protocol.py's AdmissionControl (acquire -> Ticket, first_token, inter_token,
release, drain, in_flight, queued, limit, ceiling), so the relay (relay/handler.py) does not care
which it has. Refusals: `Refused` (429 with its reason and Retry-After) and `Draining` (503).
build_admission() builds the one the admission plan (admission/plan.py) describes.
"""

from __future__ import annotations

import asyncio
import logging
import time

from palmyra_serve.settings import Settings
from palmyra_serve.sidecar.admission import capacity
from palmyra_serve.sidecar.admission.adaptive import AdaptiveAdmission
from palmyra_serve.sidecar.admission.fair_queue import FairQueue
from palmyra_serve.sidecar.admission.limit import (
    QUEUE_FULL,
    QUEUE_TIMEOUT,
    ConcurrencyGate,
    LimitConfig,
    Outcome,
    Ticket,
)
from palmyra_serve.sidecar.admission.plan import AdmissionPlan
from palmyra_serve.sidecar.admission.protocol import AdmissionControl, Drainable, Draining, Refused
from palmyra_serve.sidecar.core.drain import DrainState
from palmyra_serve.sidecar.core.share import DEFAULT_SHARE, Share

__all__ = [
    "AdaptiveAdmission",
    "Admission",
    "AdmissionControl",
    "AdmissionPlan",
    "Draining",
    "Refused",
    "Ticket",
    "build_admission",
    "learn_ceiling",
]

log = logging.getLogger("palmyra.sidecar")


def limit_config(settings: Settings, plan: AdmissionPlan) -> LimitConfig:
    """The adaptive limit's arithmetic: its bounds from the plan, the SLOs and their shares from settings."""
    return LimitConfig(
        min_limit=plan.floor,
        initial_limit=plan.start,
        max_queue=plan.max_queue,
        ttft_slo_s=settings.slo_ttft_s,
        itl_slo_s=settings.slo_itl_s,
        ttft_engine_share=settings.admission_ttft_engine_share,
        itl_share=settings.admission_itl_share,
        queue_headroom=settings.admission_queue_headroom,
        window_s=settings.admission_window_s,
        retry_after_max_s=settings.retry_after_max_s,
    )


def build_admission(settings: Settings, plan: AdmissionPlan, drain: DrainState | None = None) -> AdmissionControl:
    """The admission the plan describes (admission/plan.py), closed by `drain` (core/drain.py).
    Adaptive starts under the ceiling the plan knows without the engine; learn_ceiling() narrows it
    once the engine answers."""
    if plan.fixed:
        return Admission(plan.ceiling, plan.max_queue, plan.queue_timeout_s, settings.retry_after_s, drain)
    return AdaptiveAdmission(ConcurrencyGate(limit_config(settings, plan), plan.ceiling), drain)


def learn_ceiling(admission: AdmissionControl, plan: AdmissionPlan, engine_metrics_text: str) -> int | None:
    """Set the adaptive ceiling from the engine's /metrics page (vllm:cache_config_info) and, if the
    limit has not moved yet, restart it under the new one; the new ceiling, or None when the plan
    leaves nothing to learn (fixed mode, an operator's ceiling)."""
    if not plan.ceiling_from_engine:
        return None
    assert isinstance(admission, AdaptiveAdmission), "a plan whose ceiling comes from the engine is adaptive"
    labels = capacity.cache_config(engine_metrics_text)
    learned = plan.learned(labels)
    admission.gate.limiter.set_ceiling(learned.ceiling, learned.start)
    log.info(
        "admission ceiling from the engine",
        extra={
            "fields": {
                "ceiling": learned.ceiling,
                "limit": admission.limit,
                "max_num_seqs": plan.max_num_seqs,
                "kv_tokens": capacity.kv_tokens(labels),
            }
        },
    )
    return learned.ceiling


class Admission(Drainable):
    """Fixed mode: max_in_flight slots, a queue of max_queue waiting up to queue_timeout_s.

    The engine batches what it is given, so the limit exists to keep latency bounded and to answer
    overload with a 429. A released slot is handed straight to the next waiter the fair queue
    picks (the oldest of its tenant), so within a tenant a waiter is never overtaken by a newcomer."""

    probe_tokens = 0  # latency reports change nothing here

    def __init__(
        self,
        max_in_flight: int,
        max_queue: int,
        queue_timeout_s: float,
        retry_after_s: int,
        drain: DrainState | None = None,
    ) -> None:
        super().__init__(drain)
        self.max_in_flight = max_in_flight
        self.max_queue = max_queue
        self.queue_timeout_s = queue_timeout_s
        self.retry_after_s = retry_after_s
        self.in_flight = 0
        self._waiters: FairQueue[asyncio.Future[None]] = FairQueue()

    @property
    def queued(self) -> int:
        return len(self._waiters)

    @property
    def limit(self) -> int:
        return self.max_in_flight

    @property
    def ceiling(self) -> int:
        return self.max_in_flight

    def max_queue_wait_s(self) -> float:
        return self.queue_timeout_s

    async def acquire(self, share: Share = DEFAULT_SHARE) -> Ticket:
        """Take a slot, waiting in the queue if needed; raises Refused (429) or Draining (503)."""
        if self.draining:
            raise Draining
        arrived = time.monotonic()
        if self.in_flight < self.max_in_flight and not self._waiters:
            self.in_flight += 1
            self._idle.clear()
            return Ticket(arrived, 0.0)
        if len(self._waiters) >= self.max_queue or self._waiters.count(share.tenant) >= share.queue_cap(self.max_queue):
            raise Refused(QUEUE_FULL, self.retry_after_s)
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.push(share, fut)
        self._idle.clear()
        try:
            async with asyncio.timeout(self.queue_timeout_s):
                await fut
        except TimeoutError:
            if not (fut.done() and not fut.cancelled()):
                self._discard(share.tenant, fut)
                raise Refused(QUEUE_TIMEOUT, self.retry_after_s) from None
            # else the slot arrived at the deadline: keep it
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled():
                self._release()  # we were handed a slot but will never use it
            else:
                self._discard(share.tenant, fut)
            raise
        now = time.monotonic()
        return Ticket(now, now - arrived)

    def first_token(self, ticket: Ticket) -> None:
        pass

    def inter_token(self, ticket: Ticket, itl_s: float) -> None:
        pass

    def release(self, ticket: Ticket | None = None, itl_s: float | None = None, outcome: Outcome = "ok") -> None:
        self._release()

    def _release(self) -> None:
        while self._waiters:
            fut = self._waiters.pop()
            if not fut.done():
                fut.set_result(None)  # the slot passes on; in_flight is unchanged
                return
        self.in_flight -= 1
        if self.in_flight == 0:
            self._idle.set()

    def _discard(self, tenant: str, fut: asyncio.Future[None]) -> None:
        self._waiters.remove(tenant, fut)
        if not self._waiters and self.in_flight == 0:
            self._idle.set()
