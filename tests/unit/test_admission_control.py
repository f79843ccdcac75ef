"""admission/control.py: how the plan becomes admission (docs/admission.md, "Wiring"): the mode, the
ceiling read from the engine, where the limit starts, fixed mode's queue and drain, and the
refusal's HTTP shape."""

from __future__ import annotations

import asyncio
import json

import pytest

from palmyra_serve.settings import Settings
from palmyra_serve.sidecar.admission.control import (
    AdaptiveAdmission,
    Admission,
    AdmissionControl,
    Draining,
    Refused,
    build_admission,
    learn_ceiling,
)
from palmyra_serve.sidecar.admission.plan import AdmissionPlan
from palmyra_serve.sidecar.core import errors

# vLLM CPU 0.32's series, trimmed: 16384 blocks x 128 tokens = 2 GiB of KV cache.
CACHE_INFO = 'vllm:cache_config_info{block_size="128",engine="0",num_gpu_blocks="16384"} 1.0\n'


def built(settings: Settings) -> AdmissionControl:
    return build_admission(settings, AdmissionPlan.of(settings))


def test_adaptive_is_the_default_and_fixed_keeps_the_manual_settings() -> None:
    adaptive = built(Settings(auth_disabled=True))
    assert isinstance(adaptive, AdaptiveAdmission)
    fixed = built(Settings(admission_mode="fixed", max_in_flight=7, max_queue=3, auth_disabled=True))
    assert isinstance(fixed, Admission)
    assert (fixed.limit, fixed.max_queue, fixed.probe_tokens) == (7, 3, 0)


def test_the_ceiling_comes_from_the_engine_and_the_limit_starts_at_half_of_it() -> None:
    settings = Settings(platform="cpu", auth_disabled=True)
    adm = built(settings)
    assert (adm.ceiling, adm.limit) == (128, 64), "before the engine answers: vLLM's CPU max_num_seqs"
    # 2 GiB of KV at 2048 tokens a request holds 1024: max_num_seqs (128) stays the bound.
    assert learn_ceiling(adm, AdmissionPlan.of(settings), CACHE_INFO) == 128
    small = Settings(platform="cpu", admission_kv_tokens_per_request=65536, auth_disabled=True)
    adm = built(small)
    assert learn_ceiling(adm, AdmissionPlan.of(small), CACHE_INFO) == 32, "the KV cache bounds it: 2 097 152 / 65 536"
    assert adm.limit == 16, "a limit that never moved restarts at half the real ceiling"
    args = Settings(platform="ascend", engine_extra_args="--max-num-seqs 48", auth_disabled=True)
    assert built(args).ceiling == 48
    override = Settings(admission_max_limit=20, admission_initial_limit=3, auth_disabled=True)
    adm = built(override)
    assert (adm.ceiling, adm.limit) == (20, 3)
    assert learn_ceiling(adm, AdmissionPlan.of(override), CACHE_INFO) is None, "the operator's ceiling wins"
    fixed = Settings(admission_mode="fixed", max_in_flight=7, auth_disabled=True)
    assert learn_ceiling(built(fixed), AdmissionPlan.of(fixed), CACHE_INFO) is None, "fixed learns nothing"


def test_a_limit_that_already_moved_keeps_its_value_under_a_new_ceiling() -> None:
    # 2 097 152 KV tokens / 131 072 a request: the engine's ceiling will be 16, below the 128 it starts under.
    settings = Settings(
        platform="cpu", admission_kv_tokens_per_request=131072, admission_window_s=0, auth_disabled=True
    )
    plan = AdmissionPlan.of(settings)

    async def moved() -> AdmissionControl:
        adm = build_admission(settings, plan)
        tickets = [await adm.acquire() for _ in range(8)]  # a window's worth of samples
        for ticket in tickets:
            adm.inter_token(ticket, 5.0)  # 25x the ITL target: the limit is cut
        for ticket in tickets:
            adm.release(ticket, outcome="ignore")
        return adm

    adm = asyncio.run(moved())
    assert adm.limit == 32, "cut by half, the most one window takes"
    assert learn_ceiling(adm, plan, CACHE_INFO) == 16
    assert adm.limit == 16, "clamped to the new ceiling, not restarted at half of it (8)"


def test_fixed_mode_never_moves_whatever_the_latency() -> None:
    async def scenario() -> None:
        adm = Admission(max_in_flight=7, max_queue=0, queue_timeout_s=1.0, retry_after_s=1)
        for itl in (0.001, 5.0, float("nan"), float("inf")):  # fast, far past the SLO, hostile
            tickets = [await adm.acquire() for _ in range(7)]
            for ticket in tickets:
                adm.first_token(ticket)
                adm.inter_token(ticket, itl)
                adm.release(ticket, itl, "ok")
            assert (adm.limit, adm.ceiling, adm.in_flight) == (7, 7, 0)

    asyncio.run(scenario())


def test_admission_hands_slots_in_fifo_order_and_bounds_the_queue():
    async def scenario():
        adm = Admission(max_in_flight=1, max_queue=2, queue_timeout_s=5, retry_after_s=2)
        order = []
        await adm.acquire()

        async def waiter(name):
            await adm.acquire()
            order.append(name)

        tasks = [asyncio.create_task(waiter(n)) for n in ("a", "b")]
        await asyncio.sleep(0)
        assert adm.queued == 2
        with pytest.raises(Refused) as exc:
            await adm.acquire()
        assert exc.value.reason == "queue_full" and exc.value.retry_after_s == 2
        adm.release()
        await asyncio.sleep(0)
        adm.release()
        await asyncio.gather(*tasks)
        adm.release()
        assert order == ["a", "b"] and adm.in_flight == 0 and adm.queued == 0

    asyncio.run(scenario())


def test_admission_queue_timeout_and_drain():
    async def scenario():
        adm = Admission(max_in_flight=1, max_queue=5, queue_timeout_s=0.05, retry_after_s=1)
        await adm.acquire()
        with pytest.raises(Refused) as exc:
            await adm.acquire()
        assert exc.value.reason == "queue_timeout" and adm.queued == 0
        drained = asyncio.create_task(adm.drain(5))
        while not adm.draining:  # the drain task has begun
            await asyncio.sleep(0)
        with pytest.raises(Draining):
            await adm.acquire()
        assert not drained.done()
        adm.release()
        assert await drained is True

    asyncio.run(scenario())


@pytest.mark.parametrize("reason", errors.OVERLOAD_CODES)
def test_every_admission_refusal_is_a_429_with_its_reason_and_retry_after(reason: errors.ErrorCode) -> None:
    err = errors.overloaded(reason, 7)
    assert (err.status, err.code, err.retry_after) == (429, reason, 7)
    assert json.loads(err.body())["error"]["code"] == reason
    assert (b"retry-after", b"7") in err.headers("rid")
