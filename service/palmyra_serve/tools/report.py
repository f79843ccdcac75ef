"""Markdown for validate and bench, shaped like the reference adaptation's tables, and `bench --compare`."""

from __future__ import annotations

import math

from palmyra_serve.tools import engine_metrics, environment

SEED_SCALING = "reference adaptation (Ascend 910B x 1, bf16): 14.05x from 1 to 16 streams, 87.8% efficiency"


def _cell(text: str, width: int = 36) -> str:
    flat = " ".join(str(text).split()).replace("|", "\\|")
    return flat if len(flat) <= width else flat[: width - 1] + "…"


def _num(x: float | None, fmt: str = ".1f", scale: float = 1.0) -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "—"
    return format(x * scale, fmt)


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return out


# ---------------------------------------------------------------- validate


def validate_markdown(doc: dict) -> str:
    s = doc["summary"]
    n = doc["tokens"]
    lines = [
        "# Accuracy: endpoint vs fp32 Transformers reference",
        "",
        f"Endpoint `{doc['endpoint']}`, model `{doc['model']}`; reference: the same checkpoint "
        f"(`{doc['model_dir']}`) in Transformers, fp32, CPU. Greedy, {n} tokens per prompt, prompts "
        f"sent as token ids. Near-tie threshold: {doc['near_tie_threshold_std']:g} x the reference logit "
        f"std at the divergence.",
        "",
    ]
    if doc.get("stand_in"):
        si = doc["stand_in"]
        lines += [
            f"> Weights: **random-weight stand-in** (size `{si.get('size')}`, seed {si.get('seed')}). "
            "Its logits are nearly uniform, so tiny numeric differences flip near-ties and the paths "
            "then part (the reference adaptation's 'What is 2+2?' case); `near-tie divergence` is expected there, "
            "only `suspicious` indicates a fault.",
            "",
        ]
    if doc.get("environment"):
        lines += environment.markdown(doc["environment"])
    lines += ["## Per prompt", ""]
    rows = []
    for i, p in enumerate(doc["prompts"], start=1):
        d = p.get("divergence") or {}
        std = d.get("ref_logit_std") or math.nan
        margin = d.get("ref_flip_margin")
        gap = d.get("endpoint_gap")
        rows.append(
            [
                str(i),
                _cell(p["prompt"]),
                str(p["prompt_tokens"]),
                "yes" if p["first_token_match"] else "**no**",
                f"{p['match_rate']:.0%}",
                "—" if p["first_divergence"] is None else str(p["first_divergence"]),
                "—"
                if not d
                else f"{_num(d.get('ref_top2_margin'), '.3g')} / {_num(margin, '.3g')} "
                f"({_num(margin / std if margin is not None else None, '.2f')} σ)",
                "—" if gap is None else (">" if d.get("endpoint_gap_is_lower_bound") else "") + _num(gap, ".3g"),
                p["verdict"] if p["verdict"] != "suspicious" else "**suspicious**",
            ]
        )
    lines += _table(
        [
            "#",
            "Prompt",
            "Prompt tokens",
            "First token",
            f"{n}-token match",
            "First divergence",
            "Ref. top-2 / flip margin (logits)",
            "Endpoint Δlogprob",
            "Verdict",
        ],
        rows,
    )
    v = s["verdicts"]
    lines += ["", "## Summary", ""]
    lines += _table(
        ["Metric", "Value"],
        [
            [
                "First-token agreement",
                f"{round(s['first_token_agreement'] * s['prompts'])}/{s['prompts']} ({s['first_token_agreement']:.0%})",
            ],
            [f"Mean {n}-token match rate", f"{s['mean_match_rate']:.1%}"],
            [
                "Logit noise along shared prefixes (σ units)",
                _noise(s.get("logit_noise_std") or {}, doc["near_tie_threshold_std"]),
            ],
            [
                "Verdicts",
                f"{v['match']} match, {v['near-tie divergence']} near-tie divergence, {v['suspicious']} suspicious",
            ],
        ],
    )
    if (s.get("logit_noise_std") or {}).get("too_high"):
        lines += [
            "",
            "**Endpoint logprobs are noisier than rounding explains** (rms above half the near-tie "
            "threshold): the near-tie verdicts above cannot be trusted.",
        ]
    lines += [
        "",
        "**Result: SUSPICIOUS**, see the prompts marked above."
        if s["suspicious"]
        else "**Result: OK**, no suspicious divergence.",
        "",
    ]
    return "\n".join(lines)


