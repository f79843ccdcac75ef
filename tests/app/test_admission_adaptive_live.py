"""Adaptive admission (the default mode) end to end: the real sidecar over real sockets in front of a
FAKE engine whose latency the test turns up and down (fake_engine's first_delay_s / token_delay_s).

What is checked is the mechanism, not a number: the limit rises while latency is low and demand
exceeds it, falls when latency passes the SLO's target; a queued request never waits longer than
the TTFT SLO allows; the rest are refused at once with a 429, a reason and a Retry-After. How much
goodput that buys on the real engine is benchmarks/goodput.py's question (docs/admission.md).
"""

from __future__ import annotations

import concurrent.futures
import re
import time

import httpx

from tests.helpers.access_log import access_durations_s
from tests.helpers.api import assert_openai_error, completion
from tests.helpers.api import metric_value as sample
from tests.helpers.load import ClosedLoop
from tests.helpers.waiting import wait_until


def set_latency(client: httpx.Client, engine_url: str, first_s: float, token_s: float) -> None:
    client.post(f"{engine_url}/fake/control", json={"first_delay_s": first_s, "token_delay_s": token_s})


def test_limit_rises_while_latency_is_low_and_falls_when_it_passes_the_slo(engine, sidecar_factory, client):
    env = {
        "PALMYRA_ADMISSION_MAX_LIMIT": "16",
        "PALMYRA_ADMISSION_INITIAL_LIMIT": "2",
        "PALMYRA_ADMISSION_WINDOW_S": "0.2",
    }
    with sidecar_factory(engine.url, **env) as sc:  # ready first: warmup must not meet the slow engine
        set_latency(client, engine.url, 0.0, 0.01)  # fast: 10 tokens in 0.1 s
        limit = lambda: sample(client, sc.url, "palmyra_concurrency_limit")  # noqa: E731
        assert limit() == 2 and sample(client, sc.url, "palmyra_concurrency_ceiling") == 16
        with ClosedLoop(sc.url, 12, completion("load", max_tokens=10, stream=True), pause_after_429_s=0.05) as load:
            wait_until(lambda: limit() >= 8, 30, "the limit grows while latency is low and demand exceeds it")
            grown = limit()
            # The engine slows down: first tokens after 1.5 s, past the engine's TTFT target
            # (slo_ttft_s x admission_ttft_engine_share = 1 s).
            set_latency(client, engine.url, 1.5, 0.01)
            wait_until(lambda: limit() < grown, 30, "the limit falls when latency passes the target")
            lowered = limit()
            assert lowered >= 2, "never below the floor"
        assert 200 in load.statuses
    print(f"limit: start 2, grew to {grown:g} (ceiling 16), fell to {lowered:g} under a 1.5 s TTFT")


def test_queue_wait_is_bounded_by_the_slo_and_the_rest_is_refused_at_once(engine, sidecar_factory, client):
    env = {
        "PALMYRA_ADMISSION_MAX_LIMIT": "2",
        "PALMYRA_ADMISSION_INITIAL_LIMIT": "2",
        "PALMYRA_ADMISSION_MIN_LIMIT": "2",
    }
    with sidecar_factory(engine.url, **env) as sc:
        # An engine that takes ~1 s per request and admits two at a time: 2 req/s.
        set_latency(client, engine.url, 0.3, 0.15)
        for _ in range(3):  # teach the gate the engine's service time and TTFT
            assert (
                client.post(f"{sc.url}/v1/completions", json=completion(max_tokens=5, stream=True)).status_code == 200
            )
        max_wait = sample(client, sc.url, "palmyra_queue_max_wait_seconds")
        assert 0 < max_wait < 2.0, "what the 2 s TTFT SLO leaves after the engine's TTFT and the headroom"

        def one() -> tuple[int, float, httpx.Headers, str]:
            t0 = time.monotonic()
            with httpx.Client(timeout=30) as c:
                r = c.post(f"{sc.url}/v1/completions", json=completion(max_tokens=5, stream=True))
            return r.status_code, time.monotonic() - t0, r.headers, r.text

        with concurrent.futures.ThreadPoolExecutor(24) as pool:
            results = list(pool.map(lambda _: one(), range(24)))
        ok = [r for r in results if r[0] == 200]
        refused = [r for r in results if r[0] == 429]
        assert len(ok) + len(refused) == len(results), [r[0] for r in results]
        assert 2 <= len(ok) < len(results) and refused, "some served, the excess refused"
        for status, _took, headers, text in refused:
            err = assert_openai_error(httpx.Response(status, headers=headers, text=text), 429)
            assert err["code"] in ("slo_unreachable", "queue_timeout"), err
            assert int(headers["retry-after"]) >= 1
        # Refused on arrival, not after a wait: timed inside the sidecar, as its access log has it
        # (the client's own clock adds whatever a busy machine delays its threads and sockets).
        on_arrival = sum("slo_unreachable" in text for status, took, headers, text in refused)
        assert on_arrival, "some refused on arrival"

        def logged() -> list[float] | None:
            found = access_durations_s(sc.log(), 429, "slo_unreachable")
            return found if len(found) >= on_arrival else None

        fast = wait_until(logged, 5, "every refusal on arrival in the access log")
        assert max(fast) < 1.0, f"refused on arrival, not after a wait: {fast}"
        # No admitted request waited longer than the bound (the histogram counts every admission).
        page = client.get(f"{sc.url}/metrics").text
        count_line = re.search(r"^palmyra_queue_wait_seconds_count (\S+)", page, re.M)
        within_line = re.search(r'^palmyra_queue_wait_seconds_bucket\{le="2\.0"\} (\S+)', page, re.M)
        assert count_line and within_line, "the queue-wait histogram is on the page"
        count, within = float(count_line.group(1)), float(within_line.group(1))
        assert count == within == len(ok) + 3
        rejected = sum(
            float(v)
            for v in re.findall(
                r'^palmyra_rejections_total\{reason="(?:slo_unreachable|queue_timeout|queue_full)"\} (\S+)', page, re.M
            )
        )
        assert rejected == len(refused)
    print(
        f"24 at once against 2 slots: {len(ok)} served, {len(refused)} refused, slowest refusal "
        f"{max(r[1] for r in refused):.2f} s, max wait {max_wait:.2f} s"
    )


def test_non_generation_routes_bypass_the_adaptive_gate(engine, sidecar_factory, client):
    env = {"PALMYRA_ADMISSION_MAX_LIMIT": "1", "PALMYRA_ADMISSION_MIN_LIMIT": "1", "PALMYRA_MAX_QUEUE": "1"}
    with sidecar_factory(engine.url, **env) as sc:
        set_latency(client, engine.url, 0.0, 0.3)
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            busy = pool.submit(client.post, f"{sc.url}/v1/completions", json=completion(max_tokens=10, stream=True))
            wait_until(lambda: sample(client, sc.url, "palmyra_in_flight_requests") == 1, 5, "the only slot taken")
            assert client.get(f"{sc.url}/v1/models").status_code == 200, "a model list needs no slot"
            assert busy.result().status_code == 200
