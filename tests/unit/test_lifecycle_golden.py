"""lifecycle/golden.py and the supervisor around it: a replica judges its own tokens against the
fp32 golden reference, position by position, blaming no near-tie."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Literal

import pytest

from palmyra_serve.settings import Settings
from palmyra_serve.sidecar.core.generation import GenerationResult
from palmyra_serve.sidecar.core.metrics import SidecarMetrics
from palmyra_serve.sidecar.lifecycle import golden
from palmyra_serve.sidecar.lifecycle.health import HealthState
from palmyra_serve.sidecar.lifecycle.warmup import Supervisor

# Two prompts; at position 1 of "b" the reference is near a tie (margin 0.2), elsewhere sure (3.0).
DOC = {
    "format": golden.FORMAT,
    "weights": "sha256:" + "0" * 64,
    "prompts": [
        {"name": "a", "prompt_ids": [1, 2], "tokens": [10, 11, 12], "top": [[[10, -0.1], [99, -3.1]]] * 3},
        {
            "name": "b",
            "prompt_ids": [3],
            "tokens": [20, 21, 22],
            "top": [[[20, -0.1], [98, -3.1]], [[21, -0.6], [97, -0.8]], [[22, -0.1], [96, -3.1]]],
        },
    ],
}


def _reference(tmp_path: Path, doc: dict | None = None) -> golden.GoldenReference:
    path = tmp_path / "golden.json"
    path.write_text(json.dumps(doc or DOC))
    return golden.GoldenReference.load(path)


def test_a_divergence_at_a_near_tie_ends_the_comparison_without_blame(tmp_path):
    ref = _reference(tmp_path)
    b = ref.prompts[1]
    assert golden.judge(b, [20, 21, 22], 1.0) == golden.PromptVerdict(3, 3, False, None)
    assert golden.judge(b, [20, 55, 0], 1.0) == golden.PromptVerdict(1, 2, True, None)  # margin 0.2: a tie
    assert golden.judge(b, [20, 55, 0], 0.1).drift_at == 1  # a tighter tolerance blames it
    assert golden.judge(ref.prompts[0], [10, 66], 1.0).drift_at == 1  # margin 3.0: drift
    assert golden.judge(ref.prompts[0], [10], 1.0) == golden.PromptVerdict(1, 1, False, None)  # stopped early


@pytest.mark.parametrize(
    "doc",
    [{"format": "other/1", "prompts": []}, {"format": golden.FORMAT, "prompts": []}, {"format": golden.FORMAT}],
)
def test_an_unusable_file_is_refused_naming_it(tmp_path, doc):
    with pytest.raises(golden.GoldenFileError, match="PALMYRA_GOLDEN_FILE"):
        _reference(tmp_path, doc)
    with pytest.raises(golden.GoldenFileError, match="cannot read"):
        golden.GoldenReference.load(tmp_path / "missing.json")


class FakeEngine:
    """Answers each golden prompt with the tokens given for its first prompt id (fault injection)."""

    def __init__(self, answers: dict[int, list[int]] | None) -> None:
        self.answers = answers
        self.calls = 0

    async def generate(self, route: str, payload: dict, timeout_s: float) -> GenerationResult:
        self.calls += 1
        if self.answers is None:
            return GenerationResult(False, 0.0, "refused")
        assert payload["temperature"] == 0.0 and payload["return_token_ids"] is True
        return GenerationResult(True, 0.01, token_ids=self.answers[payload["prompt"][0]], tokens=3)


def _check(ref: golden.GoldenReference, answers: dict[int, list[int]] | None) -> golden.CheckResult:
    return asyncio.run(golden.check(FakeEngine(answers), "m", ref, 1.0))  # type: ignore[arg-type]


def test_the_check_reports_agreement_near_ties_and_the_prompts_that_drifted(tmp_path):
    ref = _reference(tmp_path)
    same = _check(ref, {1: [10, 11, 12], 3: [20, 21, 22]})
    assert same.verdict == "agree" and same.agreement == 1.0 and same.compared == 6
    tie = _check(ref, {1: [10, 11, 12], 3: [20, 55, 56]})
    assert tie.verdict == "agree" and tie.near_ties == 1 and tie.compared == 5
    drift = _check(ref, {1: [77, 11, 12], 3: [20, 21, 22]})
    assert drift.verdict == "drift" and drift.failed == ["a"] and drift.summary()["failed_prompts"] == ["a"]
    assert _check(ref, None).verdict == "error"


Action = Literal["unready", "report"]


def _supervisor(tmp_path: Path, engine: FakeEngine, action: Action = "unready") -> tuple[Supervisor, HealthState]:
    metrics = SidecarMetrics()
    state = HealthState(metrics, 30.0)
    state.engine_status = "ok"
    settings = Settings(golden_action=action, golden_interval_s=60.0)
    sup = Supervisor(settings, state, engine, metrics, reference=_reference(tmp_path))  # type: ignore[arg-type]
    return sup, state


def test_drift_takes_readiness_away_with_its_reason_and_report_mode_only_reports(tmp_path):
    drifting = FakeEngine({1: [77, 11, 12], 3: [20, 21, 22]})
    sup, state = _supervisor(tmp_path, drifting)
    assert asyncio.run(sup._golden_check()) is False
    assert state.output_drift and state.last_error == "output_drift: a"
    ready, body = state.readiness()
    assert not ready and body["output"]["verdict"] == "drift" and body["output"]["failed_prompts"] == ["a"]
    assert sup.metrics.golden_drift._value.get() == 1

    sup, state = _supervisor(tmp_path, FakeEngine({1: [77, 11, 12], 3: [20, 21, 22]}), action="report")
    assert asyncio.run(sup._golden_check()) is True and not state.output_drift

    healed = FakeEngine({1: [10, 11, 12], 3: [20, 21, 22]})
    sup, state = _supervisor(tmp_path, healed)
    state.output_drift = True
    assert asyncio.run(sup._golden_check()) is True and not state.output_drift


def test_a_check_that_cannot_run_says_nothing_about_the_numbers(tmp_path):
    sup, state = _supervisor(tmp_path, FakeEngine(None))
    assert asyncio.run(sup._golden_check()) is True
    assert state.output is not None and state.output["verdict"] == "error" and not state.output_drift
