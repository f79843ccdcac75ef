"""Adaptive concurrency limit and an SLO-bounded admission queue. Pure logic.

Why: a fixed limit says nothing about the engine. Too low wastes an NPU that batches hundreds of
sequences; too high on a CPU slows every stream past the SLO, and a long queue makes everything
admitted under overload late anyway. So the limit on requests in the engine is a control loop and
the queue only holds what can still be served within the TTFT SLO.

The limit (in the spirit of Envoy's adaptive-concurrency gradient controller and Netflix's
concurrency-limits Gradient2/AIMD, adapted to LLM serving):

- The setpoint is the SLO, not a measured minimum RTT. Envoy and Netflix compare latency with the
  latency of an idle system (minRTT, found by periodically starving the upstream); an LLM request's
  latency is dominated by how many tokens it asks for, which the sidecar does not control, while the
  promise to keep is absolute: first token within `ttft_slo_s`, mean inter-token gap within
  `itl_slo_s`. So the signals are the *engine's* part of TTFT (dispatch to first token, queue wait
  excluded) and each stream's mean inter-token gap (ITL), both per request and independent of the
  output length, and the targets are shares of the SLOs (`ttft_engine_share`, `itl_share`).
- Every window (at least `window_s` and `min_samples` samples, or `max_window_s` with one) the
  `quantile` of each signal over its target gives the pressure p (the larger of the two):
  p > 1: multiplicative decrease by the gradient, limit x max(max_decrease, 1/p) (if latency grows in
  proportion to concurrency above the knee, this lands on the target in one step);
  p < `tolerance` and the limit was binding in the window (a request found no free slot): increase,
  doubling while in slow start (until the first decrease, as TCP), then by max(1, sqrt(limit)) per
  window (Envoy's headroom); else hold.
- Only latency the engine produced teaches the limit. A failed request says nothing about
  congestion that a client could not have provoked: a 4xx is the request's own fault, an engine 5xx
  can be asked for (a prompt that breaks a template), a read timeout follows from a request's own
  length, a cut stream from its client. None of them moves the limit (an engine that really fails
  is seen by health and readiness: lifecycle/health.py). Samples are sanitised on the way in (a NaN, an
  negative gap from a clock step is dropped; an infinite or huge one is capped), the arithmetic is
  total (no division by a sample that can be 0), and the limit stays finite within
  [floor, ceiling] whatever the samples (tests/unit/test_admission_properties.py).
- A raise must pay: the SLO allows streams to slow down to the ITL target, but on an engine whose
  throughput falls past its knee (this 2-core CPU: ~19 req/s at 50 streams, ~14 at 128 with every
  stream still inside the SLO) a limit held only by the SLO settles where goodput is lower. So each
  window with fresh full-batch ITL samples estimates the engine's token rate, limit / median(ITL)
  (Little's law on the batch), and a raise whose rate is not `min_gain` above the rate measured at
  the limit it came from is undone (ending slow start) and no raise is tried for `hold_windows`
  windows: a hill climb on throughput under the SLO's ceiling, in the spirit of Gradient2's
  comparison of latency with its long-run value.
- Feedback must be quick or the loop overshoots: a 64-token stream at 1 s per token reports its
  mean ITL after a minute. So the relay also reports each stream's mean gap over its first
  `probe_tokens` tokens (inter_token()), a few hundred milliseconds into the stream, besides the
  whole stream's at its end.
- Only samples from requests dispatched after the last decrease count (one cut per round trip, as
  TCP), so the slow streams that caused a cut do not cut again; and the limit grows only on ITL
  samples from requests dispatched after the last change *into a full batch* (in flight at the
  limit): growth is earned at the new limit. The TTFT of a fresh request comes first but says
  little about how the batch slows every stream, and the first streams after a raise run in a
  batch still filling up (measured: without the full-batch condition, slow start doubled 64 -> 256
  in two windows at 2x capacity while the streams admitted at 256 were all late).
- Bounds: `min_limit` (the floor) <= limit <= the ceiling from the engine (see admission/capacity.py:
  vLLM's max_num_seqs and its KV capacity in requests), read once at start.
- Adaptive only: fixed mode (PALMYRA_ADMISSION_MODE=fixed, a limit that never moves) is
  admission/control.py's Admission, which has none of this arithmetic to run.

The queue is shared between tenants by weight (admission/fair_queue.py serves it), so a request is
judged by the wait it will have under fair share, not behind the whole queue: its position is the
number of waiters the fair queue would serve before it (FairQueue.ahead_of, which the caller passes
as `ahead`), and its expected wait (ahead + 1) / mu. A tenant with nothing waiting comes next, or
nearly, however long another tenant's backlog is; with one tenant, ahead is the whole queue. Where
no position is given, the fluid estimate stands in: the tenants waiting (t included) share mu by
weight, t's part mu x w_t / W, so (queued_t + 1) x W / (mu x w_t). Each tenant may hold at most its
share of max_queue (Share.queue_cap), so no tenant's backlog fills the others' part.

Slots are shared too. Under overload the queue's wait budget can be near zero (the engine's TTFT
uses the whole SLO), and then whoever arrives when a slot frees takes it: the tenant that sends the
most. So a request of a tenant below its fair share of the limit, limit x w_t / W (W: the weights
of the tenants with requests in flight or waiting, t included), with no waiter of its own, is
admitted at once even when no slot is free, up to the engine's ceiling; the slot it borrows is
repaid by the next one freed, which no waiter gets while in flight exceeds the limit. With one
tenant its share is the whole limit: nothing changes.

The queue: a request that finds no free slot may wait at most what the TTFT SLO (less a headroom,
`queue_headroom` of it) leaves after the expected engine TTFT:
max_wait = max(0, ttft_slo_s x (1 - queue_headroom) - (srtt + 2 rttvar)) with srtt/rttvar the smoothed
engine TTFT and its mean deviation (Jacobson's estimator, as TCP's retransmission timeout). On
arrival its expected wait is W = (queued + 1) / mu, mu = limit / mean service time (Little's law on
a saturated engine). W > max_wait: refused at once (429, reason "slo_unreachable"), costing nothing
else; otherwise it waits with a deadline of arrival + max_wait and is refused ("queue_timeout") if
that passes. `max_queue` stays a hard cap ("queue_full"). Every refusal carries
Retry-After = clamp(ceil(W - max_wait), 1, retry_after_max_s) seconds: the time the queue needs, at
mu, to drain to where a newcomer is admissible again (1 s before the first measurement).

The settings that feed LimitConfig (PALMYRA_ADMISSION_*, PALMYRA_SLO_*) are in settings/admission.py
and docs/admission.md; admission/control.py's build_admission() maps them.
Nothing here does I/O or touches asyncio: admission/adaptive.py owns the waiters and calls these methods;
the clock is injected so the tests drive time.
"""

