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

from palmyra_serve.sidecar.admission.fair_queue import FairQueue
from palmyra_serve.sidecar.admission.limit import SLO_UNREACHABLE, ConcurrencyGate, LimitConfig
from palmyra_serve.sidecar.core.share import Share
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
    for _ in range(rounds):
        served.append(queue.pop())
    counts = Counter(t for t, _ in served)
    # SFQ's fairness bound for tenants backlogged throughout (unit-cost requests): the service of
    # any two, each over its weight, differs by at most 1/w_i + 1/w_j.
    for i in shares:
        for j in shares:
            assert abs(counts[i.tenant] / i.weight - counts[j.tenant] / j.weight) <= 1 / i.weight + 1 / j.weight
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
    heavy_backlog=st.integers(0, 200),
    served=st.integers(0, 50),
    heavy_weight=st.sampled_from([0.5, 1.0, 4.0]),
    light_weight=st.sampled_from([0.5, 1.0, 4.0]),
    service_s=st.floats(0.05, 20.0),
    limit=st.integers(1, 64),
)
def test_a_light_tenant_is_judged_by_its_place_in_the_fair_queue_not_the_heavy_backlog(
    heavy_backlog, served, heavy_weight, light_weight, service_s, limit
) -> None:
    heavy = Share("heavy", heavy_weight, 0.5)
    light = Share("light", light_weight, 0.5)
    queue: FairQueue[int] = FairQueue()
    for i in range(heavy_backlog):
        queue.push(heavy, i)
    for _ in range(min(served, heavy_backlog)):
        queue.pop()
    waiting = len(queue)
    # The fair queue's own answer: a tenant with nothing waiting is served next (before anything
    # was served, after the one head whose tag ties with it); the heavy one waits behind its own
    # backlog, whoever else is there.
    ahead = queue.ahead_of(light)
    assert ahead == (1 if waiting and not served else 0)
    assert queue.ahead_of(heavy) == waiting
    # ... which is what the queue then does.
    queue.push(light, -1)
    assert [queue.pop() for _ in range(ahead + 1)][-1] == -1

    clock = FakeClock(100.0)
    config = LimitConfig(min_limit=limit, initial_limit=limit, max_queue=1000, queue_headroom=0.1)
    gate = ConcurrencyGate(config, limit, clock)
    tickets = [gate.arrive().ticket for _ in range(limit)]  # the engine full
    clock.now += service_s
    assert tickets[0] is not None
    gate.finish(tickets[0], None, "ok")  # one measured request: the service rate is known
    assert gate.arrive().action == "admit"
    for _ in range(waiting):  # the heavy backlog in the gate's counts
        gate.queued += 1
        gate.queued_by["heavy"] = gate.queued_by.get("heavy", 0) + 1
    mu = gate.service_rate()
    assert mu is not None and mu > 0
    assert math.isclose(gate.wait_of(light, 0), 1 / mu, rel_tol=1e-9)  # whatever the backlog
    decision = gate.arrive(light, 0)
    if 1 / mu > gate.max_queue_wait_s():
        assert decision.action == "refuse" and decision.reason == SLO_UNREACHABLE
    else:
        assert decision.action == "queue"
        assert gate.queued_by["light"] == 1 and gate.queued == waiting + 1
        gate.leave_queue("light")
        assert "light" not in gate.queued_by and gate.queued == waiting
    # Without a position, the fluid estimate: its part of the rate by weight.
    others = heavy_weight if waiting else 0.0
    gate._weights.update({"heavy": heavy_weight} if waiting else {})
    assert math.isclose(gate.wait_of(light, None), (others + light_weight) / (mu * light_weight), rel_tol=1e-9)


tenant_ops = st.lists(
    st.one_of(
        st.tuples(st.just("arrive"), st.integers(0, 2)),
        st.tuples(st.just("finish"), st.integers(0, 1000)),
        st.tuples(st.just("dispatch"), st.just(0)),
        st.tuples(st.just("leave"), st.integers(0, 2)),
    ),
    max_size=200,
)


@settings(max_examples=300, deadline=None)
@given(
    limit=st.integers(1, 16),
    headroom=st.integers(0, 16),
    weights=st.tuples(st.sampled_from([0.5, 1.0, 3.0]), st.sampled_from([0.5, 1.0, 3.0])),
    ops=tenant_ops,
    one_tenant=st.booleans(),
)
def test_slots_are_shared_by_weight_within_the_ceiling(limit, headroom, weights, ops, one_tenant) -> None:
    """Counts stay consistent per tenant; in flight never passes the engine's ceiling, and with one
    tenant never the limit (nothing borrowed); a tenant below its share with no waiter of its own
    is never made to wait while the ceiling allows."""
    clock = FakeClock(0.0)
    config = LimitConfig(min_limit=limit, initial_limit=limit, max_queue=64)
    ceiling = limit + headroom
    gate = ConcurrencyGate(config, ceiling, clock)
    gate.limiter.set_ceiling(ceiling, limit)
    shares = [Share("a", weights[0], 0.5), Share("b", weights[1], 0.5), Share("c", 1.0, 0.5)]
    if one_tenant:
        shares = [shares[0]] * 3
    tickets = []
    for op, n in ops:
        clock.now += 0.01
        if op == "arrive":
            share = shares[n]
            entitled = not gate.queued_by.get(share.tenant) and gate.below_share(share) and gate.in_flight < ceiling
            free = gate.queued == 0 and gate.can_dispatch()
            d = gate.arrive(share, None)
            if d.action == "admit":
                assert d.ticket is not None and d.ticket.tenant == share.tenant
                tickets.append(d.ticket)
            elif entitled or free:
                raise AssertionError(f"{share.tenant} was entitled to a slot: {d}")
        elif op == "finish" and tickets:
            gate.finish(tickets.pop(n % len(tickets)), 0.1, "ok")
        elif op == "dispatch" and gate.queued and gate.can_dispatch():
            tenant = next(iter(gate.queued_by))
            tickets.append(gate.dispatch(clock.now, tenant))
        elif op == "leave" and gate.queued_by.get(shares[n].tenant):
            gate.leave_queue(shares[n].tenant)
        assert gate.in_flight == sum(gate.in_flight_by.values()) == len(tickets)
        assert gate.queued == sum(gate.queued_by.values())
        assert gate.in_flight <= ceiling
        if one_tenant:
            assert gate.in_flight <= gate.limit


def test_a_waiter_that_leaves_leaves_no_debt_for_its_tenant():
    a, b = Share("a", 1.0), Share("b", 1.0)
    left: FairQueue[str] = FairQueue()
    kept: FairQueue[str] = FairQueue()
    for queue, items in ((left, ["a1", "gone", "a2"]), (kept, ["a1", "a2"])):
        for item in items:
            queue.push(a, item)
    assert left.remove("a", "gone") and not left.remove("a", "gone")
    for queue in (left, kept):
        queue.push(b, "b1")
    # The same order and the same place for a newcomer as if "gone" had never waited.
    assert left.ahead_of(a) == kept.ahead_of(a) and left.ahead_of(b) == kept.ahead_of(b)
    assert [left.pop() for _ in range(3)] == [kept.pop() for _ in range(3)]
