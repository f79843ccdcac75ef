"""The arithmetic that decides a tenant's admission, against brute force (hypothesis draws the
inputs: zero, huge and oversized amounts, corrections either way, long gaps in time).

- tenants/window.py: used() is the sum of the last 60 s; take() admits exactly when the amount
  fits (or nothing is used); without corrections the window never holds more than its limit;
  Retry-After is exact (the amount fits then, not a second earlier); reset is when usage is gone.
- admission/fair_queue.py: every waiter comes out once, each tenant's in arrival order, and
  backlogged tenants are served in proportion to their weights.
- admission/limit.py under fair share: a light tenant is judged by its own part of the service
  rate, whatever the length of a heavy tenant's queue; counts stay consistent per tenant."""

from __future__ import annotations

import math
from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from palmyra_serve.sidecar.admission.fair_queue import FairQueue, Share
from palmyra_serve.sidecar.admission.limit import SLO_UNREACHABLE, ConcurrencyGate, LimitConfig
from palmyra_serve.sidecar.tenants.window import WINDOW_S, SlidingMinute
from tests.helpers.clock import FakeClock

amounts = st.one_of(st.integers(0, 50), st.sampled_from([0, 1, 10**9]))
window_ops = st.lists(
    st.one_of(
        st.tuples(st.just("take"), amounts),
        st.tuples(st.just("settle"), st.integers(-50, 50)),
        st.tuples(st.just("tick"), st.one_of(st.integers(0, 5), st.sampled_from([59, 60, 61, 1000]))),
    ),
    max_size=120,
)


def _used(log: list[tuple[int, int]], now: int) -> int:
    return sum(a for s, a in log if s > now - WINDOW_S)


@settings(max_examples=300, deadline=None)
@given(limit=st.integers(1, 200), ops=window_ops)
def test_the_sliding_minute_matches_brute_force(limit: int, ops) -> None:
    window = SlidingMinute()
    log: list[tuple[int, int]] = []  # (second, amount) of everything counted
    taken: list[tuple[int, int]] = []  # (second, reserved) of admitted takes, for corrections
    now = 1_000_000
    for op, value in ops:
        if op == "tick":
            now += value
        elif op == "take":
            amount = min(value, limit)  # the stores cap an amount at the limit
            used = _used(log, now)
            admitted = window.take(now, amount, limit)
            assert admitted == (used <= 0 or used + amount <= limit)
            if admitted:
                log.append((now, amount))
                taken.append((now, amount))
        elif taken:
            slot, reserved = taken.pop(0)
            delta = max(value, -reserved)  # a request never costs less than nothing
            window.settle(now, slot, delta)
            if slot > now - WINDOW_S:
                log.append((slot, delta))
            elif delta > 0:
                log.append((now, delta))
        assert window.used(now) == _used(log, now)


@settings(max_examples=300, deadline=None)
@given(limit=st.integers(1, 200), ops=st.lists(st.tuples(amounts, st.integers(0, 30)), max_size=80))
def test_without_corrections_no_minute_holds_more_than_the_limit(limit: int, ops) -> None:
    window = SlidingMinute()
    now = 0
    for amount, gap in ops:
        now += gap
        window.take(now, min(amount, limit), limit)
        assert window.used(now) <= limit


@settings(max_examples=300, deadline=None)
@given(
    limit=st.integers(1, 200),
    history=st.lists(st.tuples(st.integers(1, 200), st.integers(0, 20)), min_size=1, max_size=30),
    amount=st.integers(1, 200),
)
def test_retry_after_is_exact_and_reset_is_when_usage_is_gone(limit, history, amount) -> None:
    window = SlidingMinute()
    now = 0
    for taken, gap in history:
        now += gap
        window.take(now, min(taken, limit), limit)
    amount = min(amount, limit)
    if not window.fits(now, amount, limit):
        retry = window.retry_after(now, amount, limit)
        assert 1 <= retry <= WINDOW_S
        probe = SlidingMinute(dict(window.slots))
        assert probe.fits(now + retry, amount, limit)
        assert retry == 1 or not SlidingMinute(dict(window.slots)).fits(now + retry - 1, amount, limit)
    reset = window.reset(now)
    assert 0 <= reset <= WINDOW_S
    assert SlidingMinute(dict(window.slots)).used(now + reset) == 0
    if reset:
        assert SlidingMinute(dict(window.slots)).used(now + reset - 1) > 0


