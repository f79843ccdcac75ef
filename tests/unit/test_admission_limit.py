"""admission/limit.py: the adaptive concurrency limit and its SLO-bounded queue, driven by a fake engine whose latency
the test controls and a fake clock (a discrete-event simulation: no sleeps, no sockets).

The fake engine is on purpose: it injects exactly the latency each test needs (low, high, growing
with concurrency) so the control loop's response can be asserted; the real engine's behaviour is
what benchmarks/goodput.py measures."""

from __future__ import annotations

import heapq
import itertools
import random
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest

from palmyra_serve.sidecar.admission.limit import (
    QUEUE_FULL,
    QUEUE_TIMEOUT,
    SLO_UNREACHABLE,
    ConcurrencyGate,
    LimitConfig,
    Ticket,
    quantile,
)
from tests.helpers.clock import FakeClock

TOKENS = 64


@dataclass
class Sim:
    """Poisson arrivals into a ConcurrencyGate in front of a fake engine: `latency(in_flight)` gives
    the (engine TTFT, mean inter-token gap) of a request dispatched at that concurrency."""

    gate: ConcurrencyGate
    clock: FakeClock
    latency: Callable[[int], tuple[float, float]]
    waiters: list[tuple[float, float]] = field(default_factory=list)  # (enqueued_at, deadline), FIFO
    events: list = field(default_factory=list)
    seq: itertools.count = field(default_factory=itertools.count)
    limits: list[int] = field(default_factory=list)
    queue_waits: list[float] = field(default_factory=list)
    client_ttfts: list[float] = field(default_factory=list)  # queue wait + engine TTFT, as a client sees it
    refusals: list[tuple[str, int]] = field(default_factory=list)
    admitted: int = 0

    def _push(self, at: float, kind: str, payload: object) -> None:
        heapq.heappush(self.events, (at, next(self.seq), kind, payload))

    def _start(self, ticket: Ticket) -> None:
        self.admitted += 1
        ttft, itl = self.latency(self.gate.in_flight)
        self._push(self.clock.now + ttft, "first", ticket)
        self._push(self.clock.now + ttft + self.gate.config.probe_tokens * itl, "probe", (ticket, itl))
        self._push(self.clock.now + ttft + (TOKENS - 1) * itl, "done", (ticket, itl))
        self.client_ttfts.append(ticket.queue_wait_s + ttft)

    def _hand_out(self) -> None:
        while self.waiters and self.gate.can_dispatch():
            enqueued_at, _ = self.waiters.pop(0)
            ticket = self.gate.dispatch(enqueued_at)
            self.queue_waits.append(ticket.queue_wait_s)
            self._start(ticket)

    def _expire(self) -> None:
        while self.waiters and self.waiters[0][1] < self.clock.now:
            self.waiters.pop(0)
            self.gate.leave_queue()
            d = self.gate.refusal(QUEUE_TIMEOUT)
            self.refusals.append((QUEUE_TIMEOUT, d.retry_after_s or 0))

    def run(self, rate: float, seconds: float, seed: int = 0) -> None:
        rng = random.Random(seed)
        t, end = self.clock.now, self.clock.now + seconds
        while (t := t + rng.expovariate(rate)) < end:
            self._push(t, "arrive", None)
        while self.events:
            at, _, kind, payload = heapq.heappop(self.events)
            self.clock.now = at
            self._expire()
            if kind == "arrive":
                d = self.gate.arrive()
                if d.action == "admit":
                    assert d.ticket is not None
                    self._start(d.ticket)
                elif d.action == "queue":
                    assert d.deadline is not None
                    self.waiters.append((at, d.deadline))
                else:
                    assert d.reason is not None and d.retry_after_s is not None
                    self.refusals.append((d.reason, d.retry_after_s))
            elif kind == "first":
                self.gate.first_token(payload)
            elif kind == "probe":
                self.gate.inter_token(*payload)
            else:
                ticket, itl = payload
                self.gate.finish(ticket, itl, "ok")
                self._hand_out()
            self.limits.append(self.gate.limit)


def make(ceiling: int = 64, clock: FakeClock | None = None, **overrides) -> tuple[ConcurrencyGate, FakeClock]:
    clock = clock or FakeClock()
    return ConcurrencyGate(LimitConfig(**overrides), ceiling, clock), clock


def fast(_in_flight: int) -> tuple[float, float]:
    return 0.05, 0.02


def slow(_in_flight: int) -> tuple[float, float]:
    return 0.05, 0.6  # every stream over the 0.25 s ITL SLO


def batch_bound(in_flight: int) -> tuple[float, float]:
    """Like a compute-bound CPU engine: every stream slows in proportion to the batch above 4."""
    return 0.05 + 0.01 * in_flight, 0.01 * max(4, in_flight)


def test_limit_rises_to_the_ceiling_when_latency_stays_low() -> None:
    gate, clock = make(ceiling=48, initial_limit=4)
    sim = Sim(gate, clock, fast)
    sim.run(rate=200, seconds=30)
    assert sim.limits[0] == 4
    assert max(sim.limits) == 48, "low latency with demand to spare lets the limit grow to the ceiling"
    assert gate.limit == 48
    assert gate.limiter.slow_start, "never a reason to leave slow start"


