"""PNG plots for bench: latency vs input length, throughput and efficiency vs concurrency."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType


def _pyplot() -> ModuleType:
    import matplotlib

    matplotlib.use("Agg")  # files only, never a display
    import matplotlib.pyplot as plt

    return plt


def latency_vs_length(doc: dict, path: Path) -> Path:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for section, key, label in (("prefill", "latency_s", "prefill (max_tokens=1)"), ("ttft", "ttft_s", "TTFT")):
        rows = doc.get(section) or []
        xs = [r["input_tokens"] for r in rows]
        p50 = [r[key]["p50"] * 1000 for r in rows]
        p90 = [r[key]["p90"] * 1000 for r in rows]
        (line,) = ax.plot(xs, p50, marker="o", label=f"{label} p50")
        ax.fill_between(xs, p50, p90, alpha=0.2, color=line.get_color(), label=f"{label} p50-p90")
    ax.set_xlabel("input tokens")
    ax.set_ylabel("latency (ms)")
    ax.set_title(f"Latency vs input length: {doc['meta']['model']} @ {doc['meta']['base_url']}")
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.savefig(path, dpi=100, bbox_inches="tight")
    plt.close(fig)
    return path


def throughput_vs_concurrency(doc: dict, path: Path) -> Path:
    plt = _pyplot()
    rows = doc.get("throughput") or []
    xs = [r["concurrency"] for r in rows]
    thr = [r["tokens_per_s"]["p50"] for r in rows]
    eff = [r["efficiency"] * 100 for r in rows]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    ax.plot(xs, thr, marker="o", label="throughput p50 (tok/s)")
    if rows:
        base = thr[0] / xs[0]
        ax.plot(xs, [base * x for x in xs], linestyle="--", color="grey", label="ideal (linear)")
    ax.set_xlabel("concurrent streams")
    ax.set_ylabel("output tokens / s")
    ax.set_xscale("log", base=2)
    ax.set_xticks(xs, [str(x) for x in xs])
    ax.grid(True, alpha=0.3)
    ax2 = ax.twinx()
    ax2.plot(xs, eff, marker="s", color="tab:red", label="efficiency (%)")
    ax2.set_ylabel("scaling efficiency (%)")
    ax2.set_ylim(0, 110)
    h1, l1 = ax.get_legend_handles_labels()
    h2, l2 = ax2.get_legend_handles_labels()
    # Below the axes: inside, it hides the first points of either curve.
    ax.legend(h1 + h2, l1 + l2, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=3, fontsize="small")
    ax.set_title("Throughput and scaling efficiency vs concurrency")
    fig.savefig(path, dpi=100, bbox_inches="tight")
    plt.close(fig)
    return path