# Longer than 400 lines: one algorithm (the limit, its queue and their bounds) whose derivations
# the tests hold it to; split, each half would need the other's invariants.

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from palmyra_serve.sidecar.core import errors
from palmyra_serve.sidecar.core.share import DEFAULT_SHARE, Share

Outcome = Literal["ok", "ignore"]  # ok: a measured success; ignore: nothing learnt (any failure)

# A latency sample above this is capped: a stalled stream still says "far too slow", and no sum or
# product built from samples can overflow.
MAX_SAMPLE_S = 3600.0

# Refusal reasons: error codes (errors.py, the one vocabulary), also palmyra_rejections{reason}.
QUEUE_FULL = errors.ErrorCode.QUEUE_FULL
QUEUE_TIMEOUT = errors.ErrorCode.QUEUE_TIMEOUT
SLO_UNREACHABLE = errors.ErrorCode.SLO_UNREACHABLE


@dataclass(frozen=True)
class LimitConfig:
    min_limit: int = 2
    initial_limit: int = 8
    max_queue: int = 256
    ttft_slo_s: float = 2.0
    itl_slo_s: float = 0.25
    ttft_engine_share: float = 0.5
    itl_share: float = 0.8
    # Share of the TTFT SLO kept out of the queue's budget, so what is admitted at the edge of the
    # wait still has margin for the engine's tail (without it queue + TTFT rode at 1.9-2.0 s at p99).
    queue_headroom: float = 0.0
    quantile: float = 90.0
    tolerance: float = 0.8
    max_decrease: float = 0.5
    window_s: float = 1.0
    min_samples: int = 8
    max_window_s: float = 10.0
    retry_after_max_s: int = 30
    probe_tokens: int = 8  # the relay reports a stream's mean gap after this many tokens
    min_gain: float = 0.05  # a raise must lift the estimated token rate this much, else it is undone
    hold_windows: int = 10  # windows without a raise after an undone one

    def __post_init__(self) -> None:
        if self.min_limit < 1 or self.initial_limit < 1:
            raise ValueError("limits must be at least 1")
        if not (0 < self.ttft_engine_share <= 1 and 0 < self.itl_share <= 1 and 0 < self.tolerance < 1):
            raise ValueError("shares must be in (0, 1], tolerance in (0, 1)")
        if not 0 < self.max_decrease < 1:
            raise ValueError("max_decrease must be in (0, 1)")
        if not 0 <= self.queue_headroom < 1:
            raise ValueError("queue_headroom must be in [0, 1)")
        if not (self.ttft_slo_s > 0 and self.itl_slo_s > 0 and math.isfinite(self.ttft_slo_s + self.itl_slo_s)):
            raise ValueError("the SLOs must be positive and finite")