@settings(max_examples=200, deadline=None)
@given(
    weights=st.lists(st.sampled_from([0.5, 1.0, 2.0, 3.0, 7.0]), min_size=1, max_size=4),
    backlog=st.integers(20, 60),
    interleave=st.lists(st.integers(0, 3), max_size=40),
)
def test_the_fair_queue_serves_each_tenant_in_order_and_by_weight(weights, backlog, interleave) -> None:
    queue: FairQueue[tuple[str, int]] = FairQueue()
    shares = [Share(f"t{i}", w) for i, w in enumerate(weights)]
    pushed: Counter[str] = Counter()
    for _ in range(backlog):  # every tenant backlogged
        for share in shares:
            queue.push(share, (share.tenant, pushed[share.tenant]))
            pushed[share.tenant] += 1
    served: list[tuple[str, int]] = []
    rounds = backlog // 2  # serve while all stay backlogged
    total_weight = sum(weights)
    for _ in range(rounds):
        served.append(queue.pop())
    counts = Counter(t for t, _ in served)
    for share in shares:  # within two waiters of its weighted share (SFQ's lag bound), per tenant
        assert abs(counts[share.tenant] - rounds * share.weight / total_weight) <= 2
    for index in interleave:  # more arrivals, some from tenants not backlogged any more
        share = shares[index % len(shares)]
        queue.push(share, (share.tenant, pushed[share.tenant]))
        pushed[share.tenant] += 1
    while queue:
        served.append(queue.pop())
    assert len(served) == sum(pushed.values()) and len(queue) == 0
    for share in shares:  # every waiter once, each tenant's in arrival order
        assert [n for t, n in served if t == share.tenant] == list(range(pushed[share.tenant]))


@settings(max_examples=300, deadline=None)
@given(
    heavy_queue=st.integers(0, 200),
    heavy_weight=st.sampled_from([0.5, 1.0, 4.0]),
    light_weight=st.sampled_from([0.5, 1.0, 4.0]),
    service_s=st.floats(0.05, 20.0),
    limit=st.integers(1, 64),
)
def test_a_light_tenant_is_judged_by_its_own_share_whatever_the_heavy_queue(
    heavy_queue, heavy_weight, light_weight, service_s, limit
) -> None:
    clock = FakeClock(100.0)
    config = LimitConfig(min_limit=limit, initial_limit=limit, max_queue=1000, queue_headroom=0.1)
    gate = ConcurrencyGate(config, limit, clock)
    tickets = [gate.arrive().ticket for _ in range(limit)]  # the engine full
    clock.now += service_s
    for ticket in tickets[:1]:  # one measured request: the service rate is known
        assert ticket is not None
        gate.finish(ticket, None, "ok")
    refill = gate.arrive()
    assert refill.action == "admit"
    light = Share("light", light_weight, 0.5)
    gate._weights["heavy"] = heavy_weight  # the heavy tenant's queue, as arrivals would have left it
    gate.queued_by["heavy"] = heavy_queue
    gate.queued = heavy_queue
    if not heavy_queue:
        gate._weights.clear()
        gate.queued_by.clear()
    mu = gate.service_rate()
    assert mu is not None and mu > 0
    others = heavy_weight if heavy_queue else 0.0
    expected = (others + light_weight) / (mu * light_weight)
    assert math.isclose(gate.expected_wait_s(1, light), expected, rel_tol=1e-9)
    decision = gate.arrive(light)
    if expected > gate.max_queue_wait_s():
        assert decision.action == "refuse" and decision.reason == SLO_UNREACHABLE
    else:
        assert decision.action == "queue"
        assert gate.queued_by["light"] == 1 and gate.queued == heavy_queue + 1
        gate.leave_queue("light")
        assert "light" not in gate.queued_by and gate.queued == heavy_queue
