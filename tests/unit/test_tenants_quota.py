"""tenants/quota.py and its helpers: limits taken all or nothing, x-ratelimit-* headers as OpenAI
writes them, concurrency per replica, a reservation corrected by the real cost; a shared store that
fails (a fault injected on purpose: FailingStore) leaves each replica its share, and is tried again;
tenants/reservation.py's estimate; relay/usage_event.py removing only the usage event."""

from __future__ import annotations

import asyncio

import orjson
import pytest

from palmyra_serve.sidecar.core import errors
from palmyra_serve.sidecar.core.routes import Api
from palmyra_serve.sidecar.relay.usage_event import UsageEventFilter
from palmyra_serve.sidecar.tenants.config import TenantSpec
from palmyra_serve.sidecar.tenants.quota import LocalStore, Quotas, duration
from palmyra_serve.sidecar.tenants.reservation import demand
from tests.helpers.clock import FakeClock


def run(coro):
    return asyncio.run(coro)


def headers_of(verdict) -> dict[str, str]:
    return {k.decode(): v.decode() for k, v in verdict.headers}


def test_requests_and_tokens_are_taken_all_or_nothing_with_openai_headers():
    clock = FakeClock(1_000.0)
    quotas = Quotas(clock=clock)
    spec = TenantSpec(name="t", requests_per_minute=3, tokens_per_minute=100)

    async def scenario():
        first = await quotas.admit(spec, 60)
        assert first.reservation is not None
        h = headers_of(first)
        assert h["x-ratelimit-limit-requests"] == "3" and h["x-ratelimit-remaining-requests"] == "2"
        assert h["x-ratelimit-limit-tokens"] == "100" and h["x-ratelimit-remaining-tokens"] == "40"
        assert h["x-ratelimit-reset-tokens"] == "1m0s"
        refused = await quotas.admit(spec, 60)  # tokens refuse: the request is not counted either
        assert refused.reservation is None and refused.refusal is not None
        assert refused.refusal.code == errors.ErrorCode.RATE_LIMIT_TOKENS and refused.refusal.retry_after == 60
        assert headers_of(refused)["x-ratelimit-remaining-requests"] == "2"
        await quotas.settle(first.reservation, 10)  # it cost 10, not 60: 90 left
        clock.now += 1
        second = await quotas.admit(spec, 60)
        assert second.reservation is not None and headers_of(second)["x-ratelimit-remaining-tokens"] == "30"
        third = await quotas.admit(spec, 1)
        assert third.reservation is not None
        fourth = await quotas.admit(spec, 1)
        assert fourth.refusal is not None and fourth.refusal.code == errors.ErrorCode.RATE_LIMIT_REQUESTS
        clock.now += 60  # the minute has passed: all of it again
        fifth = await quotas.admit(spec, 100)
        assert fifth.reservation is not None and headers_of(fifth)["x-ratelimit-remaining-tokens"] == "0"

    run(scenario())


def test_a_reservation_larger_than_the_limit_passes_alone_and_spends_the_minute():
    quotas = Quotas(clock=FakeClock(0.0))
    spec = TenantSpec(name="t", tokens_per_minute=50)

    async def scenario():
        big = await quotas.admit(spec, 10**9)
        assert big.reservation is not None and big.reservation.tokens == 50
        assert (await quotas.admit(spec, 1)).refusal is not None

    run(scenario())


def test_concurrency_is_per_replica_and_released():
    quotas = Quotas()
    spec = TenantSpec(name="t", max_concurrent=2)

    async def scenario():
        a, b = await quotas.admit(spec, 0), await quotas.admit(spec, 0)
        c = await quotas.admit(spec, 0)
        assert c.refusal is not None and c.refusal.code == errors.ErrorCode.TENANT_CONCURRENCY
        assert a.reservation is not None and b.reservation is not None
        quotas.release(a.reservation)
        quotas.release(a.reservation)  # twice is once
        assert quotas.in_use("t") == 1
        assert (await quotas.admit(spec, 0)).reservation is not None

    run(scenario())


class FailingStore(LocalStore):
    """A shared store that fails on purpose while `down` (the fault under test)."""

    def __init__(self, clock: FakeClock) -> None:
        super().__init__(1, clock)
        self.down = False
        self.calls = 0

    async def take(self, tenant, limits, amounts):
        self.calls += 1
        if self.down:
            raise ConnectionError("injected: the store is down")
        return await super().take(tenant, limits, amounts)

    async def ping(self) -> None:
        if self.down:
            raise ConnectionError("injected: the store is down")


