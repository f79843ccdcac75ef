"""lifecycle/golden.py and the supervisor around it: a replica judges its own tokens against the
fp32 golden reference, position by position, blaming no near-tie."""

from __future__ import annotations

import asyncio
import itertools
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


# --- when the periodic check runs: idle capacity first, and a bound on its share of the time ------


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


class Horizon(Exception):
    """The fake time ran out: ends the supervisor's watch."""


class TimedEngine:
    """Answers each golden prompt with the reference's own tokens, taking `per_prompt_s` of the fake
    clock each (the replay's cost); canaries answer at once. Keeps when each replay began."""

    def __init__(self, clock: Clock, ref: golden.GoldenReference, per_prompt_s: float) -> None:
        self.clock, self.per_prompt_s = clock, per_prompt_s
        self.answers = {p.prompt_ids[0]: p.tokens for p in ref.prompts}
        self.first = ref.prompts[0].prompt_ids[0]
        self.replays: list[float] = []

    async def generate(self, route: str, payload: dict, timeout_s: float) -> GenerationResult:
        if not payload.get("return_token_ids"):
            return GenerationResult(True, 0.0)  # the canary
        if payload["prompt"][0] == self.first:
            self.replays.append(self.clock.t)
        self.clock.t += self.per_prompt_s
        tokens = self.answers[payload["prompt"][0]]
        return GenerationResult(True, self.per_prompt_s, token_ids=tokens, tokens=len(tokens))


def _watched(
    tmp_path: Path,
    per_prompt_s: float,
    max_share: float,
    busy_until: float = 0.0,
    horizon_s: float = 1000.0,
) -> tuple[Supervisor, TimedEngine, Clock]:
    """A ready supervisor whose first check ran (as warmup's does), watched until `horizon_s` of fake
    time; relayed requests are in flight (busy) until the clock reads `busy_until`."""
    clock = Clock()
    metrics = SidecarMetrics()
    state = HealthState(metrics, 30.0, clock=clock)
    state.engine_status = "ok"
    ref = _reference(tmp_path)
    engine = TimedEngine(clock, ref, per_prompt_s)
    end = clock.t + horizon_s

    async def sleep(seconds: float) -> None:
        clock.t += seconds
        if clock.t > end:
            raise Horizon
        await asyncio.sleep(0)

    settings = Settings(golden_interval_s=60.0, golden_max_share=max_share, canary_interval_s=15.0)
    sup = Supervisor(
        settings,
        state,
        engine,  # type: ignore[arg-type]
        metrics,
        sleep=sleep,
        reference=ref,
        busy=lambda: 1 if clock.t < busy_until else 0,
    )

    async def run() -> None:
        assert await sup._golden_check()
        with pytest.raises(Horizon):
            await sup._watch()

    asyncio.run(run())
    return sup, engine, clock


def _gaps(starts: list[float]) -> list[float]:
    return [b - a for a, b in itertools.pairwise(starts)]


def test_a_replay_never_takes_more_than_its_share_of_the_time(tmp_path):
    # 2 prompts x 1.5 s: a 3 s replay. At 2% the next is due 150 s after one began, not 60 s.
    sup, engine, _ = _watched(tmp_path, per_prompt_s=1.5, max_share=0.02, horizon_s=1000.0)
    gaps = _gaps(engine.replays)
    assert len(engine.replays) == 7 and all(150.0 <= g < 151.0 for g in gaps), gaps
    # Each replay's time over the period it opens: at most the share.
    assert 3.0 * len(gaps) / (engine.replays[-1] - engine.replays[0]) <= 0.02
    assert sup.state.output is not None and sup.state.output["seconds"] == 3.0
    assert sup.state.output["next_in_s"] == 147.0  # due 150 s after it began, which took 3 s

    # A fast replay, or a generous share: the interval is the spacing.
    _, engine, _ = _watched(tmp_path, per_prompt_s=1.5, max_share=0.1, horizon_s=1000.0)
    assert all(60.0 <= g < 61.0 for g in _gaps(engine.replays)), _gaps(engine.replays)


def test_a_due_replay_waits_for_idle_capacity(tmp_path):
    # Due 60 s after the first began; requests in flight until 85 s: it runs at the first idle tick.
    sup, engine, _ = _watched(tmp_path, per_prompt_s=0.5, max_share=1.0, busy_until=1085.0, horizon_s=100.0)
    assert len(engine.replays) == 2 and 1085.0 <= engine.replays[1] < 1086.0, engine.replays
    output = sup.state.output
    assert output is not None and output["in_flight"] == 0 and 25.0 <= output["waited_s"] < 26.0
    assert output["verdict"] == "agree" and sup.metrics.golden_checks.labels("agree")._value.get() == 2


def test_a_busy_replica_is_checked_after_one_more_interval(tmp_path):
    # Never idle: each due replay waits one more interval, then runs beside the traffic.
    sup, engine, _ = _watched(tmp_path, per_prompt_s=0.5, max_share=1.0, busy_until=float("inf"), horizon_s=400.0)
    assert len(engine.replays) == 4 and all(120.0 <= g < 121.0 for g in _gaps(engine.replays)), engine.replays
    output = sup.state.output
    assert output is not None and output["in_flight"] == 1 and 60.0 <= output["waited_s"] < 61.0
