"""validate's verdict rules: match, near-tie divergence (both sides nearly tied), suspicious."""

from __future__ import annotations

import pytest

from palmyra_serve.tools import accuracy
from palmyra_serve.tools.accuracy import EndpointOutput


class FakeRef:
    """A reference path whose logits are given per position as {token: logit}; others are 0, std 1."""

    def __init__(self, tokens: list[int], logits: dict[int, dict[int, float]] | None = None, std: float = 1.0):
        self.tokens = tokens
        self._logits = logits or {}
        self._std = std

    def logit(self, pos: int, tok: int) -> float:
        return self._logits.get(pos, {}).get(tok, 0.0)

    def std(self, pos: int) -> float:
        return self._std

    def top2(self, pos: int) -> tuple[int, float, int, float]:
        row = [*sorted(self._logits.get(pos, {}).items(), key=lambda kv: -kv[1]), (-1, 0.0), (-2, 0.0)]
        return row[0][0], row[0][1], row[1][0], row[1][1]


def _out(tokens, own=None, tops=None):
    n = len(tokens)
    return EndpointOutput(tokens=tokens, token_logprobs=own or [-1.0] * n, top_logprobs=tops or [{}] * n)


def test_identical_tokens_match() -> None:
    ref = FakeRef([1, 2, 3, 4])
    res = accuracy.compare("p", "text", 3, ref, _out([1, 2, 3, 4]))
    assert (res.verdict, res.match_rate, res.first_divergence, res.first_token_match) == ("match", 1.0, None, True)


def test_match_rate_is_position_by_position_after_divergence() -> None:
    # Diverges at 1 on a near-tie, rejoins at 3: positions 0 and 3 count.
    ref = FakeRef([1, 2, 3, 4], logits={1: {2: 1.00, 9: 0.99}})
    out = _out([1, 9, 5, 4], own=[-1.0, -2.00, -1.0, -1.0], tops=[{}, {9: -2.00, 2: -2.005}, {}, {}])
    res = accuracy.compare("p", "text", 3, ref, out, near_tie=0.1)
    assert res.match_rate == 0.5
    assert res.first_divergence == 1
    assert res.verdict == accuracy.NEAR_TIE
    d = res.divergence
    assert d is not None
    assert d.ref_flip_margin == pytest.approx(0.01)
    assert d.ref_top2_margin == pytest.approx(0.01)
    assert d.endpoint_logprob_ref == pytest.approx(-2.005)
    assert d.endpoint_gap == pytest.approx(0.005)
    assert not d.endpoint_gap_is_lower_bound


def test_clear_reference_margin_is_suspicious_even_at_first_token() -> None:
    ref = FakeRef([1, 2], logits={0: {1: 3.0, 7: 0.5}}, std=1.0)
    res = accuracy.compare("p", "text", 3, ref, _out([7, 2], tops=[{7: -1.0, 1: -1.01}, {}]))
    assert not res.first_token_match
    assert res.verdict == accuracy.SUSPICIOUS
    assert "first token" in res.reason and "reference" in res.reason


def test_threshold_scales_with_the_logit_std() -> None:
    # The same 0.05-logit flip is a tie when logits spread with std 1, not when they spread with std 0.1.
    logits = {0: {1: 0.05, 7: 0.0}}
    out = _out([7], tops=[{7: -1.0, 1: -1.04}])
    assert accuracy.compare("p", "t", 1, FakeRef([1], logits, std=1.0), out).verdict == accuracy.NEAR_TIE
    assert accuracy.compare("p", "t", 1, FakeRef([1], logits, std=0.1), out).verdict == accuracy.SUSPICIOUS


def test_endpoint_side_clear_preference_is_suspicious() -> None:
    # Reference sees a tie, but the endpoint is sure of its own token: its numbers are off.
    ref = FakeRef([1], logits={0: {1: 0.01, 7: 0.0}})
    res = accuracy.compare("p", "t", 1, ref, _out([7], own=[-0.1], tops=[{7: -0.1, 1: -3.0}]))
    assert res.verdict == accuracy.SUSPICIOUS
    assert "endpoint prefers" in res.reason