def _noise(nz: dict, threshold: float) -> str:
    if not nz.get("n"):
        return "— (no top logprobs from the endpoint)"
    return f"rms {nz['rms']:.4f}, max {nz['max']:.4f} over {nz['n']} top-k logprobs (near-tie threshold {threshold:g})"


# ---------------------------------------------------------------- bench


def bench_markdown(doc: dict) -> str:
    m = doc["meta"]
    ms = 1000.0
    lines = [
        "# Performance",
        "",
        f"Endpoint `{m['base_url']}`, model `{m['model']}`, max_model_len {m.get('max_model_len')}; "
        f"machine `{m['host']}` ({m['cpus']} CPUs); {m['started_at']}. Client-side measurement, "
        f"{m['repetitions']} repetitions per point after {m['warmup']} warm-up requests; "
        f"{m['output_tokens']} output tokens (`ignore_eos`); random token-id prompts (seed {m['seed']}).",
        "",
    ]
    if doc.get("environment"):
        lines += environment.markdown(doc["environment"])
    lines += [
        "## 5.1 Prefill latency",
        "",
        "Non-streamed request with `max_tokens: 1`, send to last byte: the prompt's prefill plus one sampled token.",
        "",
    ]
    lines += _table(
        ["Input tokens", "p50 (ms)", "p90 (ms)", "p99 (ms)", "prefill tok/s (p50)"],
        [
            [
                str(r["input_tokens"]),
                _num(r["latency_s"]["p50"], ".1f", ms),
                _num(r["latency_s"]["p90"], ".1f", ms),
                _num(r["latency_s"]["p99"], ".1f", ms),
                _num(r["input_tokens"] / r["latency_s"]["p50"] if r["latency_s"]["p50"] else None, ".0f"),
            ]
            for r in doc["prefill"]
        ],
    )
    lines += [
        "",
        "## 5.2 Decode latency",
        "",
        "Streamed, one request at a time: (end-to-end − TTFT) / (output tokens − 1).",
        "",
    ]
    lines += _table(
        ["Input tokens", "per token p50 (ms)", "p90 (ms)", "p99 (ms)", "decode tok/s (p50)"],
        [
            [
                str(r["input_tokens"]),
                _num(r["per_token_s"]["p50"], ".2f", ms),
                _num(r["per_token_s"]["p90"], ".2f", ms),
                _num(r["per_token_s"]["p99"], ".2f", ms),
                _num(1 / r["per_token_s"]["p50"] if r["per_token_s"]["p50"] else None, ".1f"),
            ]
            for r in doc["decode"]
        ],
    )
    lines += [
        "",
        "## 5.3 Time to first token (TTFT)",
        "",
        "Streamed, one request at a time: send to the first chunk carrying a token.",
        "",
    ]
    lines += _table(
        ["Input tokens", "p50 (ms)", "p90 (ms)", "p99 (ms)"],
        [
            [
                str(r["input_tokens"]),
                _num(r["ttft_s"]["p50"], ".1f", ms),
                _num(r["ttft_s"]["p90"], ".1f", ms),
                _num(r["ttft_s"]["p99"], ".1f", ms),
            ]
            for r in doc["ttft"]
        ],
    )
    lines += [
        "",
        "## 5.4 Throughput vs concurrency",
        "",
        f"{doc['throughput_input_tokens']}-token prompts, {m['output_tokens']} output tokens, N streams "
        "started together; throughput = N x output tokens / wall time of the batch. Speed-up and "
        f"efficiency from the p50s, against N x the 1-stream rate ({SEED_SCALING}).",
        "",
    ]
    lines += _table(
        ["Concurrency", "tok/s p50", "tok/s p90", "tok/s p99", "Speed-up", "Efficiency", "request p50 (s)"],
        [
            [
                str(r["concurrency"]),
                _num(r["tokens_per_s"]["p50"]),
                _num(r["tokens_per_s"]["p90"]),
                _num(r["tokens_per_s"]["p99"]),
                _num(r["speedup"], ".2f") + "×",
                _num(r["efficiency"], ".1%"),
                _num(r["request_latency_s"]["p50"], ".2f"),
            ]
            for r in doc["throughput"]
        ],
    )
    if doc.get("scaling"):
        lines += ["", scaling_line(doc["scaling"])]
    if "engine_cross_check" in doc:
        lines += ["", *engine_metrics.markdown(doc["engine_cross_check"])]
    if doc.get("errors"):
        lines += ["", f"**{doc['errors']} request(s) failed**; first: {doc.get('first_error')}"]
    lines.append("")
    return "\n".join(lines)


