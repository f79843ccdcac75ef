"""bench against the session's real vLLM CPU engine with short settings: structure and sanity."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path


def test_bench_short_run(engine_server, tmp_path: Path) -> None:
    out = tmp_path / "bench"
    argv = [
        sys.executable,
        "-m",
        "palmyra_serve.cli",
        "bench",
        "--base-url",
        engine_server.url,
        "--input-lengths",
        "16,128,4096",
        "--output-tokens",
        "16",
        "--concurrency",
        "1,4",
        "--repetitions",
        "2",
        "--warmup",
        "2",
        "--no-progress",
        "--out",
        str(out),
    ]
    if engine_server.api_key:
        argv += ["--api-key", engine_server.api_key]
    res = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stdout + res.stderr
    doc = json.loads((out / "results.json").read_text())
    assert doc["errors"] == 0
    mml = doc["meta"]["max_model_len"]
    assert doc["meta"]["input_lengths"] == [16, 128, min(4096, mml - 16)]  # capped by what /v1/models says
    for section, key in (("prefill", "latency_s"), ("ttft", "ttft_s"), ("decode", "per_token_s")):
        assert [r["input_tokens"] for r in doc[section]] == doc["meta"]["input_lengths"]
        for r in doc[section]:
            assert r[key]["n"] == 2 and 0 < r[key]["p50"] < 60
    # A longer prompt costs more prefill: the longest is slower than the shortest.
    assert doc["prefill"][-1]["latency_s"]["p50"] > doc["prefill"][0]["latency_s"]["p50"]
    # Speedup and efficiency are the report's arithmetic on the p50s. Whether 4 streams beat 1 is
    # vLLM's business, not bench's, and two 16-token samples on 2 shared cores once had 4 streams at
    # 99.1 tok/s against 101.8 for 1: asserted in the benchmark's own runs, not here.
    thr = {r["concurrency"]: r for r in doc["throughput"]}
    for r in thr.values():
        assert r["tokens_per_s"]["n"] == 2 and all(rate > 0 for rate in r["samples"])
    speedup = thr[4]["tokens_per_s"]["p50"] / thr[1]["tokens_per_s"]["p50"]
    assert thr[1]["speedup"] == 1 and abs(thr[4]["speedup"] - speedup) < 1e-9
    assert abs(thr[4]["efficiency"] - speedup / 4) < 1e-9 and 0 < thr[4]["efficiency"] <= 1.5
    md = (out / "report.md").read_text()
    assert "5.4 Throughput vs concurrency" in md
    for png in ("latency_vs_length.png", "throughput_vs_concurrency.png"):
        assert (out / png).read_bytes()[:4] == b"\x89PNG"

    # A run compared with itself: every ratio is 1.
    cmp = subprocess.run(
        [
            sys.executable,
            "-m",
            "palmyra_serve.cli",
            "bench",
            "--compare",
            str(out / "results.json"),
            str(out / "results.json"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert cmp.returncode == 0, cmp.stderr
    ratios = [
        line.rsplit("|", 2)[1].strip() for line in cmp.stdout.splitlines() if line.startswith("| ") and "×" in line
    ]
    assert ratios and all(r == "1.000×" for r in ratios)
