"""Overload at several times capacity: bursts of 48 concurrent requests hit the real sidecar in front
of the real engine. Excess requests get a fast 429 with Retry-After, admitted ones finish with
bounded latency, and every request gets an answer (none times out). Twice: fixed admission with 4
slots and a queue of 4 (the manual settings), and adaptive admission (the default, docs/admission.md),
whose queue wait is bounded by the TTFT SLO."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator

import httpx
import pytest

from tests.helpers import procs
from tests.helpers.access_log import access_durations_s
from tests.helpers.api import HTTP, completion
from tests.helpers.reliability import FAST, figure, generate_ok, percentile, sidecar_metric
from tests.helpers.waiting import wait_until

MAX_IN_FLIGHT, MAX_QUEUE = 4, 4
BURST, WAVES = 48, 3
MAX_TOKENS = 32
QUEUE_TIMEOUT_S = 30.0


@pytest.fixture(scope="module")
def sidecar(engine_server, log_dir) -> Iterator[procs.Server]:
    env = {
        **FAST,
        "PALMYRA_ADMISSION_MODE": "fixed",
        "PALMYRA_MAX_IN_FLIGHT": str(MAX_IN_FLIGHT),
        "PALMYRA_MAX_QUEUE": str(MAX_QUEUE),
        "PALMYRA_QUEUE_TIMEOUT_S": str(QUEUE_TIMEOUT_S),
        "PALMYRA_READ_TIMEOUT_S": "30",
    }
    with procs.sidecar(engine_server.url, log_dir, engine_api_key=engine_server.api_key, extra_env=env) as server:
        yield server


async def one(client: httpx.AsyncClient, url: str, i: int) -> tuple[int | str, float, str | None]:
    payload = completion(
        f"Request {i}: tell me about the sea", max_tokens=MAX_TOKENS, ignore_eos=True, stream=i % 2 == 0
    )
    t0 = time.monotonic()
    try:
        resp = await client.post(f"{url}/v1/completions", json=payload)
        body = resp.text
        if resp.status_code == 200 and payload["stream"]:
            assert body.rstrip().endswith("data: [DONE]"), body[-200:]
        return resp.status_code, time.monotonic() - t0, resp.headers.get("retry-after")
    except httpx.HTTPError as exc:  # a client-side timeout or a broken connection: "silent" failures
        return f"{type(exc).__name__}", time.monotonic() - t0, None


async def burst(url: str, n: int) -> list[tuple[int | str, float, str | None]]:
    limits = httpx.Limits(max_connections=n, max_keepalive_connections=n)
    async with httpx.AsyncClient(verify=False, timeout=QUEUE_TIMEOUT_S + 60, limits=limits) as client:
        return await asyncio.gather(*(one(client, url, i) for i in range(n)))


def test_overload_gets_fast_429s_and_bounded_latency_for_the_admitted(sidecar):
    single = []
    for _ in range(3):  # the unloaded latency of one such request, for scale
        t0 = time.monotonic()
        assert (
            HTTP.post(
                f"{sidecar.url}/v1/completions", timeout=60, json=completion(max_tokens=MAX_TOKENS, ignore_eos=True)
            ).status_code
            == 200
        )
        single.append(time.monotonic() - t0)
    results = []
    for _ in range(WAVES):
        results += asyncio.run(burst(sidecar.url, BURST))
    accepted = [took for status, took, _ in results if status == 200]
    rejected = [(took, ra) for status, took, ra in results if status == 429]
    other = [status for status, _, _ in results if status not in (200, 429)]
    p99_admitted = percentile(accepted, 99)
    p99_rejected = percentile([t for t, _ in rejected], 99)
    # The assertions use the timings the sidecar logged (arrival to last byte written): the client's
    # also carry the VM's loopback stalls, which have reached seconds under this load.
    # The access log is flushed within 50 ms: wait for every request's line.
    wait_until(
        lambda: sum(len(access_durations_s(sidecar.log(), s)) for s in (200, 429)) >= len(accepted) + len(rejected),
        5,
        "every request in the access log",
    )
    sidecar_admitted, sidecar_rejected = (access_durations_s(sidecar.log(), status) for status in (200, 429))
    figure(
        "overload",
        sent=len(results),
        accepted=len(accepted),
        rejected=len(rejected),
        other=other,
        capacity=f"{MAX_IN_FLIGHT} in flight + {MAX_QUEUE} queued",
        burst=BURST,
        waves=WAVES,
        unloaded_s=round(min(single), 3),
        admitted_p50_s=round(percentile(accepted, 50), 3),
        admitted_p99_s=round(p99_admitted, 3),
        rejected_p99_s=round(p99_rejected, 3),
        in_sidecar_admitted_p99_s=round(percentile(sidecar_admitted, 99), 3),
        in_sidecar_rejected_p99_s=round(percentile(sidecar_rejected, 99), 4),
    )
    assert not other, f"every request must get 200 or 429, got {other}"
    assert len(accepted) >= WAVES * (MAX_IN_FLIGHT + MAX_QUEUE), "at least capacity is served in each wave"
    assert len(rejected) >= WAVES * (BURST - 2 * (MAX_IN_FLIGHT + MAX_QUEUE)), "the excess is refused"
    assert all(ra == "1" for _, ra in rejected), "every 429 carries Retry-After"
    # A refusal must not wait for a slot: typically milliseconds, and never anywhere near the queue
    # timeout a queued request would have waited out. Not a p99: on 2 vCPUs the sidecar itself can
    # be starved while the CPU engine generates (docs/reliability.md, finding 5); in one rehearsal
    # a whole wave's 20 refusals were written 4.3 s after their heads arrived, all at once.
    # Structurally: every refusal is `queue_full`, decided on arrival, never a wait that timed out
    # (counted below). Timed only loosely: on a 2-core AVX-512 machine the sidecar's median refusal
    # took 0.35-1.0 s, at c8e7ffc as now, starved while the CPU engine holds both cores; the
    # milliseconds a refusal costs are the relay benchmark's to measure.
    assert percentile(sidecar_rejected, 50) < QUEUE_TIMEOUT_S / 10, "a rejection must not wait"
    assert max(sidecar_rejected) < QUEUE_TIMEOUT_S / 2, "a rejection must not wait for a slot"
    # Admitted requests wait for at most the queue ahead of them: about (queue / slots + 1) batches;
    # none waits out the queue timeout (a median, for the same starvation as above).
    assert percentile(sidecar_admitted, 50) < max(5.0, 6 * max(single)), sidecar_admitted
    assert max(sidecar_admitted) < QUEUE_TIMEOUT_S, sidecar_admitted
    # The sidecar counted every request it answered, and nothing is left in flight.
    assert sidecar_metric(sidecar.url, 'palmyra_rejections_total{reason="queue_full"}') == len(rejected)
    assert sidecar_metric(sidecar.url, "palmyra_in_flight_requests") == 0
    assert sidecar_metric(sidecar.url, "palmyra_queued_requests") == 0
    assert generate_ok(sidecar.url)


@pytest.fixture(scope="module")
def adaptive_sidecar(engine_server, log_dir) -> Iterator[procs.Server]:
    # Admission's defaults except the ceiling: 8, so that a burst of 48 overloads it (the engine's
    # own ceiling here, 128 or 256, would admit the whole burst and refuse nothing).
    env = {**FAST, "PALMYRA_READ_TIMEOUT_S": "30", "PALMYRA_ADMISSION_MAX_LIMIT": "8"}
    with procs.sidecar(engine_server.url, log_dir, engine_api_key=engine_server.api_key, extra_env=env) as server:
        yield server


def test_adaptive_overload_bounds_the_queue_by_the_slo_and_refuses_the_rest_fast(adaptive_sidecar):
    sc = adaptive_sidecar
    for _ in range(3):  # the engine's latency, learnt by the gate
        assert (
            HTTP.post(
                f"{sc.url}/v1/completions", timeout=60, json=completion(max_tokens=MAX_TOKENS, ignore_eos=True)
            ).status_code
            == 200
        )
    results = []
    for _ in range(WAVES):
        results += asyncio.run(burst(sc.url, BURST))
    accepted = [took for status, took, _ in results if status == 200]
    rejected = [(took, ra) for status, took, ra in results if status == 429]
    other = [status for status, _, _ in results if status not in (200, 429)]
    wait_until(
        lambda: sum(len(access_durations_s(sc.log(), s)) for s in (200, 429)) >= len(accepted) + len(rejected),
        5,
        "every request in the access log",
    )
    sidecar_rejected = access_durations_s(sc.log(), 429)
    waits = [
        json.loads(line).get("queue_ms", 0) / 1000
        for line in sc.log().splitlines()
        if '"palmyra.access"' in line and '"status":200' in line
    ]
    reasons = {
        r: sidecar_metric(sc.url, f'palmyra_rejections_total{{reason="{r}"}}')
        for r in ("slo_unreachable", "queue_full", "queue_timeout")
    }
    figure(
        "overload (adaptive)",
        sent=len(results),
        accepted=len(accepted),
        rejected=len(rejected),
        other=other,
        limit=sidecar_metric(sc.url, "palmyra_concurrency_limit"),
        ceiling=sidecar_metric(sc.url, "palmyra_concurrency_ceiling"),
        reasons=reasons,
        max_queue_wait_s=round(max(waits, default=0.0), 3),
        admitted_p50_s=round(percentile(accepted, 50), 3),
        rejected_p99_s=round(percentile([t for t, _ in rejected], 99), 3) if rejected else None,
    )
    assert not other, f"every request must get 200 or 429, got {other}"
    assert accepted, "some of every burst is served"
    assert all(ra is not None and int(ra) >= 1 for _, ra in rejected), "every 429 carries Retry-After"
    assert sum(reasons.values()) == len(rejected), "every refusal counted under its reason"
    # What is admitted may wait at most what the 2 s TTFT SLO leaves (the default SLO).
    assert max(waits, default=0.0) <= 2.0, waits
    assert rejected, "a burst of 48 on 8 slots is refused in part"
    # Refused within the SLO: on arrival (slo_unreachable, queue_full) or at the queue deadline the
    # SLO leaves (queue_timeout, at most 2 s). Which of the two dominates depends on how fast the
    # engine drains the queue: on CI's 2-core machine 20 of 25 refusals were queue timeouts. Timed
    # with 1 s for the starvation noted in the fixed-mode test, and never near a fixed queue timeout.
    assert percentile(sidecar_rejected, 50) < 2.0 + 1.0, "a rejection must not wait past the SLO's queue bound"
    assert max(sidecar_rejected) < QUEUE_TIMEOUT_S / 2, "a rejection must not wait for a slot"
    assert sidecar_metric(sc.url, "palmyra_in_flight_requests") == 0
    assert sidecar_metric(sc.url, "palmyra_queued_requests") == 0
    assert generate_ok(sc.url)
