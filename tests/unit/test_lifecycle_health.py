"""lifecycle/health.py: the liveness and readiness judgements. Liveness goes starting, dead, hung
(a slow /health or failing generations past the budget); a relay failure holds readiness false
until a poll sent after it; the phase agrees with the verdict on /ready and on the metric; and the
sidecar's own faults turn readiness false until a request completes or their hold passes."""

from __future__ import annotations

from palmyra_serve.sidecar.core.metrics import SidecarMetrics
from palmyra_serve.sidecar.lifecycle.health import HealthState


class Clock:
    def __init__(self):
        self.t = 100.0

    def __call__(self):
        return self.t


def test_liveness_starting_dead_hung_and_readiness():
    clock = Clock()
    h = HealthState(SidecarMetrics(), liveness_budget_s=30, clock=clock)
    assert h.liveness()[1]["status"] == "starting" and not h.liveness()[0]
    h.record_health(True, "ok")
    h.set_phase("ready")
    assert h.liveness()[0] and h.readiness()[0]
    h.record_health(False, "refused")
    assert h.liveness()[1]["status"] == "engine_dead" and not h.readiness()[0]
    h.record_health(True, "ok")
    h.record_health(False, "timeout")  # a slow /health is tolerated until the budget is spent
    clock.t += 29
    assert h.liveness()[0]
    clock.t += 2
    assert h.liveness()[1]["status"] == "engine_hung"
    h.record_health(True, "ok")
    h.record_generation(False)
    clock.t += 31
    h.record_health(True, "ok")
    assert h.liveness()[1]["status"] == "engine_hung"  # /health fine, generations failing past budget
    h.record_generation(True)
    assert h.liveness()[0]
    h.begin_drain()
    assert not h.readiness()[0] and h.readiness()[1]["phase"] == "draining" and h.liveness()[0]


def test_a_relay_failure_drops_readiness_until_a_poll_sent_after_it():
    clock = Clock()
    h = HealthState(SidecarMetrics(), liveness_budget_s=30, clock=clock)
    h.record_health(True, "ok")
    h.set_phase("ready")
    asked_before = clock.t
    clock.t += 0.1
    h.report_engine_failure("stream_interrupted")
    ready, body = h.readiness()
    assert not ready and body["relay_failure"] == "stream_interrupted"
    assert h.liveness()[0]  # one cut stream is not a dead engine: liveness waits for the poll
    h.record_health(True, "ok", asked_at=asked_before)  # a poll already under way says nothing of it
    assert not h.readiness()[0]
    clock.t += 0.1
    h.record_health(True, "ok", asked_at=clock.t)
    assert h.readiness()[0] and h.readiness()[1]["relay_failure"] is None


def test_ready_phase_agrees_with_the_verdict_on_the_page_and_the_metric():
    from prometheus_client import generate_latest

    clock = Clock()
    metrics = SidecarMetrics()
    h = HealthState(metrics, liveness_budget_s=30, clock=clock)
    h.record_health(True, "ok")
    h.set_phase("ready")
    assert h.readiness()[1]["phase"] == "ready"
    h.report_engine_failure("stream_interrupted")  # warmed up, but the engine just failed a stream
    ready, body = h.readiness()
    assert not ready and body["phase"] == "not_ready", "never 'ready' beside ready: false"
    page = generate_latest(metrics.registry).decode()
    assert 'palmyra_warmup_phase{phase="not_ready"} 1.0' in page
    assert 'palmyra_warmup_phase{phase="ready"} 0.0' in page


def test_the_sidecars_own_faults_turn_readiness_false_and_a_completed_request_clears_them():
    from palmyra_serve.sidecar.lifecycle.health import SIDECAR_FAULT, SIDECAR_FAULT_HOLD_S, SIDECAR_FAULTS_NOT_READY

    clock = Clock()
    h = HealthState(SidecarMetrics(), liveness_budget_s=30, clock=clock)
    h.record_health(True, "ok")
    h.set_phase("ready")
    for _ in range(SIDECAR_FAULTS_NOT_READY - 1):
        h.report_sidecar_fault()
    assert h.readiness()[0], "one fault is a request's bad luck, not a broken replica"
    h.report_sidecar_fault()
    ready, body = h.readiness()
    assert not ready and body["relay_failure"] == SIDECAR_FAULT and body["phase"] == "not_ready"
    clock.t += SIDECAR_FAULT_HOLD_S + 1
    assert h.readiness()[0], "ready again after the hold: the next requests say whether it is still broken"
    h.report_sidecar_fault()
    assert not h.readiness()[0]
    h.sidecar_faults_in_row = 0  # what the relay does when a request completes
    assert h.readiness()[0]
