"""Admission control: which requests the engine gets, which wait, which are refused; and drain.

Two modes (PALMYRA_ADMISSION_MODE, docs/admission.md):
- adaptive (the default): admission/adaptive.py's AdaptiveAdmission over admission/limit.py's
  ConcurrencyGate, whose limit follows the measured latency against the SLOs under a ceiling read
  from the engine, and whose queue only holds what can still start within the TTFT SLO.
- fixed: `Admission` below, a bounded number of requests in flight, a bounded FIFO queue with a
  timeout (max_in_flight, max_queue, queue_timeout_s).

Both answer admission/protocol.py's AdmissionControl (acquire -> Ticket, first_token, inter_token,
release, drain, in_flight, queued, limit, ceiling), so the relay (relay/handler.py) does not care
which it has. Refusals: `Refused` (429 with its reason and Retry-After) and `Draining` (503).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque

from palmyra_serve.settings import Settings
from palmyra_serve.sidecar.admission.adaptive import AdaptiveAdmission
from palmyra_serve.sidecar.admission.limit import (
    QUEUE_FULL,
    QUEUE_TIMEOUT,
    ConcurrencyGate,
    LimitConfig,
    Outcome,
    Ticket,
)
from palmyra_serve.sidecar.admission.protocol import AdmissionControl, Drainable, Draining, Refused
from palmyra_serve.sidecar.lifecycle.drain import DrainState
from palmyra_serve.sidecar.upstream import capacity

__all__ = ["AdaptiveAdmission", "Admission", "AdmissionControl", "Draining", "Refused", "Ticket", "build_admission"]

log = logging.getLogger("palmyra.sidecar")


def limit_config(settings: Settings, initial: int) -> LimitConfig:
    return LimitConfig(
        min_limit=settings.admission_min_limit,
        initial_limit=initial,
        max_queue=settings.max_queue,
        ttft_slo_s=settings.slo_ttft_s,
        itl_slo_s=settings.slo_itl_s,
        ttft_engine_share=settings.admission_ttft_engine_share,
        itl_share=settings.admission_itl_share,
        queue_headroom=settings.admission_queue_headroom,
        window_s=settings.admission_window_s,
        retry_after_max_s=settings.retry_after_max_s,
    )


def max_num_seqs(settings: Settings) -> int:
    """The engine's scheduler bound: --max-num-seqs when the launcher passes it, else vLLM's default
    for the platform. `auto` counts as an accelerator: the larger bound never under-admits, and the
    adaptive limit finds the engine's knee below it."""
    given = capacity.max_num_seqs_from_args(settings.engine_extra_args)
    if given is not None:
        return given
    return capacity.default_max_num_seqs(
        "cpu" if settings.platform == "cpu" else "accelerator", settings.tensor_parallel_size
    )


def initial_limit(settings: Settings, ceiling: int) -> int:
    """Where the limit starts: the setting, else half the ceiling (one slow-start step below it).
    Too low a start queues traffic the engine could serve at once while slow start catches up
    (measured at 1x capacity from 32 on this CPU: TTFT p99 0.37 s against bare vLLM's 0.07 s); a
    start at the ceiling lets a first overload in at full batch before any latency is seen."""
    return settings.admission_initial_limit or max(settings.admission_min_limit, ceiling // 2)


def build_admission(settings: Settings, drain: DrainState | None = None) -> AdmissionControl:
    """The admission of PALMYRA_ADMISSION_MODE, closed by `drain` (lifecycle/drain.py). Adaptive starts
    with the ceiling it can know without the engine (the override, else max-num-seqs); learn_ceiling()
    narrows it once the engine answers."""
    if settings.admission_mode == "fixed":
        return Admission(
            settings.max_in_flight, settings.max_queue, settings.queue_timeout_s, settings.retry_after_s, drain
        )
    ceiling = settings.admission_max_limit or max_num_seqs(settings)
    gate = ConcurrencyGate(limit_config(settings, initial_limit(settings, ceiling)), ceiling)
    return AdaptiveAdmission(gate, drain)


def learn_ceiling(admission: AdmissionControl, settings: Settings, engine_metrics_text: str) -> int | None:
    """Set the adaptive ceiling from the engine's /metrics page (vllm:cache_config_info); the new
    ceiling, or None when there is nothing to learn (fixed mode, or an operator's override)."""
    if not isinstance(admission, AdaptiveAdmission) or settings.admission_max_limit is not None:
        return None
    labels = capacity.cache_config(engine_metrics_text)
    ceiling = capacity.ceiling(max_num_seqs(settings), labels, settings.admission_kv_tokens_per_request)
    admission.gate.limiter.set_ceiling(ceiling, initial_limit(settings, ceiling))
    log.info(
        "admission ceiling from the engine",
        extra={
            "fields": {
                "ceiling": ceiling,
                "limit": admission.limit,
                "max_num_seqs": max_num_seqs(settings),
                "kv_tokens": capacity.kv_tokens(labels),
            }
        },
    )
    return ceiling


class Admission(Drainable):
    """Fixed mode: max_in_flight slots, a FIFO queue of max_queue waiting up to queue_timeout_s.

    The engine batches what it is given, so the limit exists to keep latency bounded and to answer
    overload with a 429. A released slot is handed straight to the oldest waiter, so a waiter can
    never be overtaken by a newcomer."""

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
        self._waiters: deque[asyncio.Future[None]] = deque()

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

    async def acquire(self) -> Ticket:
        """Take a slot, waiting in the queue if needed; raises Refused (429) or Draining (503)."""
        if self.draining:
            raise Draining
        arrived = time.monotonic()
        if self.in_flight < self.max_in_flight and not self._waiters:
            self.in_flight += 1
            self._idle.clear()
            return Ticket(arrived, 0.0)
        if len(self._waiters) >= self.max_queue:
            raise Refused(QUEUE_FULL, self.retry_after_s)
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(fut)
        self._idle.clear()
        try:
            async with asyncio.timeout(self.queue_timeout_s):
                await fut
        except TimeoutError:
            if not (fut.done() and not fut.cancelled()):
                self._discard(fut)
                raise Refused(QUEUE_TIMEOUT, self.retry_after_s) from None
            # else the slot arrived at the deadline: keep it
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled():
                self._release()  # we were handed a slot but will never use it
            else:
                self._discard(fut)
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
            fut = self._waiters.popleft()
            if not fut.done():
                fut.set_result(None)  # the slot passes on; in_flight is unchanged
                return
        self.in_flight -= 1
        if self.in_flight == 0:
            self._idle.set()

    def _discard(self, fut: asyncio.Future[None]) -> None:
        try:
            self._waiters.remove(fut)
        except ValueError:
            pass
        if not self._waiters and self.in_flight == 0:
            self._idle.set()