def test_limit_does_not_grow_without_demand() -> None:
    gate, clock = make(ceiling=64, initial_limit=8)
    sim = Sim(gate, clock, fast)
    sim.run(rate=2, seconds=30)  # ~2 in flight: the limit never binds
    assert max(sim.limits) == 8


def test_limit_falls_to_the_floor_when_latency_stays_high() -> None:
    gate, clock = make(ceiling=64, initial_limit=32, min_limit=3)
    sim = Sim(gate, clock, slow)
    sim.run(rate=50, seconds=240)  # a 38 s stream reports its ITL at its end: one step per round trip
    assert min(sim.limits) == 3, "over the SLO the limit keeps falling, down to the floor"
    assert gate.limit == 3
    assert not gate.limiter.slow_start


def test_limit_settles_where_the_engine_meets_the_slo() -> None:
    # ITL = 0.01 s x in_flight: the 0.8 x 0.25 s = 0.2 s target is met up to 20 in flight, and the
    # token rate (in flight / ITL) is flat above 4: a raise buys nothing, so the limit stays low.
    gate, clock = make(ceiling=128, initial_limit=4)
    sim = Sim(gate, clock, batch_bound)
    sim.run(rate=100, seconds=90)
    settled = sim.limits[len(sim.limits) // 2 :]
    assert max(sim.limits) <= 128
    assert gate.config.min_limit <= min(settled) and max(settled) <= 30, (min(settled), max(settled))
    good = sum(t <= 2.0 for t in sim.client_ttfts[len(sim.client_ttfts) // 2 :])
    assert good / len(sim.client_ttfts[len(sim.client_ttfts) // 2 :]) > 0.95


def test_limit_stays_between_floor_and_ceiling_whatever_the_latency() -> None:
    gate, clock = make(ceiling=20, initial_limit=10, min_limit=2)
    phases = iter([fast, slow, fast, slow, batch_bound])
    for latency in phases:
        sim = Sim(gate, clock, latency)
        sim.run(rate=80, seconds=15)
        assert all(2 <= lim <= 20 for lim in sim.limits)


def test_queue_wait_is_bounded_by_what_the_ttft_slo_leaves() -> None:
    gate, clock = make(ceiling=16, initial_limit=16)
    sim = Sim(gate, clock, batch_bound)
    sim.run(rate=60, seconds=40)  # far more than 16 streams of ~1 s can serve
    assert sim.queue_waits, "some requests waited"
    assert max(sim.queue_waits) <= 2.0
    assert sum(t <= 2.0 for t in sim.client_ttfts) / len(sim.client_ttfts) > 0.95, (
        "what is admitted is served within the TTFT SLO"
    )
    reasons = {r for r, _ in sim.refusals}
    assert SLO_UNREACHABLE in reasons, "the excess is refused on arrival"


def test_refusal_is_immediate_when_the_queue_cannot_be_served_in_time() -> None:
    gate, clock = make(ceiling=64, initial_limit=2, min_limit=2)
    # Teach the gate the engine: TTFT 0.4 s, 4 s per request.
    for _ in range(3):
        t = gate.arrive().ticket
        assert t is not None
        clock.now += 0.4
        gate.first_token(t)
        clock.now += 3.6
        gate.finish(t, 0.05)
    # mu = 2 / 4 s = 0.5/s; expected engine TTFT = srtt + 2 rttvar.
    assert gate.service_rate() == pytest.approx(0.5)
    max_wait = 2.0 - gate.expected_ttft_s()
    assert max_wait == pytest.approx(2.0 - 0.4 - 2 * gate._rttvar)
    a, b = gate.arrive(), gate.arrive()  # both slots
    assert (a.action, b.action) == ("admit", "admit")
    queued = gate.arrive()  # expected wait 1 / 0.5 = 2 s > max_wait: no queueing at all
    assert queued.action == "refuse" and queued.reason == SLO_UNREACHABLE
    assert gate.queued == 0 and clock.now == pytest.approx(12.0), "decided on arrival, nothing waited"
    # Retry-After = ceil(W - max_wait) with W = (queued + 1) / mu = 2 s.
    assert queued.retry_after_s == max(1, -(-(2.0 - max_wait) // 1))


def test_a_queued_request_gets_a_deadline_within_the_slo_and_retry_after_reflects_the_queue() -> None:
    gate, clock = make(ceiling=64, initial_limit=4, min_limit=4, retry_after_max_s=30)
    for _ in range(2):  # engine TTFT exactly 0.2 s every time, 0.5 s per request: mu = 8/s
        t = gate.arrive().ticket
        assert t is not None
        clock.now += 0.2
        gate.first_token(t)
        clock.now += 0.3
        gate.finish(t, 0.01)
    for _ in range(4):
        assert gate.arrive().action == "admit"
    max_wait = gate.max_queue_wait_s()
    assert 0 < max_wait < 2.0
    decisions = [gate.arrive() for _ in range(40)]
    queued = [d for d in decisions if d.action == "queue"]
    refused = [d for d in decisions if d.action == "refuse"]
    assert queued and refused
    assert all(d.deadline is not None and d.deadline - clock.now <= max_wait + 1e-9 for d in queued)
    # Admitted to the queue while (position / mu) <= max_wait; refused beyond.
    mu = gate.service_rate()
    assert mu is not None, "measured from the admissions above"
    assert len(queued) == int(max_wait * mu)
    assert {d.reason for d in refused} == {SLO_UNREACHABLE}
    expected = max(1, -int(-((len(queued) + 1) / mu - max_wait) // 1))
    assert refused[0].retry_after_s == expected


def test_queue_full_is_a_hard_cap() -> None:
    gate, _ = make(ceiling=64, initial_limit=1, min_limit=1, max_queue=3)
    assert gate.arrive().action == "admit"
    assert gate.arrive().action == "queue"  # nothing measured yet: one round (the limit) may queue
    d = gate.arrive()
    assert (d.action, d.reason) == ("refuse", QUEUE_FULL)
    # A limit that would let a whole round queue: max_queue still caps it.
    gate, _ = make(ceiling=64, initial_limit=8, min_limit=1, max_queue=3)
    assert [gate.arrive().action for _ in range(8 + 3)] == ["admit"] * 8 + ["queue"] * 3
    d = gate.arrive()
    assert (d.action, d.reason, d.retry_after_s) == ("refuse", QUEUE_FULL, 1)


def test_failed_requests_teach_the_limit_nothing() -> None:
    """A failure (an engine 5xx, a timeout, a cut stream) can be provoked by its client: it never
    moves the limit (it used to halve it: 8 failing requests a second took it from 64 to 2)."""
    gate, clock = make(ceiling=64, initial_limit=32, min_samples=4, window_s=0.0, max_window_s=0.5)
    for _ in range(200):
        t = gate.arrive().ticket
        assert t is not None
        clock.now += 0.1
        gate.finish(t, None, "ignore")
    assert gate.limit == 32 and gate.in_flight == 0


def test_samples_from_before_a_cut_do_not_cut_again() -> None:
    gate, clock = make(ceiling=64, initial_limit=32, min_samples=4, window_s=0.0)
    old = [gate.arrive().ticket for _ in range(12)]  # dispatched under the old limit
    for t in old[:4]:
        assert t is not None
        clock.now += 0.01
        gate.finish(t, 1.0)  # 5x the ITL target: one cut, by max_decrease
    assert gate.limit == 16
    for t in old[4:]:  # the same slow streams finishing later must not cut it again
        assert t is not None
        clock.now += 0.01
        gate.finish(t, 1.0)
    assert gate.limit == 16


def test_quantile_is_nearest_rank() -> None:
    assert quantile([3.0, 1.0, 2.0], 50) == 2.0
    assert quantile([float(i) for i in range(1, 11)], 90) == 9.0
    assert quantile([5.0], 99) == 5.0


def test_bad_config_is_refused() -> None:
    with pytest.raises(ValueError):
        LimitConfig(min_limit=0)
    with pytest.raises(ValueError):
        LimitConfig(ttft_engine_share=1.5)


def test_growth_is_earned_only_in_a_full_batch() -> None:
    """After a raise the batch fills over a while; fast streams of a half-full batch must not raise
    it again (measured on the CPU engine: slow start doubled 64 -> 256 in two windows that way)."""
    gate, clock = make(ceiling=256, initial_limit=8, min_samples=1, window_s=0.0)
    tickets = [gate.arrive().ticket for _ in range(8)]  # the last one fills the batch
    assert [t.full for t in tickets if t] == [False] * 7 + [True]
    assert gate.arrive().action == "queue"  # demand beyond the limit: it binds
    clock.now += 0.1
    first = tickets[0]
    assert first is not None
    gate.inter_token(first, 0.01)  # fast, but dispatched into a batch not yet full
    assert gate.limit == 8
    last = tickets[-1]
    assert last is not None
    gate.arrive()  # still binding in this window
    gate.inter_token(last, 0.01)  # fast in a full batch: now it grows (slow start doubles)
    assert gate.limit == 16


def knee(in_flight: int) -> tuple[float, float]:
    """An engine whose token rate rises with the batch up to 16 streams and falls beyond (as the
    2-core CPU engine's did past ~50), while every stream stays inside the ITL SLO up to ~74."""
    c = max(1, in_flight)
    return 0.05, 0.02 if c <= 16 else 0.02 * (c / 16) ** 1.5


def test_a_raise_that_buys_no_throughput_is_undone() -> None:
    gate, clock = make(ceiling=128, initial_limit=8, window_s=0.5)
    sim = Sim(gate, clock, knee)
    sim.run(rate=400, seconds=120)
    settled = sim.limits[len(sim.limits) // 2 :]
    assert max(sim.limits) >= 16, "slow start climbs while the rate rises"
    assert max(settled) <= 40, f"held near the knee (16), not at the SLO's bound (~74): {max(settled)}"
    assert not gate.limiter.slow_start
