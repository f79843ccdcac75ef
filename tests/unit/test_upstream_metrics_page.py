"""upstream/metrics_page.py: the engine-metrics copy /engine/metrics serves. Concurrent requests
share one fetch and the copy lasts its interval; a caller going away does not cancel the fetch for
the others; a failure is kept like a page and answered as a 503; no third copy outlives a slow
reader for long; and the copy is fresh enough for the endpoint picker's scrapes."""

from __future__ import annotations

import asyncio
from pathlib import Path

import aiohttp
import yaml

from palmyra_serve.sidecar.core.disconnect import DisconnectHook
from palmyra_serve.sidecar.upstream import metrics_page
from palmyra_serve.sidecar.upstream.failures import PageTooLarge
from palmyra_serve.sidecar.upstream.metrics_page import EngineMetricsCache, Fetched

REPO = Path(__file__).resolve().parents[2]


class Engine:
    """A fetch that counts its calls and answers when released."""

    def __init__(self) -> None:
        self.calls = 0
        self.gate = asyncio.Event()
        self.gate.set()
        self.fail: BaseException | None = None

    async def fetch(self) -> Fetched:
        self.calls += 1
        await self.gate.wait()
        if self.fail is not None:
            raise self.fail
        return Fetched(200, "text/plain; version=0.0.4", None, b"page %d\n" % self.calls)


def run(coro):
    return asyncio.run(coro)


def test_concurrent_requests_share_one_fetch_and_the_copy_lasts_its_interval():
    async def scenario() -> None:
        now = [100.0]
        engine = Engine()
        cache = EngineMetricsCache(engine.fetch, 1, clock=lambda: now[0])
        engine.gate.clear()
        waiting = [asyncio.ensure_future(cache.page()) for _ in range(50)]
        await asyncio.sleep(0)
        engine.gate.set()
        pages = await asyncio.gather(*waiting)
        assert engine.calls == 1 and {p.body for p in pages} == {b"page 1\n"}
        now[0] += metrics_page.MAX_AGE_S / 2
        assert (await cache.page()).body == b"page 1\n" and engine.calls == 1
        now[0] = 100.0 + metrics_page.MAX_AGE_S  # its age counts from when its fetch started
        assert (await cache.page()).body == b"page 2\n" and engine.calls == 2

    run(scenario())


def test_a_caller_that_goes_away_does_not_cancel_the_fetch_for_the_others():
    async def scenario() -> None:
        engine = Engine()
        engine.gate.clear()
        cache = EngineMetricsCache(engine.fetch, 1)
        first, second = asyncio.ensure_future(cache.page()), asyncio.ensure_future(cache.page())
        await asyncio.sleep(0)
        first.cancel()
        engine.gate.set()
        assert (await second).status == 200 and engine.calls == 1

    run(scenario())


def test_a_failure_is_kept_like_a_page_and_is_a_503_in_openai_shape():
    async def scenario() -> None:
        now = [0.0]
        engine = Engine()
        cache = EngineMetricsCache(engine.fetch, 3, clock=lambda: now[0])
        for exc, code in (
            (aiohttp.ClientConnectionError("refused"), "engine_unavailable"),
            (TimeoutError(), "engine_timeout"),
            (PageTooLarge("big"), "bad_upstream"),
        ):
            engine.fail = exc
            now[0] += 1
            page = await cache.page()
            assert page.status == 503 and (b"retry-after", b"3") in page.headers
            assert code.encode() in page.body
            calls = engine.calls
            assert (await cache.page()) is page and engine.calls == calls, "one attempt per interval"

    run(scenario())


def test_no_third_copy_outlives_a_slow_reader_for_long():
    """A response still writing the copy before the current one holds back the next fetch for
    READ_GRACE_S at most; after that the next fetch cuts it."""

    async def scenario() -> None:
        now = [0.0]
        engine = Engine()
        cache = EngineMetricsCache(engine.fetch, 1, clock=lambda: now[0])
        cut: list[str] = []
        first = await cache.page()
        slow = DisconnectHook(abort=lambda: cut.append("slow"))
        first.writers.add(slow)
        now[0] += 0.3
        second = await cache.page()
        assert second is not first and engine.calls == 2
        now[0] += 0.3  # `second` is stale, but `first` is still being written: serve `second`
        assert (await cache.page()) is second and engine.calls == 2 and not cut
        now[0] += metrics_page.READ_GRACE_S  # the grace is over: fetch, and let `first` go
        third = await cache.page()
        assert third is not second and cut == ["slow"]
        first.writers.discard(slow)
        second.writers.add(DisconnectHook(abort=lambda: cut.append("not that slow")))
        now[0] += 0.3  # `second` is the copy before now; it has writers, within its grace
        assert (await cache.page()) is third and cut == ["slow"]

    run(scenario())


def test_the_copy_is_fresh_enough_for_the_endpoint_picker():
    """The picker scrapes at its interval and calls data older than 2 s stale (llm-d-router's
    default): a copy at most MAX_AGE_S old serves every scrape a page the scrape before did not
    see, and one a slow reader holds back stays under the threshold."""
    config = yaml.safe_load((REPO / "k8s/components/inference-gateway/picker-config.yaml").read_text())
    [source] = [p for p in config["plugins"] if p["type"] == "metrics-data-source"]
    interval = source["parameters"]["interval"]
    assert interval.endswith("ms")
    assert int(interval[:-2]) / 1000 >= metrics_page.MAX_AGE_S
    # Plus one fetch: milliseconds for a vLLM page (6.5 ms for 56 KB, docs/inference-gateway.md).
    assert metrics_page.MAX_AGE_S + metrics_page.READ_GRACE_S <= 1.5


def test_the_sidecars_queue_is_added_to_the_engines_waiting_gauge_in_place():
    """The endpoint picker scores on vllm:num_requests_waiting: requests waiting in the sidecar's
    admission queue count there too (the first series; no other line changes)."""
    from palmyra_serve.sidecar.upstream.metrics_page import add_sidecar_queue

    page = bytearray(
        b"# HELP vllm:num_requests_waiting Number of requests waiting to be processed.\n"
        b"# TYPE vllm:num_requests_waiting gauge\n"
        b'vllm:num_requests_waiting{engine="0",model_name="palmyra-mini"} 2.0\n'
        b'vllm:num_requests_running{engine="0",model_name="palmyra-mini"} 7.0\n'
    )
    before = bytes(page)
    add_sidecar_queue(page, 5)
    assert page == before.replace(
        b'"palmyra-mini"} 2.0\nvllm:num_requests_running', b'"palmyra-mini"} 7.0\nvllm:num_requests_running'
    )
    unlabelled = bytearray(b"vllm:num_requests_waiting 0\n")
    add_sidecar_queue(unlabelled, 3)
    assert unlabelled == bytearray(b"vllm:num_requests_waiting 3.0\n")
    other = bytearray(b"vllm:num_requests_running 1\n")
    add_sidecar_queue(other, 3)
    assert other == bytearray(b"vllm:num_requests_running 1\n")
