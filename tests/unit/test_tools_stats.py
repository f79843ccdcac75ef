"""bench/validate statistics: percentiles match numpy's linear interpolation, scaling as the reference adaptation."""

from __future__ import annotations

import math

import pytest

from palmyra_serve.tools import stats


@pytest.mark.parametrize(("q", "want"), [(0, 1.0), (50, 2.5), (90, 3.7), (99, 3.97), (100, 4.0)])
def test_percentile_interpolates_linearly(q: float, want: float) -> None:
    assert stats.percentile([4.0, 1.0, 3.0, 2.0], q) == pytest.approx(want)


def test_percentile_of_one_value_and_of_none() -> None:
    assert stats.percentile([7.0], 99) == 7.0
    assert math.isnan(stats.percentile([], 50))
    with pytest.raises(ValueError):
        stats.percentile([1.0], 101)


def test_summarize_fields() -> None:
    s = stats.summarize([0.1, 0.2, 0.3])
    assert s["n"] == 3
    assert s["mean"] == pytest.approx(0.2)
    assert (s["min"], s["max"]) == (0.1, 0.3)
    assert s["p50"] == pytest.approx(0.2)
    assert s["p90"] == pytest.approx(0.28)
    assert math.isnan(stats.summarize([])["p50"])


def test_scaling_reproduces_the_seed_cards_numbers() -> None:
    # 14.05x from 1 to 16 streams is 87.8% efficiency (the reference adaptation's 5.4).
    out = stats.scaling({1: 100.0, 16: 1405.0})
    assert out[1] == {"speedup": 1.0, "efficiency": 1.0}
    assert out[16]["speedup"] == pytest.approx(14.05)
    assert round(out[16]["efficiency"] * 100, 1) == 87.8


def test_scaling_without_one_stream_uses_lowest_concurrency_as_ideal_base() -> None:
    out = stats.scaling({2: 200.0, 8: 600.0})
    assert out[2]["efficiency"] == pytest.approx(1.0)
    assert out[8]["speedup"] == pytest.approx(6.0)
    assert out[8]["efficiency"] == pytest.approx(0.75)
