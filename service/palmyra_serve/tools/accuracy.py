"""Position-by-position comparison of an endpoint's greedy tokens with the fp32 reference, and the verdict.

Pure logic: the reference is anything with `tokens`, `logit(pos, tok)`, `std(pos)` and
`top2(pos)`, so the rules are tested without torch.

Verdict per prompt
- `match`: the endpoint returned the reference's N tokens.
- `near-tie divergence`: the first differing token was a near-tie on BOTH sides: the reference
  prefers its own token over the endpoint's by at most `near_tie` x (the std of its logits at that
  position), and the endpoint prefers its token over the reference's by at most the same amount
  (logprob differences are logit differences: the softmax normaliser cancels). That is what
  rounding noise does; it flips ties, it does not flip clear preferences.
- `suspicious`: anything else: a divergence (or a first-token disagreement) with a clear margin on
  either side, or the endpoint returning fewer tokens than asked.
The run as a whole is also suspicious when the endpoint's logprobs along the shared prefixes sit
further from the reference than NOISE_CEILING x the threshold (rms): then even "ties" are suspect.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Protocol

MATCH = "match"
NEAR_TIE = "near-tie divergence"
SUSPICIOUS = "suspicious"

# Default threshold, in units of the reference logits' std at the divergence position. Measured
# here (docs/validate-and-bench.md): bf16 engine vs fp32 reference logit noise has an rms of 0.0075
# std on the 2-layer stand-in and 0.019 std (max 0.058) on the 28-layer full-size one; a flip needs
# the difference of two such errors (x1.4). 0.2 sits ~7 of those pairwise deviations above the
# full-size noise, while weights that are really wrong (noise in one layer) flip tokens by 3-5 std.
DEFAULT_NEAR_TIE = 0.2
# Noise itself is a fault when its rms reaches this fraction of the threshold: a systematic error
# that large would excuse divergences it caused.
NOISE_CEILING = 0.5


class Reference(Protocol):
    tokens: list[int]

    def logit(self, pos: int, tok: int) -> float: ...

    def std(self, pos: int) -> float: ...

    def top2(self, pos: int) -> tuple[int, float, int, float]: ...


@dataclass
class EndpointOutput:
    tokens: list[int | None]
    token_logprobs: list[float | None] = field(default_factory=list)
    top_logprobs: list[dict[int, float]] = field(default_factory=list)  # per position: id -> logprob
    finish_reason: str | None = None


@dataclass
class Divergence:
    position: int
    reference_token: int
    endpoint_token: int | None
    ref_logit_std: float
    ref_top2_margin: float  # reference top-1 minus top-2 logit, fp32, along the shared prefix
    ref_flip_margin: float | None  # reference logit of its token minus that of the endpoint's token
    endpoint_logprob_own: float | None
    endpoint_logprob_ref: float | None  # None: the reference token is not in the endpoint's top-k
    endpoint_gap: float | None  # endpoint logprob of its token minus that of the reference's token
    endpoint_gap_is_lower_bound: bool  # reference token outside top-k: gap >= own - min(top-k)


@dataclass
class PromptResult:
    name: str
    prompt: str
    prompt_tokens: int
    n_tokens: int
    reference_tokens: list[int]
    endpoint_tokens: list[int | None]
    first_token_match: bool
    match_rate: float
    first_divergence: int | None
    divergence: Divergence | None
    verdict: str
    reason: str
    # Endpoint logprobs minus reference logits for the endpoint's top-k tokens along the shared
    # prefix, centred per position (that cancels both softmax normalisers), in units of the
    # reference logit std: the run's own measure of numeric noise, next to the near-tie threshold.
    noise: list[float] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)


def _divergence(pos: int, ref: Reference, out: EndpointOutput) -> Divergence:
    rtok = ref.tokens[pos]
    etok = out.tokens[pos] if pos < len(out.tokens) else None
    _, l1, _, l2 = ref.top2(pos)
    flip = ref.logit(pos, rtok) - ref.logit(pos, etok) if etok is not None else None
    own = out.token_logprobs[pos] if pos < len(out.token_logprobs) else None
    top = out.top_logprobs[pos] if pos < len(out.top_logprobs) else {}
    lp_ref = top.get(rtok)
    gap, bound = None, False
    if own is not None and lp_ref is not None:
        gap = own - lp_ref
    elif own is not None and top:
        gap, bound = own - min(top.values()), True
    return Divergence(
        position=pos,
        reference_token=rtok,
        endpoint_token=etok,
        ref_logit_std=ref.std(pos),
        ref_top2_margin=l1 - l2,
        ref_flip_margin=flip,
        endpoint_logprob_own=own,
        endpoint_logprob_ref=lp_ref,
        endpoint_gap=gap,
        endpoint_gap_is_lower_bound=bound,
    )


def classify(div: Divergence | None, short: bool, near_tie: float) -> tuple[str, str]:
    """(verdict, reason) for one prompt; see the module docstring for the rules."""
    if div is None:
        if short:
            return SUSPICIOUS, "endpoint returned fewer tokens than asked"
        return MATCH, "all tokens equal"
    limit = near_tie * div.ref_logit_std
    where = "first token" if div.position == 0 else f"position {div.position}"
    if div.endpoint_token is None:
        return SUSPICIOUS, f"{where}: endpoint returned no token (or an unmappable one)"
    if div.ref_flip_margin is None or not math.isfinite(div.ref_flip_margin) or div.ref_flip_margin > limit:
        return SUSPICIOUS, (
            f"{where}: reference prefers its token by {div.ref_flip_margin:.4g} logits > {near_tie:g} std ({limit:.4g})"
        )
    if div.endpoint_gap is not None and div.endpoint_gap > limit:
        kind = "at least " if div.endpoint_gap_is_lower_bound else ""
        return SUSPICIOUS, (
            f"{where}: endpoint prefers its token by {kind}{div.endpoint_gap:.4g} logprob "
            f"> {near_tie:g} std ({limit:.4g})"
        )
    return NEAR_TIE, (
        f"{where}: reference margin {div.ref_flip_margin:.3g} <= {near_tie:g} std ({limit:.3g}); a rounding-level tie"
    )


def logit_noise(ref: Reference, out: EndpointOutput, upto: int) -> list[float]:
    res: list[float] = []
    for pos in range(min(upto, len(out.top_logprobs), len(ref.tokens))):
        top = out.top_logprobs[pos]
        if len(top) < 2:
            continue
        diffs = [lp - ref.logit(pos, tok) for tok, lp in top.items()]
        mean = sum(diffs) / len(diffs)
        sd = ref.std(pos)
        res += [(d - mean) / sd for d in diffs]
    return res


def compare(
    name: str, prompt: str, prompt_tokens: int, ref: Reference, out: EndpointOutput, near_tie: float = DEFAULT_NEAR_TIE
) -> PromptResult:
    n = len(ref.tokens)
    got = out.tokens[:n]
    matches = sum(1 for i, t in enumerate(got) if t == ref.tokens[i])
    first_div = next((i for i, t in enumerate(got) if t != ref.tokens[i]), None)
    short = len(got) < n
    div = _divergence(first_div, ref, out) if first_div is not None else None
    verdict, reason = classify(div, short, near_tie)
    if first_div is None and short:
        first_div = len(got)
    return PromptResult(
        name=name,
        prompt=prompt,
        prompt_tokens=prompt_tokens,
        n_tokens=n,
        reference_tokens=list(ref.tokens),
        endpoint_tokens=list(got),
        first_token_match=bool(got) and got[0] == ref.tokens[0],
        match_rate=matches / n if n else math.nan,
        first_divergence=first_div,
        divergence=div,
        verdict=verdict,
        reason=reason,
        noise=logit_noise(ref, out, first_div if first_div is not None else n),
    )


def summary(results: list[PromptResult], near_tie: float = DEFAULT_NEAR_TIE) -> dict:
    n = len(results)
    noise = [x for r in results for x in r.noise]
    rms = math.sqrt(sum(x * x for x in noise) / len(noise)) if noise else None
    noisy = rms is not None and rms > NOISE_CEILING * near_tie
    counts = {v: sum(1 for r in results if r.verdict == v) for v in (MATCH, NEAR_TIE, SUSPICIOUS)}
    return {
        "prompts": n,
        "first_token_agreement": sum(r.first_token_match for r in results) / n if n else math.nan,
        "mean_match_rate": sum(r.match_rate for r in results) / n if n else math.nan,
        "verdicts": counts,
        "suspicious": counts[SUSPICIOUS] > 0 or noisy,
        "logit_noise_std": {
            "rms": rms,
            "max": max((abs(x) for x in noise), default=None),
            "n": len(noise),
            "too_high": noisy,
        },
    }
