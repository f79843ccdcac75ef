"""bench's client-side TTFT and inter-token figures beside the engine's own histograms.

vLLM observes every request's time to first token (`vllm:time_to_first_token_seconds`) and every
gap between two output tokens (`vllm:inter_token_latency_seconds`), both in vLLM 0.18 and 0.32.
bench reads the engine's metrics page before and after a phase; the engine's mean over the phase
is the growth of `_sum` over the growth of `_count`, summed over the families' label sets. The
client's figure over the same requests (each weighted as the engine weights it) sits beside it,
with client / engine: what the HTTP hop, the sidecar and the detokenized stream add (above 1), or
a clock that disagrees (below it).
"""

from __future__ import annotations

import math
from typing import Any

TTFT = "vllm:time_to_first_token_seconds"
INTER_TOKEN = "vllm:inter_token_latency_seconds"
FAMILIES = (TTFT, INTER_TOKEN)
# Through the sidecar the engine's page is /engine/metrics; the bare engine serves it as /metrics.
PATHS = ("/engine/metrics", "/metrics")


def sums(text: str, families: tuple[str, ...] = FAMILIES) -> dict[str, tuple[float, float]]:
    """family -> (sum, count) over all its label sets, from Prometheus text; families absent are left out."""
    wanted = {f"{f}{suffix}": (f, i) for f in families for i, suffix in enumerate(("_sum", "_count"))}
    out: dict[str, list[float]] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name = line.split("{", 1)[0].split(" ", 1)[0]
        hit = wanted.get(name)
        if hit is None:
            continue
        value_part = line.rsplit("}", 1)[-1] if "{" in line else line[len(name) :]
        try:
            value = float(value_part.split()[0])
        except (IndexError, ValueError):
            continue
        family, i = hit
        out.setdefault(family, [0.0, 0.0])[i] += value
    return {f: (v[0], v[1]) for f, v in out.items()}


def window(before: dict[str, tuple[float, float]], after: dict[str, tuple[float, float]]) -> dict[str, Any]:
    """Per family: the observations made between two scrapes and their mean (None without any)."""
    out: dict[str, Any] = {}
    for family in FAMILIES:
        if family not in before or family not in after:
            out[family] = {"count": 0, "mean_s": None}
            continue
        d_sum = after[family][0] - before[family][0]
        d_count = after[family][1] - before[family][1]
        out[family] = {"count": round(d_count), "mean_s": d_sum / d_count if d_count > 0 else None}
    return out


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def cross_check(name: str, client_ttft: list[float], client_gaps: list[float], engine: dict[str, Any]) -> dict:
    """One phase's row: client means (TTFT per request; the per-token gap per streamed request, each
    over the same token count, so it weighs as the engine's per-gap mean does), the engine's, and
    client / engine."""

    def ratio(client: float | None, server: float | None) -> float | None:
        return client / server if client is not None and server else None

    c_ttft, c_gap = _mean(client_ttft), _mean(client_gaps)
    e_ttft, e_gap = engine[TTFT]["mean_s"], engine[INTER_TOKEN]["mean_s"]
    return {
        "phase": name,
        "client": {"ttft_mean_s": c_ttft, "inter_token_mean_s": c_gap, "requests": len(client_ttft)},
        "engine": {
            "ttft_mean_s": e_ttft,
            "inter_token_mean_s": e_gap,
            "ttft_count": engine[TTFT]["count"],
            "inter_token_count": engine[INTER_TOKEN]["count"],
        },
        "ratio": {"ttft": ratio(c_ttft, e_ttft), "inter_token": ratio(c_gap, e_gap)},
    }


def markdown(check: dict | None) -> list[str]:
    """The report's cross-check section."""
    lines = ["## Client against the engine's own histograms", ""]
    if not check or not check.get("phases"):
        why = (check or {}).get("unavailable") or "not measured"
        return [*lines, f"Not available: {why}.", ""]
    lines += [
        f"Engine means from `{TTFT}` and `{INTER_TOKEN}` on `{check['path']}`, read before and after each "
        "phase (sum and count deltas); client means over the same requests. TTFT's client side is send to "
        "first token for streamed requests and send to last byte for the `max_tokens: 1` prefills.",
        "",
        "| Phase | TTFT client (ms) | TTFT engine (ms) | client / engine | inter-token client (ms) "
        "| inter-token engine (ms) | client / engine | engine observations (TTFT / gaps) |",
        "|---|---|---|---|---|---|---|---|",
    ]

    def ms(x: float | None) -> str:
        return "—" if x is None or not math.isfinite(x) else f"{x * 1000:.2f}"

    def times(x: float | None) -> str:
        return "—" if x is None else f"{x:.3f}×"

    for row in check["phases"]:
        c, e, r = row["client"], row["engine"], row["ratio"]
        lines.append(
            f"| {row['phase']} | {ms(c['ttft_mean_s'])} | {ms(e['ttft_mean_s'])} | {times(r['ttft'])} "
            f"| {ms(c['inter_token_mean_s'])} | {ms(e['inter_token_mean_s'])} | {times(r['inter_token'])} "
            f"| {e['ttft_count']} / {e['inter_token_count']} (client requests: {c['requests']}) |"
        )
    return [*lines, ""]
