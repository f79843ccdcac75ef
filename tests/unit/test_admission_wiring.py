"""How settings become admission (docs/admission.md, "Wiring"): the mode, the ceiling read from the
engine, where the limit starts, the refusal's HTTP shape, and the relay's per-token count."""

from __future__ import annotations

import json

import pytest

from palmyra_serve.settings import Settings
from palmyra_serve.sidecar import errors
from palmyra_serve.sidecar.admission.control import AdaptiveAdmission, Admission, build_admission, learn_ceiling
from palmyra_serve.sidecar.observability.metrics import REJECTION_REASONS
from palmyra_serve.sidecar.relay.sse import SseAccount

# vLLM CPU 0.32's series, trimmed: 16384 blocks x 128 tokens = 2 GiB of KV cache.
CACHE_INFO = 'vllm:cache_config_info{block_size="128",engine="0",num_gpu_blocks="16384"} 1.0\n'


def test_adaptive_is_the_default_and_fixed_keeps_the_manual_settings() -> None:
    adaptive = build_admission(Settings(auth_disabled=True))
    assert isinstance(adaptive, AdaptiveAdmission)
    fixed = build_admission(Settings(admission_mode="fixed", max_in_flight=7, max_queue=3, auth_disabled=True))
    assert isinstance(fixed, Admission)
    assert (fixed.limit, fixed.max_queue, fixed.probe_tokens) == (7, 3, 0)


def test_the_ceiling_comes_from_the_engine_and_the_limit_starts_at_half_of_it() -> None:
    settings = Settings(platform="cpu", auth_disabled=True)
    adm = build_admission(settings)
    assert (adm.ceiling, adm.limit) == (128, 64), "before the engine answers: vLLM's CPU max_num_seqs"
    # 2 GiB of KV at 2048 tokens a request holds 1024: max_num_seqs (128) stays the bound.
    assert learn_ceiling(adm, settings, CACHE_INFO) == 128
    small = Settings(platform="cpu", admission_kv_tokens_per_request=65536, auth_disabled=True)
    adm = build_admission(small)
    assert learn_ceiling(adm, small, CACHE_INFO) == 32, "the KV cache bounds it: 2 097 152 / 65 536"
    assert adm.limit == 16, "a limit that never moved restarts at half the real ceiling"
    args = Settings(platform="ascend", engine_extra_args="--max-num-seqs 48", auth_disabled=True)
    assert build_admission(args).ceiling == 48
    override = Settings(admission_max_limit=20, admission_initial_limit=3, auth_disabled=True)
    adm = build_admission(override)
    assert (adm.ceiling, adm.limit) == (20, 3)
    assert learn_ceiling(adm, override, CACHE_INFO) is None, "the operator's ceiling wins"


def test_a_limit_that_already_moved_keeps_its_value_under_a_new_ceiling() -> None:
    settings = Settings(platform="cpu", auth_disabled=True)
    adm = build_admission(settings)
    assert isinstance(adm, AdaptiveAdmission)
    adm.gate.limiter._limit = 100.0
    adm.gate.limiter.slow_start = False
    learn_ceiling(adm, Settings(platform="cpu", admission_kv_tokens_per_request=32768, auth_disabled=True), CACHE_INFO)
    assert adm.limit == 64, "clamped to the new ceiling (2 097 152 / 32 768), not restarted"


@pytest.mark.parametrize("reason", errors.OVERLOAD_CODES)
def test_every_admission_refusal_is_a_429_with_its_reason_and_retry_after(reason: str) -> None:
    err = errors.overloaded(reason, 7)
    assert (err.status, err.code, err.retry_after) == (429, reason, 7)
    assert json.loads(err.body())["error"]["code"] == reason
    assert (b"retry-after", b"7") in err.headers("rid")
    assert reason in REJECTION_REASONS, "pre-created as a palmyra_rejections_total series"


def _event(text: str, usage: int | None = None) -> bytes:
    payload: dict = {"choices": [{"index": 0, "text": text}]}
    if usage is not None:
        payload["usage"] = {"prompt_tokens": 3, "completion_tokens": usage}
    return b"data: " + json.dumps(payload).encode() + b"\n\n"


def test_token_gap_counts_tokens_from_usage_when_events_carry_several() -> None:
    acc = SseAccount()
    # Four events 0.1 s apart, each carrying 4 tokens (vLLM coalesces under load), usage at the end.
    for i in range(4):
        acc.feed(_event("abcd"), 1.0 + 0.1 * i)
    assert acc.tokens_so_far() == 4 and acc.token_gap() == pytest.approx(0.3 / 3)
    acc.feed(b'data: {"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":16}}\n\ndata: [DONE]\n\n', 1.4)
    assert acc.tokens_so_far() == 16
    assert acc.token_gap() == pytest.approx(0.3 / 15), "per token, not per event"
    assert acc.inter_token_latency() == pytest.approx(0.1), "the per-event metric is unchanged"


def test_continuous_usage_gives_the_running_count_mid_stream() -> None:
    acc = SseAccount()
    acc.feed(_event("ab", usage=2), 1.0)
    acc.feed(_event("cdef", usage=6), 1.2)
    assert acc.tokens_so_far() == 6


def test_two_choices_count_events_not_the_summed_usage() -> None:
    acc = SseAccount()
    for i in range(3):
        acc.feed(b'data: {"choices":[{"index":0,"text":"a"},{"index":1,"text":"b"}]}\n\n', 1.0 + 0.1 * i)
    acc.feed(b'data: {"choices":[],"usage":{"completion_tokens":6}}\n\n', 1.3)
    assert acc.tokens_so_far() == 3
