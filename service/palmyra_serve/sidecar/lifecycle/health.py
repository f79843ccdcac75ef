"""Liveness and readiness: the state both are judged from, and the engine health poller.

Liveness is the sidecar's judgement of the engine (the engine container's probe): it fails when
the engine is dead (its /health refuses or errors after having answered once) or hung (its
/health, or every generation, has been failing for longer than the liveness budget). Readiness is
earned by the warmup job (lifecycle/warmup.py) and lost when the engine stops answering, the canary keeps
failing, or the sidecar drains. The relay reports what it sees at once (a refused connection, a
stream cut by the engine): readiness drops on that report, and the next health poll that began
after it confirms or clears it. Liveness waits for the poll: one cut stream is not a dead engine.

The body of /ready holds words of the sidecar's own (phase, a short reason); the engine's error
texts go to the log only.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from palmyra_serve.sidecar.core.drain import DrainState
from palmyra_serve.sidecar.core.metrics import SidecarMetrics
from palmyra_serve.sidecar.lifecycle.engine import Engine

# The sidecar's own code failing requests (an unexpected exception in the relay, never an engine
# error or a client's doing): this many in a row, with no request completed between them, and the
# replica is not ready until SIDECAR_FAULT_HOLD_S have passed since the last one. A client cannot
# provoke these on purpose (they are bugs), so this is no readiness switch for an attacker.
SIDECAR_FAULTS_NOT_READY = 3
SIDECAR_FAULT_HOLD_S = 30.0
SIDECAR_FAULT = "sidecar_fault"


class HealthState:
    def __init__(
        self,
        metrics: SidecarMetrics,
        liveness_budget_s: float,
        clock: Callable[[], float] = time.monotonic,
        drain: DrainState | None = None,
    ) -> None:
        self.metrics = metrics
        self.drain_state = drain if drain is not None else DrainState()
        self.budget = liveness_budget_s
        self.clock = clock
        self.phase = "waiting_for_engine"
        self.progress_done = 0
        self.progress_total = 0
        self.last_error: str | None = None
        self.weights = "unknown"
        # The engine's vLLM version, read when it first serves the model (None until then, or when it
        # does not say): what a route's body can carry depends on it (relay/handler.py).
        self.engine_version: str | None = None
        self.engine_status = "unknown"  # ok / refused / timeout / http_<code>
        self.last_engine_ok: float | None = None
        self.generation_failing_since: float | None = None
        self.last_generation_ok: float | None = None
        self.warmup_seconds: float | None = None
        self.startup_seconds: dict[str, float] | None = None  # the last start-up's phases (lifecycle/warmup.py)
        self.relay_failure: str | None = None  # what the relay last saw fail, until a later poll
        self.relay_failure_at = 0.0
        self.sidecar_faults_in_row = 0  # reset by every request the relay completes
        # The golden check's last summary (lifecycle/golden.py; None without PALMYRA_GOLDEN_FILE), and
        # whether its drift takes readiness away (PALMYRA_GOLDEN_ACTION=unready).
        self.output: dict | None = None
        self.output_drift = False
        self.sidecar_fault_at = 0.0
        metrics.bind_phase(lambda: self.readiness()[1]["phase"])
        # Judged at scrape time: a hang becomes visible as time passes, with no event to publish it.
        metrics.ready.set_function(lambda: 1.0 if self.readiness()[0] else 0.0)
        metrics.engine_live.set_function(lambda: 1.0 if self.liveness()[0] else 0.0)

    # --- inputs -----------------------------------------------------------------------
    def record_health(self, ok: bool, status: str, asked_at: float | None = None) -> None:
        """A health poll's answer; `asked_at` (this state's clock) is when the poll was sent."""
        now = self.clock()
        self.engine_status = status
        if ok:
            self.last_engine_ok = now
        if self.relay_failure is not None and (asked_at is None or asked_at >= self.relay_failure_at):
            self.relay_failure = None  # a poll sent after the report has judged the engine since

    def report_engine_failure(self, code: str) -> None:
        """The relay saw the engine fail (an error code of errors.py): not ready until a health
        poll sent after this moment says otherwise."""
        self.relay_failure = code
        self.relay_failure_at = self.clock()

    def report_sidecar_fault(self) -> None:
        self.sidecar_faults_in_row += 1
        self.sidecar_fault_at = self.clock()

    def sidecar_failing(self) -> bool:
        return (
            self.sidecar_faults_in_row >= SIDECAR_FAULTS_NOT_READY
            and self.clock() - self.sidecar_fault_at < SIDECAR_FAULT_HOLD_S
        )

    def record_generation(self, ok: bool) -> None:
        now = self.clock()
        if ok:
            self.last_generation_ok = now
            self.generation_failing_since = None
        elif self.generation_failing_since is None:
            self.generation_failing_since = now

    def set_phase(self, phase: str, error: str | None = None) -> None:
        self.phase = "draining" if self.draining else phase
        if error is not None:
            self.last_error = error

    @property
    def draining(self) -> bool:
        """Announced (core/drain.py): not ready from now on, whatever else holds."""
        return self.drain_state.announced

    def begin_drain(self) -> None:
        self.drain_state.announce()
        self.set_phase("draining")

    # --- judgements -------------------------------------------------------------------
    def liveness(self) -> tuple[bool, dict]:
        now = self.clock()
        if self.last_engine_ok is None:
            status, detail = "starting", f"engine has not answered /health yet ({self.engine_status})"
        elif self.engine_status != "ok" and self.engine_status != "timeout":
            status, detail = "engine_dead", f"engine /health: {self.engine_status}"
        elif now - self.last_engine_ok > self.budget:
            status, detail = "engine_hung", f"engine /health silent for {now - self.last_engine_ok:.0f} s"
        elif self.generation_failing_since is not None and now - self.generation_failing_since > self.budget:
            status = "engine_hung"
            detail = f"generations failing for {now - self.generation_failing_since:.0f} s"
        else:
            status, detail = "ok", None
        return status == "ok", {"status": status, "detail": detail, "engine_health": self.engine_status}

    def readiness(self) -> tuple[bool, dict]:
        sidecar_failing = self.sidecar_failing()
        ready = (
            self.phase == "ready"
            and not self.draining
            and self.engine_status == "ok"
            and self.relay_failure is None
            and not sidecar_failing
            and not self.output_drift
        )
        # The phase a reader sees agrees with the verdict: warmed up, but not ready now (the engine
        # stopped answering, a stream was cut) reads "not_ready", never "ready" beside false.
        phase = "not_ready" if self.phase == "ready" and not ready else self.phase
        body = {
            "ready": ready,
            "phase": phase,
            "progress": {"done": self.progress_done, "total": self.progress_total},
            "last_error": self.last_error,
            "weights": self.weights,
            "engine_health": self.engine_status,
            "relay_failure": SIDECAR_FAULT if sidecar_failing else self.relay_failure,
            "warmup_seconds": self.warmup_seconds,
            "startup_seconds": self.startup_seconds,
        }
        if self.output is not None:
            body["output"] = self.output
        return ready, body


async def poll_engine_health(state: HealthState, engine: Engine, interval_s: float) -> None:
    """Forever: ask the engine's /health, record the answer. A hang shows as a timeout."""
    timeout = max(1.0, min(5.0, interval_s * 2))
    while True:
        asked_at = state.clock()
        ok, status = await engine.health(timeout)
        state.record_health(ok, status, asked_at)
        await asyncio.sleep(interval_s)