@dataclass(frozen=True)
class Ticket:
    """One request in the engine: handed back to first_token() and finish()."""

    dispatched_at: float
    queue_wait_s: float
    # Dispatched into a full batch (in flight reached the limit): its latency shows what the
    # current limit costs. Growth is earned only on such samples: right after a raise the batch
    # fills over a second or more, and early streams of a half-filled batch look fast.
    full: bool = True
    tenant: str = DEFAULT_SHARE.tenant  # whose slot it is (the gate counts slots per tenant)


@dataclass(frozen=True)
class Decision:
    action: Literal["admit", "queue", "refuse"]
    ticket: Ticket | None = None  # admit
    deadline: float | None = None  # queue: refuse with QUEUE_TIMEOUT if still waiting then
    reason: errors.ErrorCode | None = None  # refuse: an overload code
    retry_after_s: int | None = None  # refuse


def sample(value: float) -> float | None:
    """A latency as the limiter may use it: non-negative, capped at MAX_SAMPLE_S (an infinity too);
    None (dropped) for NaN and for negative gaps (a clock stepped back)."""
    if not (value >= 0.0):  # also False for NaN
        return None
    return min(value, MAX_SAMPLE_S)


def quantile(values: list[float], q: float) -> float:
    """Nearest-rank q-th percentile of a non-empty sample (the sidecar imports nothing from tools)."""
    xs = sorted(values)
    return xs[min(len(xs) - 1, max(0, math.ceil(q / 100 * len(xs)) - 1))]


