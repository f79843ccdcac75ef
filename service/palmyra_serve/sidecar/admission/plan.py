"""The admission plan: what the settings decide about admission, decided here and nowhere else.

Fixed or adaptive; the most requests the engine may hold at once (the ceiling), where the limit
starts and how low it may go; whether the ceiling is still the engine's to say; which relayed
routes take a slot; the queue's bounds. AdmissionPlan.of(settings) builds it; where the ceiling
comes from the engine, learned() gives the plan under the ceiling its /metrics page shows
(admission/capacity.py).

Readers: admission/control.py (build_admission() builds the admission the plan describes,
learn_ceiling() applies learned()), app.py (builds the plan once, and reads the engine's capacity
only when the plan asks for it), memory_budget.py (the most requests in the engine, and relayed,
at once) and relay/handler.py (which routes take a slot).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Literal

from palmyra_serve.settings import Settings
from palmyra_serve.sidecar.admission import capacity


@dataclass(frozen=True)
class AdmissionPlan:
    mode: Literal["adaptive", "fixed"]
    # The most requests in the engine at once. fixed: max_in_flight, the limit itself. adaptive: the
    # operator's ceiling (admission_max_limit), else max_num_seqs until learned() narrows it.
    ceiling: int
    floor: int  # the lowest the limit goes: admission_min_limit (fixed: the ceiling, it never moves)
    initial: int | None  # adaptive: the operator's start (admission_initial_limit); None: from the ceiling
    ceiling_from_engine: bool  # adaptive without an operator's ceiling: learned() narrows it
    max_num_seqs: int  # the engine's scheduler bound: --max-num-seqs, else vLLM's default for the platform
    kv_tokens_per_request: int  # KV-cache tokens one request is expected to hold (bounds the learned ceiling)
    max_queue: int  # requests waiting for a slot: a hard cap in both modes
    queue_timeout_s: float  # fixed: the longest wait in the queue (adaptive's follows the TTFT SLO)

    @classmethod
    def of(cls, settings: Settings) -> AdmissionPlan:
        fixed = settings.admission_mode == "fixed"
        seqs = max_num_seqs(settings)
        ceiling = settings.max_in_flight if fixed else (settings.admission_max_limit or seqs)
        return cls(
            mode=settings.admission_mode,
            ceiling=ceiling,
            floor=ceiling if fixed else settings.admission_min_limit,
            initial=None if fixed else settings.admission_initial_limit,
            ceiling_from_engine=not fixed and settings.admission_max_limit is None,
            max_num_seqs=seqs,
            kv_tokens_per_request=settings.admission_kv_tokens_per_request,
            max_queue=settings.max_queue,
            queue_timeout_s=settings.queue_timeout_s,
        )

    @property
    def fixed(self) -> bool:
        return self.mode == "fixed"

    @property
    def gate_all(self) -> bool:
        """Every relayed request takes a slot (fixed mode, as it always did), else generations only:
        a model list or a tokenization is cheap for the engine, and its latency would teach the
        adaptive limit nothing about generating."""
        return self.fixed

    @property
    def start(self) -> int:
        """Where the limit starts: the operator's start, else half the ceiling (one slow-start step
        below it); fixed mode's never moves from the ceiling. Too low a start queues traffic the
        engine could serve at once while slow start catches up (measured at 1x capacity from 32 on
        this CPU: TTFT p99 0.37 s against bare vLLM's 0.07 s); a start at the ceiling lets a first
        overload in at full batch before any latency is seen."""
        if self.fixed:
            return self.ceiling
        return self.initial or max(self.floor, self.ceiling // 2)

    def body_budget(self, max_body_bytes: int) -> int:
        """Request bodies held at once, over all connections: every admitted and every queued
        request's (enforced by the relay: 503 beyond; memory_budget.py counts it)."""
        return (self.ceiling + self.max_queue) * max_body_bytes

    def learned(self, cache_labels: dict[str, str]) -> AdmissionPlan:
        """The plan under the engine's own ceiling, min(max_num_seqs, KV requests), from the labels
        of its vllm:cache_config_info series; the plan itself where the ceiling is not the engine's
        to say (fixed mode, an operator's ceiling)."""
        if not self.ceiling_from_engine:
            return self
        ceiling = capacity.ceiling(self.max_num_seqs, cache_labels, self.kv_tokens_per_request)
        return dataclasses.replace(self, ceiling=ceiling)


def max_num_seqs(settings: Settings) -> int:
    """The engine's scheduler bound: --max-num-seqs when the launcher passes it, else vLLM's default
    for the platform. `auto` counts as an accelerator: the larger bound never under-admits, and the
    adaptive limit finds the engine's knee below it."""
    given = capacity.max_num_seqs_from_args(settings.engine_extra_args)
    if given is not None:
        return given
    return capacity.default_max_num_seqs(
        "cpu" if settings.platform == "cpu" else "accelerator", settings.tensor_parallel_size
    )
