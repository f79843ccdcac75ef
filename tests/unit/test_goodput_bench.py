"""benchmarks/goodput.py's arithmetic, without an engine: arrivals, the good-request rule, one
table row (goodput, refusals, censored TTFT), the report and the engine's cache labels."""

from __future__ import annotations

from types import ModuleType

import pytest


@pytest.fixture(scope="module")
def goodput() -> ModuleType:
    from benchmarks import goodput

    return goodput


def ok(g, ttft: float = 0.1, itl: float = 0.02, tokens: int = 64):
    return g.RequestResult(status=200, ttft_s=ttft, itl_s=itl, tokens=tokens, done=True, waited_s=ttft + 63 * itl)


def test_poisson_arrivals_are_seeded_sorted_and_at_the_rate(goodput) -> None:
    a = goodput.poisson_arrivals(16, 200, seed=3)
    assert a == goodput.poisson_arrivals(16, 200, seed=3)
    assert a != goodput.poisson_arrivals(16, 200, seed=4)
    assert a == sorted(a) and a[0] > 0 and a[-1] < 200
    assert len(a) == pytest.approx(16 * 200, rel=0.05)  # 3200 +- 57 (one sd); 5% is ~3 sd
    assert goodput.poisson_arrivals(0, 10, 0) == []


def test_a_request_is_good_only_complete_and_within_both_slos(goodput) -> None:
    g = goodput
    assert g.is_good(ok(g))
    assert g.is_good(ok(g, ttft=2.0, itl=0.25)), "the SLO bounds are inclusive"
    assert not g.is_good(ok(g, ttft=2.01))
    assert not g.is_good(ok(g, itl=0.26))
    assert not g.is_good(ok(g, tokens=63)), "a short stream did not complete"
    assert not g.is_good(g.RequestResult(status=429, waited_s=0.001))
    unfinished = ok(g)
    unfinished.unfinished = True
    assert not g.is_good(unfinished)
    not_done = ok(g)
    not_done.done = False
    assert not g.is_good(not_done)


def test_one_row_counts_goodput_refusals_errors_and_censored_ttft(goodput) -> None:
    g = goodput
    results = [ok(g) for _ in range(6)] + [ok(g, itl=0.4), ok(g, ttft=3.0)]
    results += [g.RequestResult(status=429, waited_s=0.002, retry_after="3") for _ in range(3)]
    results += [g.RequestResult(status=503, waited_s=0.01, error="HTTP 503: engine unavailable")]
    results += [g.RequestResult(waited_s=25.0, unfinished=True)]  # cancelled before its first token
    row = g.summarize_rate(results, seconds=2.0)
    assert row["sent"] == 13 and row["offered_per_s"] == 6.5
    assert row["good"] == 6 and row["goodput_per_s"] == 3.0
    assert (row["completed"], row["refused"], row["errors"], row["unfinished"]) == (8, 3, 1, 1)
    assert (row["completed_over_itl"], row["completed_over_ttft"], row["completed_short"]) == (1, 1, 0)
    assert row["retry_after"] == ["3"] and row["refusal_p99_s"] == pytest.approx(0.002)
    assert row["first_error"].startswith("HTTP 503")
    # TTFT: 8 measured (0.1 x7, 3.0) plus the censored 25 s wait, which makes both percentiles
    # lower bounds (the wait can only grow, and with it any percentile).
    assert row["ttft_p50_s"] == pytest.approx(0.1)
    assert row["ttft_p99_s"] > 3.0 and row["ttft_p99_lower_bound"] and row["ttft_p50_lower_bound"]
    assert not g.summarize_rate([ok(g)] * 3, 1.0)["ttft_p99_lower_bound"]
    assert row["itl_p50_s"] == pytest.approx(0.02)


def test_an_empty_rate_has_no_percentiles(goodput) -> None:
    row = goodput.summarize_rate([], seconds=5.0)
    assert row["goodput_per_s"] == 0 and row["ttft_p99_s"] is None and row["itl_p50_s"] is None


def test_the_report_has_one_line_per_rate_and_target_with_the_share_of_peak(goodput, tmp_path) -> None:
    g = goodput
    rows = {"bare vLLM": g.summarize_rate([ok(g)] * 10, 1.0), "sidecar": g.summarize_rate([ok(g)] * 5, 1.0)}
    doc = {
        "meta": {
            "label": "baseline",
            "started_at": "now",
            "cpus": 2,
            "cpu_model": "cpu",
            "sidecar_env": {},
            "seconds": 1.0,
            "prompt_words": 48,
            "max_tokens": 64,
            "ttft_slo_s": 2.0,
            "itl_slo_s": 0.25,
            "capacity_per_s": 10.0,
            "capacity_source": "given",
            "drain_s": 5.0,
        },
        "rates": [{"multiple": 1.0, "offered_per_s": 10.0, "targets": rows}],
    }
    md = g.markdown(doc)
    assert "| 10.0/s (1×) | bare vLLM | 10.0 | 100% |" in md
    assert "| 10.0/s (1×) | sidecar | 5.0 | 50% |" in md
    assert g.plot(doc, tmp_path / "p.png").stat().st_size > 1000


def test_cache_config_labels(goodput) -> None:
    text = 'vllm:cache_config_info{block_size="16",num_gpu_blocks="100",engine="0"} 1.0\n'
    assert goodput.cache_config(text) == {"block_size": "16", "num_gpu_blocks": "100", "engine": "0"}
    assert goodput.cache_config("") == {}