def test_a_store_that_fails_leaves_each_replica_its_share_and_is_tried_again():
    clock = FakeClock(0.0)
    remote = FailingStore(clock)
    quotas = Quotas(remote, replicas=4, clock=clock)
    spec = TenantSpec(name="t", requests_per_minute=10)
    errors_seen = []
    quotas.on_remote_error = lambda: errors_seen.append(1)

    async def scenario():
        assert headers_of(await quotas.admit(spec, 0))["x-ratelimit-limit-requests"] == "10"
        remote.down = True
        local = await quotas.admit(spec, 0)
        assert headers_of(local)["x-ratelimit-limit-requests"] == "3"  # ceil(10 / 4)
        assert not quotas.remote_up and errors_seen == [1]
        await quotas.admit(spec, 0)
        assert remote.calls == 2  # not asked again within the retry interval
        third = await quotas.admit(spec, 0)
        assert third.reservation is not None
        assert (await quotas.admit(spec, 0)).refusal is not None  # the share is spent
        remote.down = False
        clock.now += 1.5
        back = await quotas.admit(spec, 0)
        assert quotas.remote_up and headers_of(back)["x-ratelimit-limit-requests"] == "10"

    run(scenario())


def test_the_watch_sees_the_store_back_without_a_request():
    remote = FailingStore(FakeClock(0.0))
    quotas = Quotas(remote, replicas=2)

    async def scenario():
        remote.down = True
        await quotas.admit(TenantSpec(name="t", requests_per_minute=5), 0)
        assert not quotas.remote_up
        watcher = asyncio.create_task(quotas.watch(interval_s=0.01))
        await asyncio.sleep(0.05)
        assert not quotas.remote_up  # still down: asked, and still failing
        remote.down = False
        for _ in range(100):
            if quotas.remote_up:
                break
            await asyncio.sleep(0.01)
        watcher.cancel()
        assert quotas.remote_up

    run(scenario())


@pytest.mark.parametrize(("seconds", "text"), [(0, b"0s"), (59, b"59s"), (60, b"1m0s"), (3725, b"1h2m5s")])
def test_reset_durations_read_as_openais(seconds, text):
    assert duration(seconds) == text


def test_the_reservation_estimates_prompts_and_reserves_max_tokens_per_sequence():
    assert demand({"prompt": "abcdefgh", "max_tokens": 10}, Api.COMPLETIONS, 256, 8192).tokens == 2 + 10
    assert demand({"prompt": [1, 2, 3]}, Api.COMPLETIONS, 256, 8192).tokens == 3 + 256
    assert demand({"prompt": ["abcd", "abcd"], "max_tokens": 5, "n": 2}, Api.COMPLETIONS, 256, 8192).tokens == 2 + 20
    chat = {"messages": [{"role": "user", "content": "abcdefgh"}], "max_completion_tokens": 7, "max_tokens": 99}
    assert demand(chat, Api.CHAT, 256, 8192).tokens == 4 + 2 + 7
    parts = {"messages": [{"role": "user", "content": [{"type": "text", "text": "abcd"}]}], "max_tokens": "3"}
    assert demand(parts, Api.CHAT, 256, 8192).tokens == 4 + 1 + 3


def test_the_reservation_covers_what_forces_generation():
    """Attack: ten streams with min_tokens 1500 and no max_tokens each reserved ~262 tokens and
    generated 20,283 tokens in 48 s against 3000 a minute."""
    chat = {"messages": [{"role": "user", "content": "abcd"}]}
    assert demand({**chat, "min_tokens": 1500}, Api.CHAT, 256, 8192).completion_tokens == 1500
    assert demand({**chat, "min_tokens": "1500"}, Api.CHAT, 256, 8192).completion_tokens == 1500
    assert demand({**chat, "ignore_eos": "true"}, Api.CHAT, 256, 8192).completion_tokens == 8192
    assert demand({**chat, "ignore_eos": True, "max_tokens": 10}, Api.CHAT, 256, 8192).completion_tokens == 10
    assert demand({**chat, "n": 3, "min_tokens": 300}, Api.CHAT, 256, 8192).completion_tokens == 900
    # tools and documents the template renders count into the prompt
    assert demand(chat, Api.CHAT, 256, 8192, extra_prompt_bytes=400).prompt_tokens == 4 + 1 + 100


