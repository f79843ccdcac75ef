"""The warmup job that earns readiness, and the idle canary that keeps it honest.

vLLM's /health says 200 as soon as its HTTP server is up; that is necessary, not sufficient. So the
replica turns ready only after real generations went through the engine: short and long prompts,
completions and chat, streaming and not, and a concurrent burst (the first shapes also pay the
compile/cold-start cost, so the first client request does not). While idle, a one-token canary
runs every few seconds; repeated failures take readiness away and warmup starts over.

With a golden reference (PALMYRA_GOLDEN_FILE, lifecycle/golden.py) the replica must also compute
the right tokens: the reference's prompts are replayed after warmup, before the first ready, and
every PALMYRA_GOLDEN_INTERVAL_S while ready. Drift keeps or takes readiness away (reason
`output_drift`, the prompts named) until a replay agrees again; PALMYRA_GOLDEN_ACTION=report only
counts and logs it. A due replay waits for idle capacity (no relayed request in flight; at most one
more interval, then it runs anyway), and the next is due no sooner than the last one's seconds over
PALMYRA_GOLDEN_MAX_SHARE after it began, so the replays' share of the replica's time has a bound.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from palmyra_serve.settings import Settings
from palmyra_serve.sidecar.core.generation import GenerationResult
from palmyra_serve.sidecar.core.metrics import SidecarMetrics
from palmyra_serve.sidecar.lifecycle import golden
from palmyra_serve.sidecar.lifecycle.engine import Engine
from palmyra_serve.sidecar.lifecycle.health import HealthState

log = logging.getLogger("palmyra.warmup")

STAND_IN_MARKER = "palmyra_stand_in.json"
PROBE_TOKEN = 9707  # "Hello" in Qwen2's vocabulary; any id below the vocab size would do
WARMUP_MAX_TOKENS = 8


def weights_kind(model_root: str | None) -> str:
    """random-stand-in / real / unknown, from the directory the engine loaded (when visible here)."""
    if not model_root:
        return "unknown"
    root = Path(model_root)
    if (root / STAND_IN_MARKER).is_file():
        return "random-stand-in"
    if (root / "config.json").is_file():
        return "real"
    return "unknown"


def warmup_plan(settings: Settings, max_model_len: int) -> list[tuple[str, str, Callable[[], dict]]]:
    """(name, route, payload factory) for each warmup step, in order."""
    model = settings.served_model_name
    longest = max(16, int(max_model_len * settings.warmup_long_prompt_share) - WARMUP_MAX_TOKENS - 1)
    lengths = sorted({16, max(16, longest // 8), longest})

    def completion(n: int, stream: bool) -> Callable[[], dict]:
        # Token ids, not text: the prompt length is exact whatever the tokenizer does with text.
        return lambda: {
            "model": model,
            "prompt": [PROBE_TOKEN] * n,
            "max_tokens": WARMUP_MAX_TOKENS,
            "temperature": 0.0,
            "stream": stream,
            "ignore_eos": True,
        }

    def chat(stream: bool) -> Callable[[], dict]:
        return lambda: {
            "model": model,
            "messages": [{"role": "user", "content": "Say hello."}],
            "max_tokens": WARMUP_MAX_TOKENS,
            "temperature": 0.0,
            "stream": stream,
        }

    plan = []
    for i, n in enumerate(lengths):
        plan.append((f"completion {n} tokens", "/v1/completions", completion(n, stream=i % 2 == 1)))
    plan.append((f"completion {longest} tokens streamed", "/v1/completions", completion(longest, stream=True)))
    plan.append(("chat", "/v1/chat/completions", chat(stream=False)))
    plan.append(("chat streamed", "/v1/chat/completions", chat(stream=True)))
    return plan


class Supervisor:
    """Owns the readiness phase: wait for the engine, warm it up, watch it, start over when it falters."""

    def __init__(
        self,
        settings: Settings,
        state: HealthState,
        engine: Engine,
        metrics: SidecarMetrics,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        reference: golden.GoldenReference | None = None,
        busy: Callable[[], int] = lambda: 0,
    ) -> None:
        self.settings = settings
        self.state = state
        self.engine = engine
        self.metrics = metrics
        self.sleep = sleep
        self.request_timeout_s = settings.warmup_request_timeout_s
        self.golden = reference  # loaded at start (app.py): an unusable file stops the start
        # Relayed requests in flight (app.py passes the admission's count; this package knows no relay):
        # a due golden replay waits for none.
        self.busy = busy
        self._golden_began: float | None = None  # the state's clock when the last replay began
        self._golden_seconds = 0.0  # and what it took

    async def run(self) -> None:
        backoff = 1.0
        # A start-up runs from the sidecar's start, or from the moment readiness was lost, to ready:
        # engine_up until the engine first serves the model, warmup (retries included) after that.
        began, engine_up_at = self.state.clock(), None
        while True:
            max_model_len = await self._wait_for_engine()
            if engine_up_at is None:
                engine_up_at = self.state.clock()
            if await self._warmup(max_model_len):
                self._record_startup(began, engine_up_at)
                backoff = 1.0
                await self._watch()
                began, engine_up_at = self.state.clock(), None
            else:
                await self.sleep(backoff)
                backoff = min(backoff * 2, self.settings.warmup_max_backoff_s)

    def _record_startup(self, began: float, engine_up_at: float) -> None:
        seconds = {"engine_up": engine_up_at - began, "warmup": self.state.clock() - engine_up_at}
        self.state.startup_seconds = {phase: round(value, 3) for phase, value in seconds.items()}
        self.metrics.record_startup(seconds)
        log.info("ready", extra={"fields": {"startup_seconds": self.state.startup_seconds}})

    async def _wait_for_engine(self) -> int:
        self.state.set_phase("waiting_for_engine")
        while True:
            if self.state.engine_status == "ok":
                try:
                    models = await self.engine.models(timeout_s=10.0)
                    entry = next((m for m in models if m.get("id") == self.settings.served_model_name), None)
                    if entry is not None:
                        self.state.weights = weights_kind(entry.get("root"))
                        self.metrics.stand_in.set(1 if self.state.weights == "random-stand-in" else 0)
                        self.state.engine_version = await self._version()
                        return int(entry.get("max_model_len") or self.settings.max_model_len)
                    self._not_yet(
                        f"engine does not serve {self.settings.served_model_name!r}",
                        f"it serves {[m.get('id') for m in models]}",
                    )
                except Exception as exc:  # any failure here just means: not yet
                    self._not_yet("engine /v1/models unreadable", f"{type(exc).__name__}: {exc}")
            await self.sleep(self.settings.health_poll_interval_s)

    async def _version(self) -> str | None:
        try:
            return await self.engine.version(timeout_s=10.0)
        except Exception as exc:  # an engine that cannot say is treated as the oldest one supported
            log.warning("engine /version unreadable", extra={"fields": {"error": f"{type(exc).__name__}: {exc}"}})
            return None

    def _not_yet(self, reason: str, detail: str) -> None:
        """/ready shows the reason (words of ours); the engine's own words go to the log, once."""
        if self.state.last_error != reason:
            log.warning("engine not usable yet", extra={"fields": {"reason": reason, "detail": detail[:2000]}})
        self.state.last_error = reason

    async def _warmup(self, max_model_len: int) -> bool:
        plan = warmup_plan(self.settings, max_model_len)
        burst = self.settings.warmup_burst
        self.state.progress_total = len(plan) + (1 if burst > 1 else 0)
        self.state.progress_done = 0
        self.state.set_phase("warming_up")
        t0 = time.monotonic()
        for name, route, payload in plan:
            result = await self.engine.generate(route, payload(), self.request_timeout_s)
            if not self._step_ok(name, result):
                return False
        if burst > 1:
            _, route, payload = plan[0]
            results = await asyncio.gather(
                *(self.engine.generate(route, payload(), self.request_timeout_s) for _ in range(burst))
            )
            failed = next((r for r in results if not r.ok), None)
            if not self._step_ok(f"burst of {burst}", failed or results[0]):
                return False
        if self.golden is not None and not await self._golden_until_agreed():
            return False
        took = time.monotonic() - t0
        self.state.warmup_seconds = round(took, 3)
        self.metrics.warmup_duration.set(took)
        self.metrics.warmup_runs.labels("success").inc()
        self.state.last_error = None
        self.state.set_phase("ready")
        log.info(
            "warmup done",
            extra={
                "fields": {"seconds": round(took, 2), "steps": self.state.progress_total, "weights": self.state.weights}
            },
        )
        return True

    def _step_ok(self, name: str, result: GenerationResult) -> bool:
        self.state.record_generation(result.ok)
        if result.ok:
            self.state.progress_done += 1
            return True
        self.metrics.warmup_runs.labels("failure").inc()
        self.state.set_phase("warming_up", error=f"warmup step '{name}' failed")  # details: the log
        log.warning("warmup step failed", extra={"fields": {"step": name, "error": result.error}})
        return False

    async def _golden_check(self, waited_s: float = 0.0, in_flight: int = 0) -> bool:
        """One replay of the golden prompts; False when it found drift that takes readiness away.
        `waited_s`: how late past due it ran (the watch's tick, or the wait for idle capacity);
        `in_flight`: relayed requests running beside it (0 unless that wait ran out)."""
        assert self.golden is not None
        began = self.state.clock()
        result = await golden.check(
            self.engine,
            self.settings.served_model_name,
            self.golden,
            self.settings.golden_tolerance,
            clock=self.state.clock,
        )
        self._golden_began, self._golden_seconds = began, result.seconds
        self.metrics.golden_checks.labels(result.verdict).inc()
        if result.agreement is not None:
            self.metrics.golden_agreement.set(result.agreement)
        self.state.output = result.summary() | {
            "waited_s": round(waited_s, 3),
            "in_flight": in_flight,
            "next_in_s": round(self._golden_due() - self.state.clock(), 3),
        }
        if result.verdict == "error":
            # Says nothing about the numbers: readiness is the other checks' to judge.
            log.warning("golden check could not run", extra={"fields": {"error": result.error}})
            return True
        drifted = result.verdict == "drift"
        self.metrics.golden_drift.set(1 if drifted else 0)
        if not drifted:
            self.state.output_drift = False
            return True
        log.error("output drift", extra={"fields": self.state.output})
        if self.settings.golden_action != "unready":
            return True
        self.state.output_drift = True
        self.state.set_phase("not_ready", error=f"output_drift: {', '.join(result.failed[:5])}")
        return False

    async def _golden_until_agreed(self) -> bool:
        """Before the first ready: replay until the reference agrees (drift rechecked with backoff, up
        to the golden interval); False when the engine went away meanwhile."""
        backoff = 1.0
        while not await self._golden_check():
            await self.sleep(backoff)
            backoff = min(backoff * 2, self.settings.golden_interval_s)
            if self.state.engine_status != "ok":
                return False
        return True

    def _golden_due(self) -> float:
        """When the next replay is due (the state's clock): PALMYRA_GOLDEN_INTERVAL_S after the last
        one began, and no sooner than its seconds / PALMYRA_GOLDEN_MAX_SHARE after, so the replays
        never take more than that share of the replica's time, however slow the engine is."""
        spacing = max(self.settings.golden_interval_s, self._golden_seconds / self.settings.golden_max_share)
        began = self._golden_began if self._golden_began is not None else self.state.clock()
        return began + spacing

    async def _watch(self) -> None:
        """Return when readiness must be earned again: engine down, the canary failing repeatedly,
        or the golden check finding drift. A due golden replay waits for no relayed request in
        flight, but no longer than one more interval: a busy replica is checked too."""
        failures = 0
        tick = min(1.0, self.settings.canary_interval_s)
        due = self._golden_due() if self.golden is not None else math.inf
        while True:
            await self.sleep(tick)
            if self.state.engine_status != "ok":
                self.state.set_phase("waiting_for_engine", error=f"engine /health: {self.state.engine_status}")
                return
            late = self.state.clock() - due
            if late >= 0:
                in_flight = self.busy()
                if in_flight == 0 or late >= self.settings.golden_interval_s:
                    if in_flight:
                        log.info(
                            "golden check runs beside traffic: no idle moment for an interval",
                            extra={"fields": {"in_flight": in_flight, "waited_s": round(late, 1)}},
                        )
                    if not await self._golden_check(late, in_flight):
                        return
                    due = self._golden_due()
            last = self.state.last_generation_ok
            if last is not None and self.state.clock() - last < self.settings.canary_interval_s:
                failures = 0  # real traffic succeeded recently: no canary needed
                continue
            result = await self.engine.generate(
                "/v1/completions",
                {
                    "model": self.settings.served_model_name,
                    "prompt": [PROBE_TOKEN],
                    "max_tokens": 1,
                    "temperature": 0.0,
                },
                self.settings.canary_timeout_s,
            )
            self.state.record_generation(result.ok)
            if result.ok:
                failures = 0
                self.metrics.canary_latency.observe(result.seconds)
                continue
            failures += 1
            self.metrics.canary_failures.inc()
            log.warning("canary failed", extra={"fields": {"consecutive": failures, "error": result.error}})
            if failures >= self.settings.canary_failures_to_unready:
                self.state.set_phase("not_ready", error=f"canary failed {failures} times")  # details: the log
                return