class AdaptiveLimit:
    """The limit alone: fed per-request latency samples, moved once per window."""

    def __init__(self, config: LimitConfig, ceiling: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.config = config
        self.clock = clock
        self.floor = config.min_limit
        self.ceiling = max(ceiling, self.floor)
        self._limit = float(min(max(config.initial_limit, self.floor), self.ceiling))
        self.ttft_target_s = config.ttft_slo_s * config.ttft_engine_share
        self.itl_target_s = config.itl_slo_s * config.itl_share
        self.slow_start = True
        self.decreased_at = self.changed_at = self._created_at = clock()
        self.last_pressure: float | None = None
        self._raised_from: tuple[float, float] | None = None  # (limit, token rate there) before the last raise
        self._hold = 0  # windows left without a raise
        self._reset_window(self.decreased_at)

    @property
    def limit(self) -> int:
        return int(self._limit)

    def set_ceiling(self, ceiling: int, initial: int | None = None) -> None:
        """The engine's capacity, learned after start. `initial`: where to start instead, if the
        limit has not moved yet (before the engine answered, the ceiling was a guess)."""
        self.ceiling = max(ceiling, self.floor)
        if initial is not None and self.slow_start and self.changed_at == self._created_at:
            self._limit = float(min(max(initial, self.floor), self.ceiling))
        self._limit = min(self._limit, float(self.ceiling))

    def _reset_window(self, now: float) -> None:
        self._window_start = now
        self._ttfts: list[float] = []
        self._itls: list[float] = []
        self._fresh_itls = 0  # ITL samples of requests dispatched at the current limit
        self._full_itls: list[float] = []  # the same, those dispatched into a full batch
        self._binding = False

    def note_binding(self) -> None:
        """A request found every slot taken: the limit, not the demand, set the concurrency."""
        self._binding = True

    def on_ttft(self, dispatched_at: float, ttft_s: float) -> None:
        value = sample(ttft_s)
        if value is not None and dispatched_at >= self.decreased_at:
            self._ttfts.append(value)
        self._maybe_update()

    def on_itl(self, dispatched_at: float, itl_s: float, full: bool = True) -> None:
        value = sample(itl_s)
        if value is not None and dispatched_at >= self.decreased_at:
            self._itls.append(value)
            if dispatched_at >= self.changed_at and full:
                self._fresh_itls += 1
                self._full_itls.append(value)
        self._maybe_update()

    def on_finish(self, dispatched_at: float, itl_s: float | None, outcome: Outcome, full: bool = True) -> None:
        if outcome == "ok" and itl_s is not None:
            self.on_itl(dispatched_at, itl_s, full)
            return
        self._maybe_update()

    def _maybe_update(self) -> None:
        now = self.clock()
        n = len(self._ttfts) + len(self._itls)
        elapsed = now - self._window_start
        if elapsed < 0:  # the clock stepped back: the window starts again from here
            self._window_start = now
            return
        if not (
            (n >= self.config.min_samples and elapsed >= self.config.window_s)
            or (n >= 1 and elapsed >= self.config.max_window_s)
        ):
            return
        old = self._limit
        try:
            proposed = self._next_limit()
        finally:
            self._reset_window(now)  # a window that failed is dropped, never evaluated again
        # Total by construction; kept anyway so that no future term can leave the bounds.
        if math.isfinite(proposed):
            self._limit = min(float(self.ceiling), max(float(self.floor), proposed))
        if int(self._limit) != int(old):
            self.changed_at = now
        if int(self._limit) < int(old):
            self.decreased_at = now

    def _next_limit(self) -> float:
        cfg, limit = self.config, self._limit
        pressures = []
        if self._ttfts:
            pressures.append(quantile(self._ttfts, cfg.quantile) / self.ttft_target_s)
        if self._itls:
            pressures.append(quantile(self._itls, cfg.quantile) / self.itl_target_s)
        p = max(pressures)
        self.last_pressure = p
        if p > 1:
            self.slow_start = False
            return max(self.floor, limit * max(cfg.max_decrease, 1 / p))
        # A median gap of 0 (every token of the window's streams in one read) measures no rate.
        gap = quantile(self._full_itls, 50) if self._full_itls else 0.0
        rate = limit / gap if gap > 0 else None
        if rate is not None and self._raised_from is not None:
            before, before_rate = self._raised_from
            self._raised_from = None
            if rate < before_rate * (1 + cfg.min_gain):
                self.slow_start = False  # the raise bought no throughput: back, and stay a while
                self._hold = cfg.hold_windows
                return max(self.floor, before)
        if self._hold:
            self._hold -= 1
            return limit
        if p < cfg.tolerance and self._binding and self._fresh_itls and limit < self.ceiling:
            grown = limit * 2 if self.slow_start else limit + max(1.0, math.sqrt(limit))
            if rate is not None:
                self._raised_from = (limit, rate)
            return min(self.ceiling, grown)
        return limit


class ConcurrencyGate:
    """Counts, limit and queue policy together: what AdaptiveAdmission asks on every arrival and release.

    Protocol (AdaptiveAdmission, admission/adaptive.py, keeps the waiters, FIFO, and their timers):
      d = gate.arrive(share)             admit -> relay; queue -> wait until d.deadline; refuse -> 429
      gate.dispatch(enqueued_at, tenant) when handing a freed slot to the next waiter (while can_dispatch())
      gate.leave_queue(tenant)           a waiter timed out or went away; then gate.refusal(QUEUE_TIMEOUT, share)
      gate.first_token(ticket)           the relay saw the first token
      gate.inter_token(ticket, itl_s)    the stream's mean gap after config.probe_tokens tokens
      gate.finish(ticket, itl_s, outcome)   the relay is done; then hand slots out while can_dispatch()
    """

    def __init__(self, config: LimitConfig, ceiling: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.config = config
        self.clock = clock
        self.limiter = AdaptiveLimit(config, ceiling, clock)
        self.in_flight = 0
        self.queued = 0
        self.queued_by: dict[str, int] = {}  # waiting requests per tenant (no entry at 0)
        self._weights: dict[str, float] = {}  # the weight of each tenant with waiting requests
        self.in_flight_by: dict[str, int] = {}  # slots held per tenant (no entry at 0)
        self._active: dict[str, float] = {}  # the weight of each tenant with requests in flight or waiting
        self._srtt: float | None = None  # smoothed engine TTFT
        self._rttvar = 0.0
        self._service_s: float | None = None  # smoothed dispatch -> finish of measured requests

    @property
    def limit(self) -> int:
        return self.limiter.limit

    @property
    def ceiling(self) -> int:
        return self.limiter.ceiling

    def can_dispatch(self) -> bool:
        return self.in_flight < self.limit

    # --- the queue policy -------------------------------------------------------------------
    def expected_ttft_s(self) -> float:
        """Engine TTFT to budget for: srtt + 2 rttvar; the engine's target share before any sample."""
        if self._srtt is None:
            return self.limiter.ttft_target_s
        return self._srtt + 2 * self._rttvar

    def max_queue_wait_s(self) -> float:
        budget = self.config.ttft_slo_s * (1 - self.config.queue_headroom)
        return max(0.0, budget - self.expected_ttft_s())

    def service_rate(self) -> float | None:
        """Requests per second a saturated engine completes: limit / mean service time (Little)."""
        if not self._service_s:
            return None
        return self.limit / self._service_s

    def expected_wait_s(self, position: int, share: Share | None = None) -> float:
        """Expected queue wait of the request at 1-based `position` in the queue of `share`'s
        tenant, served at that tenant's fair part of the service rate (0 when nothing is measured
        yet); without a share, at `position` in the whole queue."""
        mu = self.service_rate()
        if not mu:
            return 0.0
        if share is None:
            return position / mu
        others = sum(w for tenant, w in self._weights.items() if tenant != share.tenant)
        return position * (others + share.weight) / (mu * share.weight)

    def wait_of(self, share: Share, ahead: int | None) -> float:
        """The expected queue wait of a newcomer of `share`'s tenant: behind `ahead` waiters, or by
        the fluid estimate when no position is known."""
        if ahead is not None:
            return self.expected_wait_s(ahead + 1)
        return self.expected_wait_s(self.queued_by.get(share.tenant, 0) + 1, share)

    def retry_after_s(self, share: Share = DEFAULT_SHARE, ahead: int | None = None) -> int:
        """Seconds until a newcomer of `share`'s tenant would be admissible again if nothing else
        arrived: its expected wait, minus what the SLO allows, at least 1."""
        excess = self.wait_of(share, ahead) - self.max_queue_wait_s()
        if not excess < self.config.retry_after_max_s:  # NaN included: say the longest
            return self.config.retry_after_max_s
        return int(max(1, math.ceil(excess)))

    def refusal(self, reason: errors.ErrorCode, share: Share = DEFAULT_SHARE, ahead: int | None = None) -> Decision:
        return Decision("refuse", reason=reason, retry_after_s=self.retry_after_s(share, ahead))

    # --- the calls admission makes ---------------------------------------------------------
    def arrive(self, share: Share = DEFAULT_SHARE, ahead: int | None = None) -> Decision:
        """`ahead`: the waiters the fair queue would serve before this request (None: the fluid
        estimate by weight)."""
        now = self.clock()
        if self.queued == 0 and self.can_dispatch():
            self._take_slot(share)
            return Decision("admit", ticket=Ticket(now, 0.0, self.in_flight >= self.limit, share.tenant))
        self.limiter.note_binding()
        mine = self.queued_by.get(share.tenant, 0)
        if not mine and self.below_share(share) and self.in_flight < self.ceiling:
            self._take_slot(share)  # borrowed: repaid by the next slot freed
            return Decision("admit", ticket=Ticket(now, 0.0, True, share.tenant))
        if self.queued >= self.config.max_queue or mine >= share.queue_cap(self.config.max_queue):
            return self.refusal(QUEUE_FULL, share, ahead)
        if self.service_rate() is None and self.queued >= self.limit:
            return self.refusal(QUEUE_FULL, share, ahead)  # nothing measured yet: queue one round at most
        max_wait = self.max_queue_wait_s()
        if self.wait_of(share, ahead) > max_wait or max_wait <= 0:
            return self.refusal(SLO_UNREACHABLE, share, ahead)
        self.queued += 1
        self.queued_by[share.tenant] = mine + 1
        self._weights[share.tenant] = share.weight
        self._active[share.tenant] = share.weight
        return Decision("queue", deadline=now + max_wait)

    def fair_slots(self, share: Share) -> float:
        """The tenant's fair share of the limit: limit x its weight over the weights of the tenants
        with requests in flight or waiting (it included)."""
        others = sum(w for tenant, w in self._active.items() if tenant != share.tenant)
        return self.limit * share.weight / (others + share.weight)

    def below_share(self, share: Share) -> bool:
        """One more slot keeps the tenant within its fair share of the limit."""
        return self.in_flight_by.get(share.tenant, 0) + 1 <= self.fair_slots(share)

    def _take_slot(self, share: Share) -> None:
        self.in_flight += 1
        self.in_flight_by[share.tenant] = self.in_flight_by.get(share.tenant, 0) + 1
        self._active[share.tenant] = share.weight

    def _free_slot(self, tenant: str) -> None:
        self.in_flight -= 1
        if _count_down(self.in_flight_by, tenant) and tenant not in self.queued_by:
            self._active.pop(tenant, None)

    def arrive_plain(self, share: Share = DEFAULT_SHARE) -> Decision:
        """arrive() without the queue policy's estimates: what admission falls back to if those fail."""
        if self.queued == 0 and self.can_dispatch():
            self._take_slot(share)
            return Decision("admit", ticket=Ticket(self.clock(), 0.0, self.in_flight >= self.limit, share.tenant))
        return Decision("refuse", reason=QUEUE_FULL, retry_after_s=self.config.retry_after_max_s)

    def dispatch(self, enqueued_at: float, tenant: str = DEFAULT_SHARE.tenant) -> Ticket:
        """A waiter of `tenant` takes a free slot (call only when can_dispatch())."""
        now = self.clock()
        weight = self._weights.get(tenant, 1.0)
        self.leave_queue(tenant)
        self._take_slot(Share(tenant, weight))
        return Ticket(now, now - enqueued_at, self.in_flight >= self.limit, tenant)

    def leave_queue(self, tenant: str = DEFAULT_SHARE.tenant) -> None:
        self.queued -= 1
        if _count_down(self.queued_by, tenant):
            self._weights.pop(tenant, None)
            if tenant not in self.in_flight_by:
                self._active.pop(tenant, None)

    def first_token(self, ticket: Ticket) -> None:
        ttft = sample(self.clock() - ticket.dispatched_at)
        if ttft is None:
            return
        if self._srtt is None:
            self._srtt, self._rttvar = ttft, ttft / 2
        else:
            self._rttvar = 0.75 * self._rttvar + 0.25 * abs(self._srtt - ttft)
            self._srtt = 0.875 * self._srtt + 0.125 * ttft
        self.limiter.on_ttft(ticket.dispatched_at, ttft)

    def inter_token(self, ticket: Ticket, itl_s: float) -> None:
        """The stream's mean inter-token gap so far (the relay calls it once, after probe_tokens)."""
        self.limiter.on_itl(ticket.dispatched_at, itl_s, ticket.full)

    def finish(self, ticket: Ticket, itl_s: float | None = None, outcome: Outcome = "ok") -> None:
        """The slot is freed first: whatever the learning below does, the count stays right."""
        self._free_slot(ticket.tenant)
        took = sample(self.clock() - ticket.dispatched_at)
        if outcome == "ok" and took is not None:
            self._service_s = took if self._service_s is None else 0.8 * self._service_s + 0.2 * took
        self.limiter.on_finish(ticket.dispatched_at, itl_s, outcome, ticket.full)


def _count_down(counts: dict[str, int], tenant: str) -> bool:
    """One less for `tenant`; True when that was its last (its entry is then gone: no zeros kept)."""
    left = counts.get(tenant, 0) - 1
    if left > 0:
        counts[tenant] = left
        return False
    counts.pop(tenant, None)
    return True