USAGE = (
    b'data: {"id":"c","object":"text_completion","choices":[],"usage":{"prompt_tokens":3,"completion_tokens":2}}\n\n'
)
TOKEN = b'data: {"id":"c","object":"text_completion","choices":[{"index":0,"text":"hi"}]}\n\n'
DONE = b"data: [DONE]\n\n"
TEXT_WITH_LOOKALIKE = b'data: {"id":"c","choices":[{"index":0,"text":"\\"choices\\":[]"}]}\n\n'


@pytest.mark.parametrize("cut", [None, 5, len(TOKEN) + 7, len(TOKEN) + len(USAGE) - 3])
@pytest.mark.parametrize("null_usage", [False, True], ids=["vllm-0.32", "vllm-0.18"])
def test_only_the_usage_report_is_removed_wherever_the_reads_split(cut, null_usage):
    """vLLM 0.18 also writes "usage":null into every event of a stream that asked for usage."""
    token = TOKEN.replace(b"}]}", b'}],"usage":null}') if null_usage else TOKEN
    stream = token + TEXT_WITH_LOOKALIKE + USAGE + DONE
    reads = [stream] if cut is None else [stream[:cut], stream[cut:]]
    strip = UsageEventFilter()
    out = b"".join(strip.feed(r) for r in reads) + strip.flush()
    assert out == TOKEN + TEXT_WITH_LOOKALIKE + DONE and strip.removed == 1
    assert orjson.loads(USAGE[6:-2])["usage"]["completion_tokens"] == 2


def test_a_request_that_is_no_generation_does_not_touch_the_tokens_window():
    quotas = Quotas(clock=FakeClock(0.0))
    spec = TenantSpec(name="t", tokens_per_minute=10, requests_per_minute=100)

    async def scenario():
        spent = await quotas.admit(spec, 10)
        assert spent.reservation is not None
        await quotas.settle(spent.reservation, 50)  # it cost more than it reserved: the minute is over
        assert (await quotas.admit(spec, 1)).refusal is not None
        listing = await quotas.admit(spec, None)  # /v1/models: requests only
        assert listing.reservation is not None
        assert "x-ratelimit-limit-tokens" not in headers_of(listing)

    run(scenario())


class HangingStore(FailingStore):
    """A shared store whose take never answers (the fault under test: a cancelled request)."""

    async def take(self, tenant, limits, amounts):
        await asyncio.sleep(3600)
        raise AssertionError("unreachable")


def test_a_request_cancelled_while_its_quota_is_asked_gives_its_concurrency_slot_back():
    quotas = Quotas(HangingStore(FakeClock(0.0)))
    spec = TenantSpec(name="t", max_concurrent=1, requests_per_minute=10)

    async def scenario():
        task = asyncio.create_task(quotas.admit(spec, 0))
        await asyncio.sleep(0.01)
        assert quotas.in_use("t") == 1
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert quotas.in_use("t") == 0

    run(scenario())


def test_what_a_request_is_charged_when_the_engine_reported_no_usage():
    from palmyra_serve.sidecar.core.record import RequestRecord
    from palmyra_serve.sidecar.tenants.reservation import Demand
    from palmyra_serve.sidecar.tenants.tenancy import spent as tokens_spent

    demand = Demand(prompt_tokens=10, completion_tokens=100)

    def charged(**fields) -> int:
        record = RequestRecord("r", "POST", "/v1/completions", "completions", sent_at=1.0, **fields)
        return tokens_spent(record, demand)

    assert tokens_spent(RequestRecord("r", "POST", "/", "completions"), demand) == 0  # never sent
    assert charged(status=200, prompt_tokens=7, completion_tokens=3) == 10  # the engine's usage
    assert charged(status=499, client_disconnected=True) == 110  # left before the end: the reservation
    assert charged(status=499, client_disconnected=True, tokens_seen=150) == 160  # more than reserved
    assert charged(status=400) == 0  # the engine refused it
    assert charged(status=502, tokens_seen=5) == 15  # the engine failed: prompt and tokens relayed
    # An API that always reports usage, whose report was past the accounting's cap: the reservation.
    assert charged(status=200, usage_missing=True, completion_tokens=0, tokens_seen=2) == 110
