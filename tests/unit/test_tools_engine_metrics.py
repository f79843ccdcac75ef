"""bench's engine-side means: _sum and _count deltas of vLLM's TTFT and inter-token histograms,
on a metrics page recorded from the real vLLM 0.32 CPU engine (tests/unit/data/vllm-metrics-window.json:
two reads with one max_tokens=1 request between them)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from palmyra_serve.tools import engine_metrics
from palmyra_serve.tools.engine_metrics import INTER_TOKEN, TTFT

RECORDED = json.loads((Path(__file__).parent / "data" / "vllm-metrics-window.json").read_text())


def test_sums_read_only_sum_and_count_of_the_recorded_page():
    before = engine_metrics.sums(RECORDED["before"])
    assert set(before) == {TTFT, INTER_TOKEN}
    assert before[TTFT] == pytest.approx((1.4201583862304688, 34.0))
    assert before[INTER_TOKEN] == pytest.approx((2.025638560000516, 177.0))


def test_the_window_mean_is_the_sum_delta_over_the_count_delta():
    w = engine_metrics.window(engine_metrics.sums(RECORDED["before"]), engine_metrics.sums(RECORDED["after"]))
    assert w[TTFT]["count"] == 1
    assert w[TTFT]["mean_s"] == pytest.approx(1.4350557327270508 - 1.4201583862304688)
    # A one-token request has no gap between tokens: no observation, no mean (never a 0/0).
    assert w[INTER_TOKEN] == {"count": 0, "mean_s": None}


def test_label_sets_are_summed_and_absent_families_give_no_mean():
    # Two engines behind one server (data parallel): each family's children add up.
    two = RECORDED["after"] + RECORDED["after"].replace('engine="0"', 'engine="1"')
    assert engine_metrics.sums(two)[TTFT] == pytest.approx((2 * 1.4350557327270508, 70.0))
    w = engine_metrics.window({}, engine_metrics.sums(RECORDED["after"]))
    assert w[TTFT] == {"count": 0, "mean_s": None}
    assert engine_metrics.sums("# nothing here\nother_metric_sum 3\n") == {}


def test_the_cross_check_row_puts_client_and_engine_side_by_side():
    w = {TTFT: {"count": 2, "mean_s": 0.010}, INTER_TOKEN: {"count": 14, "mean_s": 0.004}}
    row = engine_metrics.cross_check("seq", [0.012, 0.014], [0.005, 0.005], w)
    assert row["client"] == {"ttft_mean_s": pytest.approx(0.013), "inter_token_mean_s": 0.005, "requests": 2}
    assert row["ratio"]["ttft"] == pytest.approx(1.3) and row["ratio"]["inter_token"] == pytest.approx(1.25)
    md = "\n".join(engine_metrics.markdown({"path": "/engine/metrics", "phases": [row]}))
    assert "| seq | 13.00 | 10.00 | 1.300× | 5.00 | 4.00 | 1.250× | 2 / 14 (client requests: 2) |" in md
    assert "Not available: no vllm" in "\n".join(engine_metrics.markdown({"phases": [], "unavailable": "no vllm"}))
