"""A control-plane generation's outcome (upstream/control.py makes it; warmup, the canary and the
golden check judge it)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class GenerationResult:
    ok: bool
    seconds: float
    error: str | None = None
    tokens: int = 0
    token_ids: list[int] | None = None  # the first choice's, when the payload asked (return_token_ids)
