"""The arithmetic that charges tenants and teaches admission, under hypothesis.

- A reservation is never below what the engine may be made to generate: min_tokens, ignore_eos,
  n and prompt lists, however spelt.
- A stream's per-token gap comes from tokens (the engine's usage report, which the relay asks for
  on every stream), never from events: a stream whose events carry many tokens each teaches
  admission a gap no longer than the engine's own pace, so no sequence of such streams moves the
  limit below what an honest stream at the same pace would leave it at.
"""

from __future__ import annotations

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from palmyra_serve.sidecar.admission.limit import AdaptiveLimit, LimitConfig
from palmyra_serve.sidecar.core.routes import Api
from palmyra_serve.sidecar.relay.sse import SseAccount
from palmyra_serve.sidecar.tenants.reservation import demand
from tests.helpers.clock import FakeClock

CAP = 8192
spellings = st.sampled_from([lambda v: v, str, float])


@given(
    max_tokens=st.one_of(st.none(), st.integers(0, CAP)),
    min_tokens=st.integers(0, CAP),
    ignore_eos=st.booleans(),
    n=st.integers(1, 8),
    prompts=st.integers(1, 4),
    spell=spellings,
)
def test_reservation_covers_the_forced_generation(max_tokens, min_tokens, ignore_eos, n, prompts, spell):
    payload = {
        "prompt": ["abcd"] * prompts,
        "min_tokens": spell(min_tokens),
        "n": spell(n),
        "ignore_eos": "true" if ignore_eos else False,
    }
    if max_tokens is not None:
        payload["max_tokens"] = spell(max_tokens)
    reserved = demand(payload, Api.COMPLETIONS, 256, CAP).completion_tokens
    # The engine generates at least min_tokens per sequence, and with ignore_eos up to max_tokens
    # (or the cap when none is set): never more than the reservation.
    forced = max(min_tokens, (max_tokens if max_tokens is not None else CAP) if ignore_eos else 0)
    assert reserved >= min(CAP, forced) * n * prompts


def _event(text: str) -> bytes:
    return b"data: " + orjson.dumps({"choices": [{"index": 0, "text": text}]}) + b"\n\n"


def _stream(tokens_per_event: list[int], gap: float) -> SseAccount:
    """A stream of events carrying several tokens each, arriving at the engine's pace `gap` per
    token, ending with the usage report the relay asks for."""
    account = SseAccount()
    now = 0.0
    for k in tokens_per_event:
        now += k * gap
        account.feed(_event("x" * k), now)
    usage = {"choices": [], "usage": {"prompt_tokens": 1, "completion_tokens": sum(tokens_per_event)}}
    account.feed(b"data: " + orjson.dumps(usage) + b"\n\ndata: [DONE]\n\n", now)
    account.finish()
    return account


@given(st.lists(st.integers(1, 4096), min_size=2, max_size=40), st.floats(1e-4, 1.0))
def test_the_gap_comes_from_tokens_not_events(tokens_per_event, gap):
    learned = _stream(tokens_per_event, gap).mean_token_gap()
    assert learned is not None
    assert learned <= gap * (1 + 1e-9)


@settings(max_examples=50, deadline=None)
@given(st.lists(st.lists(st.integers(1, 4096), min_size=2, max_size=10), min_size=1, max_size=40))
def test_packed_events_never_lower_the_limit_below_an_honest_streams(streams):
    config = LimitConfig(min_limit=1, initial_limit=64, window_s=0.0, min_samples=1)
    itl_target = config.itl_slo_s * config.itl_share
    clock = FakeClock()
    limiter = AdaptiveLimit(config, 256, clock)
    before = limiter.limit
    for tokens_per_event in streams:
        gap = _stream(tokens_per_event, itl_target / 2).mean_token_gap()  # an engine well inside its SLO
        clock.now += 1.0
        limiter.on_finish(clock(), gap, "ok")
    assert limiter.limit >= before
