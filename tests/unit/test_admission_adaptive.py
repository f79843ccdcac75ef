"""admission/adaptive.py: the asyncio waiters in front of the ConcurrencyGate: FIFO hand-over, immediate refusals, queue
deadlines, cancellation and drain keep the gate's counts right. The gate gets a fake clock where
the test teaches it a service time, the real one where a deadline must really pass (0.15 s).
A fault while admission learns leaves the limit where it was and frees the slot."""

from __future__ import annotations

import asyncio
import time

import pytest

from palmyra_serve.sidecar.admission.adaptive import AdaptiveAdmission
from palmyra_serve.sidecar.admission.limit import (
    QUEUE_TIMEOUT,
    SLO_UNREACHABLE,
    ConcurrencyGate,
    LimitConfig,
)
from palmyra_serve.sidecar.admission.protocol import Draining, Refused
from tests.helpers.clock import FakeClock


def admission(limit: int = 2, ttft_slo_s: float = 0.3, clock=time.monotonic) -> AdaptiveAdmission:
    """Floor, start and ceiling all at `limit`: the limit cannot move, so what is tested is the waiters."""
    cfg = LimitConfig(min_limit=limit, initial_limit=limit, ttft_slo_s=ttft_slo_s)
    return AdaptiveAdmission(ConcurrencyGate(cfg, ceiling=limit, clock=clock))


async def until(cond) -> None:
    """Let the other tasks run until cond() holds; a bounded number of turns, never a hang."""
    for _ in range(1000):
        if cond():
            return
        await asyncio.sleep(0)
    raise AssertionError("condition never held")


async def teach(adm: AdaptiveAdmission, clock: FakeClock, ttft_s: float, service_s: float) -> None:
    """Two requests through the gate on the fake clock: it learns the engine's TTFT and service time."""
    for _ in range(2):
        t = await adm.acquire()
        clock.now += ttft_s
        adm.first_token(t)
        clock.now += service_s - ttft_s
        adm.release(t, 0.01)


def test_slots_pass_to_the_oldest_waiter_in_order() -> None:
    async def main() -> None:
        clock = FakeClock()
        adm = admission(limit=1, ttft_slo_s=30.0, clock=clock)
        await teach(adm, clock, 0.1, 1.0)  # 1 request/s: a waiter may be ~29 deep
        first = await adm.acquire()
        order: list[int] = []

        async def waiter(i: int) -> None:
            ticket = await adm.acquire()
            order.append(i)
            adm.release(ticket, 0.01)

        tasks = [asyncio.create_task(waiter(i)) for i in range(3)]
        await until(lambda: adm.queued == 3)
        assert adm.in_flight == 1
        adm.release(first, 0.01)
        await asyncio.gather(*tasks)
        assert order == [0, 1, 2]
        assert (adm.in_flight, adm.queued) == (0, 0)

    asyncio.run(main())


def test_refused_at_once_when_the_queue_cannot_be_served_in_time() -> None:
    async def main() -> None:
        clock = FakeClock()
        adm = admission(limit=1, ttft_slo_s=2.0, clock=clock)
        await teach(adm, clock, 0.2, 4.0)  # mu = 0.25/s: one waiter would wait 4 s, the SLO leaves < 2 s
        held = await adm.acquire()
        t0 = time.monotonic()
        with pytest.raises(Refused) as info:
            await adm.acquire()
        assert time.monotonic() - t0 < 0.05
        assert info.value.reason == SLO_UNREACHABLE and info.value.retry_after_s >= 1
        assert adm.queued == 0
        adm.release(held, 0.01)

    asyncio.run(main())


def test_a_waiter_is_refused_at_its_deadline_and_leaves_the_queue() -> None:
    async def main() -> None:
        adm = admission(limit=1, ttft_slo_s=0.3)  # no samples: expected engine TTFT = 0.15 s, wait <= 0.15 s
        held = await adm.acquire()
        t0 = time.monotonic()
        with pytest.raises(Refused) as info:
            await adm.acquire()
        waited = time.monotonic() - t0
        assert info.value.reason == QUEUE_TIMEOUT
        assert 0.1 <= waited < 0.3, "waited what the SLO leaves, no longer"
        assert (adm.in_flight, adm.queued) == (1, 0)
        adm.release(held, 0.01)
        assert (await adm.acquire()) is not None, "the slot is free again"

    asyncio.run(main())


def test_a_cancelled_waiter_leaves_no_trace() -> None:
    async def main() -> None:
        clock = FakeClock()
        adm = admission(limit=1, ttft_slo_s=30.0, clock=clock)
        await teach(adm, clock, 0.1, 1.0)
        held = await adm.acquire()
        task = asyncio.create_task(adm.acquire())
        await until(lambda: adm.queued == 1)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert adm.queued == 0
        adm.release(held, 0.01)
        assert adm.in_flight == 0

    asyncio.run(main())


def test_drain_refuses_newcomers_and_waits_for_the_last_request() -> None:
    async def main() -> None:
        adm = admission(limit=2, ttft_slo_s=30.0)
        held = await adm.acquire()
        drained = asyncio.create_task(adm.drain(5.0))
        await asyncio.sleep(0)
        with pytest.raises(Draining):
            await adm.acquire()
        assert not drained.done()
        adm.release(held, 0.01)
        assert await drained is True

    asyncio.run(main())


def test_a_fault_while_admission_learns_leaves_the_limit_and_frees_the_slot():
    import asyncio

    from palmyra_serve.sidecar.admission.adaptive import AdaptiveAdmission
    from palmyra_serve.sidecar.admission.limit import ConcurrencyGate, LimitConfig

    async def scenario() -> AdaptiveAdmission:
        adm = AdaptiveAdmission(ConcurrencyGate(LimitConfig(initial_limit=4, min_samples=1, window_s=0), 16))
        counted: list[int] = []
        adm.on_fault = lambda: counted.append(1)

        def broken() -> float:
            raise ZeroDivisionError("an arithmetic bug")

        adm.gate.limiter._next_limit = broken  # type: ignore[method-assign]  # the injected fault
        for _ in range(5):
            ticket = await adm.acquire()
            adm.first_token(ticket)
            adm.release(ticket, 0.01)
        assert counted == [1] * 10
        return adm

    adm = asyncio.run(scenario())
    assert adm.faults == 10 and adm.limit == 4 and adm.in_flight == 0
