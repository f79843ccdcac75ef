"""The replica checks its own tokens against the checkpoint's fp32 golden reference.

The reference (`palmyra-serve golden`, tools/golden.py) holds, per prompt, the token ids, the
greedy continuation and the top-k log-probabilities at each position. The check replays every
prompt through the engine (greedy, the recorded number of tokens, the token ids returned) and
walks each answer position by position, the way the reference adaptation explains its own
accuracy table:

- the same token: the position agrees;
- a different token where the reference's top-2 margin is at most `tolerance` (a near-tie, which
  bf16 arithmetic may tip either way): the prompt's comparison ends there, without blame (the
  paths have parted, the rest compares nothing);
- a different token where the margin is larger: drift, and the prompt fails.

A check with any failed prompt is `drift`; one that could not run (the engine refused, timed out)
is `error`, which says nothing about the numbers and leaves readiness to the other checks.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from palmyra_serve.sidecar.lifecycle.engine import Engine

log = logging.getLogger("palmyra.golden")

FORMAT = "palmyra-golden/1"
MAX_FILE_BYTES = 4 << 20  # 22 prompts x 20 tokens x top-5 is ~50 KB; far more than any real file
PROMPT_TIMEOUT_S = 60.0


class GoldenFileError(ValueError):
    """The golden file cannot be used; the message names it and why."""


@dataclass(frozen=True, slots=True)
class GoldenPrompt:
    name: str
    prompt_ids: list[int]
    tokens: list[int]
    margins: list[float]  # top-1 minus top-2 log-probability at each position


@dataclass(frozen=True, slots=True)
class GoldenReference:
    weights: str
    prompts: list[GoldenPrompt]

    @classmethod
    def load(cls, path: Path) -> GoldenReference:
        try:
            with path.open("rb") as f:
                raw = f.read(MAX_FILE_BYTES + 1)
        except OSError as exc:
            raise GoldenFileError(f"PALMYRA_GOLDEN_FILE {path}: cannot read it ({exc})") from None
        if len(raw) > MAX_FILE_BYTES:
            raise GoldenFileError(f"PALMYRA_GOLDEN_FILE {path}: over {MAX_FILE_BYTES} bytes")
        try:
            doc = json.loads(raw)
            if doc.get("format") != FORMAT:
                raise ValueError(f"format {doc.get('format')!r}, not {FORMAT!r}")
            prompts = [
                GoldenPrompt(
                    str(p["name"]),
                    [int(t) for t in p["prompt_ids"]],
                    [int(t) for t in p["tokens"]],
                    [float(top[0][1]) - float(top[1][1]) for top in p["top"]],
                )
                for p in doc["prompts"]
            ]
        except (ValueError, KeyError, TypeError, IndexError) as exc:
            raise GoldenFileError(f"PALMYRA_GOLDEN_FILE {path}: not a golden reference ({exc})") from None
        if not prompts or any(len(p.tokens) != len(p.margins) or not p.prompt_ids for p in prompts):
            raise GoldenFileError(f"PALMYRA_GOLDEN_FILE {path}: no prompts, or a prompt without tokens")
        return cls(str(doc.get("weights", "")), prompts)


@dataclass(slots=True)
class PromptVerdict:
    agreed: int = 0  # positions with the reference's token
    compared: int = 0  # positions compared (up to a near-tie or drift)
    near_tie: bool = False
    drift_at: int | None = None


def judge(prompt: GoldenPrompt, tokens: list[int], tolerance: float) -> PromptVerdict:
    """Walk one answer against the reference (see the module's docstring)."""
    verdict = PromptVerdict()
    for pos, want in enumerate(prompt.tokens):
        if pos >= len(tokens):
            break  # the engine stopped early (an end-of-text the reference did not reach): nothing more to compare
        verdict.compared += 1
        if tokens[pos] == want:
            verdict.agreed += 1
            continue
        if prompt.margins[pos] <= tolerance:
            verdict.near_tie = True
        else:
            verdict.drift_at = pos
        break
    return verdict


@dataclass(slots=True)
class CheckResult:
    verdict: str  # agree / drift / error
    failed: list[str] = field(default_factory=list)  # the prompts that drifted, by name
    agreed: int = 0
    compared: int = 0
    near_ties: int = 0
    error: str | None = None
    seconds: float = 0.0  # the replay's wall time: its cost in engine time, one request at a time
    generated: int = 0  # tokens the engine generated for it

    @property
    def agreement(self) -> float | None:
        return self.agreed / self.compared if self.compared else None

    def summary(self) -> dict[str, Any]:
        ratio = self.agreement
        return {
            "verdict": self.verdict,
            "failed_prompts": self.failed,
            "positions_compared": self.compared,
            "agreement": round(ratio, 4) if ratio is not None else None,
            "near_ties": self.near_ties,
            "seconds": round(self.seconds, 3),
            "tokens_generated": self.generated,
            "error": self.error,
        }


async def check(
    engine: Engine,
    model: str,
    reference: GoldenReference,
    tolerance: float,
    clock: Callable[[], float] = time.monotonic,
) -> CheckResult:
    """Replay every golden prompt through the engine, one at a time, and judge the answers."""
    result = CheckResult("agree")
    began = clock()
    for prompt in reference.prompts:
        payload = {
            "model": model,
            "prompt": prompt.prompt_ids,
            "max_tokens": len(prompt.tokens),
            "temperature": 0.0,
            "return_token_ids": True,
        }
        answer = await engine.generate("/v1/completions", payload, PROMPT_TIMEOUT_S)
        if not answer.ok or answer.token_ids is None:
            failed = CheckResult("error", error=answer.error or "the engine returned no token ids")
            failed.seconds, failed.generated = clock() - began, result.generated
            return failed
        result.generated += len(answer.token_ids)
        one = judge(prompt, list(answer.token_ids), tolerance)
        result.agreed += one.agreed
        result.compared += one.compared
        result.near_ties += int(one.near_tie)
        if one.drift_at is not None:
            result.failed.append(prompt.name)
    result.seconds = clock() - began
    if result.failed:
        result.verdict = "drift"
    return result