def scaling_line(sc: dict) -> str:
    ref = sc["reference"]
    theirs = f"the reference adaptation: **{ref['speedup']:.2f}×** ({ref['efficiency']:.1%}, {ref['on']})"
    if sc.get("speedup") is None:
        return (
            f"Scaling from {sc['from']} to {sc['to']} streams: not measured here (--concurrency needs both); {theirs}."
        )
    return (
        f"Scaling from {sc['from']} to {sc['to']} streams (throughput at {sc['to']} / throughput at {sc['from']}, "
        f"efficiency = that / {sc['to']}): this run **{sc['speedup']:.2f}×** ({sc['efficiency']:.1%}); {theirs}."
    )


# ---------------------------------------------------------------- compare


def flatten(doc: dict) -> dict[str, tuple[float, str, bool]]:
    """metric -> (value, unit, higher_is_better): the numbers two bench runs are judged by."""
    out: dict[str, tuple[float, str, bool]] = {}
    for section, key, label in (
        ("prefill", "latency_s", "prefill"),
        ("ttft", "ttft_s", "TTFT"),
        ("decode", "per_token_s", "decode/token"),
    ):
        for r in doc.get(section, []):
            for q in ("p50", "p99"):
                out[f"{label} {q} @ {r['input_tokens']} tok"] = (r[key][q] * 1000, "ms", False)
    for r in doc.get("throughput", []):
        c = r["concurrency"]
        out[f"throughput p50 @ {c} streams"] = (r["tokens_per_s"]["p50"], "tok/s", True)
        out[f"efficiency @ {c} streams"] = (r["efficiency"] * 100, "%", True)
    return out


def compare_markdown(a: dict, b: dict, name_a: str, name_b: str) -> str:
    fa, fb = flatten(a), flatten(b)
    keys = list(fa) + [k for k in fb if k not in fa]
    rows = []
    for k in keys:
        va, vb = fa.get(k), fb.get(k)
        row = va or fb[k]  # every key comes from fa or fb
        unit = row[1]
        higher = row[2]
        ratio = vb[0] / va[0] if va and vb and va[0] else None
        if ratio is None:
            mark = ""
        else:
            better = ratio > 1 if higher else ratio < 1
            mark = (
                " (better)"
                if better and abs(ratio - 1) >= 0.05
                else (" (worse)" if not better and abs(ratio - 1) >= 0.05 else "")
            )
        rows.append(
            [
                k,
                unit,
                _num(va[0] if va else None, ".2f"),
                _num(vb[0] if vb else None, ".2f"),
                (_num(ratio, ".3f") + "×" + mark) if ratio is not None else "—",
            ]
        )
    head = [
        f"# bench compare: B = `{name_b}` vs A = `{name_a}`",
        "",
        f"A: {a['meta']['base_url']} on {a['meta']['host']} ({a['meta']['started_at']}); "
        f"B: {b['meta']['base_url']} on {b['meta']['host']} ({b['meta']['started_at']}). "
        "Ratio = B / A; latencies: lower is better, throughput and efficiency: higher is better "
        "(marked when they differ by 5% or more).",
        "",
    ]
    return "\n".join(head + _table(["Metric", "Unit", "A", "B", "B / A"], rows) + [""])
