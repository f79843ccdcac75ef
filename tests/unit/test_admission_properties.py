"""Adaptive admission's arithmetic is total: whatever its inputs (hypothesis draws them), the limit
stays finite within [floor, ceiling], every decision is well formed, and nothing raises.

Inputs a mechanism learns from can be zero, huge, hostile or early: latency samples of 0 (a whole
stream in one read, as a fast engine or a coalescing network gives: this once divided by zero and
broke admission for good), NaN and infinities, negative gaps and a clock that steps back, empty
and single-sample windows, bursts of arrivals with nothing measured yet."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from palmyra_serve.sidecar.admission.limit import (
    AdaptiveLimit,
    ConcurrencyGate,
    LimitConfig,
    Ticket,
    sample,
)
from tests.helpers.clock import FakeClock

# Durations: the hostile ones (0, tiny, huge, NaN, +-inf, negative) as often as ordinary ones.
hostile = st.one_of(
    st.sampled_from([0.0, 5e-324, 1e-12, 1e308, math.inf, -math.inf, math.nan, -1.0, -1e-9]),
    st.floats(min_value=0.0, max_value=5.0),
    st.floats(allow_nan=True, allow_infinity=True),
)
clock_steps = st.one_of(
    st.just(0.0), st.floats(min_value=0.0, max_value=3.0), st.floats(min_value=-5.0, max_value=20.0)
)
op = st.one_of(
    st.tuples(st.just("arrive"), st.integers(1, 40)),
    st.tuples(st.just("first"), st.integers(0, 1000)),
    st.tuples(st.just("itl"), st.integers(0, 1000), hostile),
    st.tuples(st.just("finish"), st.integers(0, 1000), hostile, st.sampled_from(["ok", "ignore"])),
    st.tuples(st.just("finish_none"), st.integers(0, 1000)),
    st.tuples(st.just("tick"), clock_steps),
    st.tuples(st.just("dispatch")),
    st.tuples(st.just("leave")),
)
configs = st.builds(
    LimitConfig,
    min_limit=st.integers(1, 8),
    initial_limit=st.integers(1, 300),
    max_queue=st.integers(0, 64),
    window_s=st.sampled_from([0.0, 0.2, 1.0]),
    min_samples=st.integers(1, 16),
    max_window_s=st.sampled_from([0.5, 10.0]),
    queue_headroom=st.sampled_from([0.0, 0.1, 0.9]),
)


def _check(gate: ConcurrencyGate) -> None:
    limiter = gate.limiter
    assert math.isfinite(limiter._limit)
    assert limiter.floor <= gate.limit <= limiter.ceiling
    wait = gate.max_queue_wait_s()
    assert math.isfinite(wait) and wait >= 0
    assert 1 <= gate.retry_after_s() <= gate.config.retry_after_max_s
    assert gate.in_flight >= 0 and gate.queued >= 0


@settings(max_examples=400, deadline=None)
@given(config=configs, ceiling=st.integers(1, 512), ops=st.lists(op, max_size=300))
def test_the_limit_stays_finite_and_within_its_bounds_whatever_the_samples(config, ceiling, ops) -> None:
    clock = FakeClock(1000.0)
    gate = ConcurrencyGate(config, ceiling, clock)
    tickets: list[Ticket] = []
    for step in ops:
        kind = step[0]
        if kind == "arrive":
            for _ in range(step[1]):
                d = gate.arrive()
                assert d.action in ("admit", "queue", "refuse")
                if d.action == "admit":
                    assert d.ticket is not None
                    tickets.append(d.ticket)
                elif d.action == "queue":
                    assert d.deadline is not None and math.isfinite(d.deadline)
                else:
                    assert d.reason and d.retry_after_s is not None and d.retry_after_s >= 1
        elif kind == "dispatch":
            if gate.queued and gate.can_dispatch():
                tickets.append(gate.dispatch(clock.now))
        elif kind == "leave":
            if gate.queued:
                gate.leave_queue()
        elif kind == "tick":
            clock.now += step[1]
        elif tickets:
            ticket = tickets[step[1] % len(tickets)]
            if kind == "first":
                gate.first_token(ticket)
            elif kind == "itl":
                gate.inter_token(ticket, step[2])
            elif kind == "finish":
                tickets.remove(ticket)
                gate.finish(ticket, step[2], step[3])
            else:
                tickets.remove(ticket)
                gate.finish(ticket, None, "ok")
        _check(gate)


@settings(max_examples=200, deadline=None)
@given(
    samples=st.lists(st.one_of(st.just(0.0), hostile), min_size=1, max_size=200),
    window=st.sampled_from([0.0, 1.0]),
)
def test_windows_of_zeros_and_hostile_values_never_raise(samples, window) -> None:
    """The reproduced crash: half of a window's full-batch gaps 0 (every event of a stream in one
    read) made the throughput estimate divide by zero, and that window was never reset."""
    clock = FakeClock(1000.0)
    limit = AdaptiveLimit(LimitConfig(initial_limit=8, min_samples=2, window_s=window), ceiling=64, clock=clock)
    for value in samples:
        clock.now += 0.3
        limit.note_binding()
        limit.on_ttft(clock.now - 0.01, 0.01)
        limit.on_itl(clock.now, value, True)
        assert math.isfinite(limit._limit) and limit.floor <= limit.limit <= limit.ceiling


def test_a_window_of_zero_gaps_measures_no_rate_and_is_reset() -> None:
    clock = FakeClock(1000.0)
    limit = AdaptiveLimit(LimitConfig(initial_limit=8, min_samples=4, window_s=0.0), ceiling=64, clock=clock)
    limit._raised_from = (4.0, 100.0)  # a raise under evaluation: the rate comparison must run
    for _ in range(4):
        clock.now += 0.1
        limit.note_binding()
        limit.on_itl(clock.now, 0.0, True)
    assert limit._full_itls == [] and limit._itls == [], "the window was evaluated and reset"
    assert limit._raised_from == (4.0, 100.0), "no rate measured: the raise is neither kept nor undone yet"


def test_samples_are_sanitised_on_the_way_in() -> None:
    assert sample(math.nan) is None and sample(-0.5) is None
    assert sample(math.inf) == sample(1e300) == 3600.0
    assert sample(0.0) == 0.0 and sample(0.25) == 0.25