def test_reference_token_outside_endpoint_top_k_uses_a_lower_bound() -> None:
    ref = FakeRef([1], logits={0: {1: 0.01, 7: 0.0}})
    far = _out([7], own=[-1.0], tops=[{7: -1.0, 8: -4.0, 9: -5.0}])
    res = accuracy.compare("p", "t", 1, ref, far)
    assert res.divergence is not None
    assert res.divergence.endpoint_gap_is_lower_bound
    assert res.divergence.endpoint_gap == pytest.approx(4.0)
    assert res.verdict == accuracy.SUSPICIOUS
    close = _out([7], own=[-1.0], tops=[{7: -1.0, 8: -1.02}])
    assert accuracy.compare("p", "t", 1, ref, close).verdict == accuracy.NEAR_TIE


def test_short_output_is_suspicious_and_counts_missing_positions() -> None:
    res = accuracy.compare("p", "t", 1, FakeRef([1, 2, 3, 4]), _out([1, 2]))
    assert res.verdict == accuracy.SUSPICIOUS
    assert res.match_rate == 0.5
    assert res.first_divergence == 2


def test_summary_rates_and_flag() -> None:
    good = accuracy.compare("a", "t", 1, FakeRef([1, 2]), _out([1, 2]))
    tie = accuracy.compare("b", "t", 1, FakeRef([1, 2], {1: {2: 0.01}}), _out([1, 3], tops=[{}, {3: -1, 2: -1.005}]))
    s = accuracy.summary([good, tie])
    assert s["first_token_agreement"] == 1.0
    assert s["mean_match_rate"] == 0.75
    assert s["verdicts"] == {"match": 1, "near-tie divergence": 1, "suspicious": 0}
    assert s["suspicious"] is False
    bad = accuracy.compare("c", "t", 1, FakeRef([1], {0: {1: 5.0}}), _out([2]))
    assert accuracy.summary([good, bad])["suspicious"] is True


def test_logit_noise_cancels_normalisers_and_stops_at_the_divergence() -> None:
    # Endpoint logprobs = reference logits - 5 (a different normaliser) + 0.02/-0.02 of noise, std 2.
    ref = FakeRef([1, 2, 3], logits={0: {1: 1.0, 8: 0.5}, 1: {2: 1.0, 8: 0.2}, 2: {3: 1.0, 9: 0.9}}, std=2.0)
    tops = [{1: 1.0 - 5 + 0.02, 8: 0.5 - 5 - 0.02}, {2: 1.0 - 5, 8: 0.2 - 5}, {9: -1.0, 3: -9.0}]
    res = accuracy.compare("p", "t", 1, ref, _out([1, 2, 9], tops=tops))
    assert res.first_divergence == 2
    assert res.noise == pytest.approx([0.01, -0.01, 0.0, 0.0])  # (+-0.02) / std 2; position 2 left out
    s = accuracy.summary([res])["logit_noise_std"]
    assert s["n"] == 4
    assert s["max"] == pytest.approx(0.01)
    assert s["rms"] == pytest.approx(0.01 / 2**0.5)


def test_noise_at_the_threshold_scale_makes_the_run_suspicious() -> None:
    # Every shared position is off by +-0.15 std: ties are no longer explained by rounding.
    ref = FakeRef([1, 2], logits={0: {1: 1.0, 8: 0.0}, 1: {2: 1.0, 8: 0.0}})
    tops = [{1: 1.0 + 0.15, 8: -0.15}, {2: 1.0 + 0.15, 8: -0.15}]
    res = accuracy.compare("p", "t", 1, ref, _out([1, 2], tops=tops))
    assert res.verdict == accuracy.MATCH
    s = accuracy.summary([res], near_tie=0.2)
    assert s["logit_noise_std"]["too_high"] and s["suspicious"]
    assert not accuracy.summary([res], near_tie=1.0)["suspicious"]
