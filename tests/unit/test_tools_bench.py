"""bench against an in-process fake endpoint (async MockTransport): plan, structure, outputs, compare."""

from __future__ import annotations

import argparse
import asyncio
import copy
import json
import sys
from pathlib import Path

import httpx
import pytest

from palmyra_serve.tools import bench, report
from palmyra_serve.tools.endpoint import api_key

DELAY_S = 0.02  # every fake request takes this long whatever the concurrency: ideal scaling


def _sse(n_tokens: int) -> bytes:
    chunks: list[dict[str, object]] = [{"choices": [{"index": 0, "text": f"t{i}"}]} for i in range(n_tokens)]
    chunks.append({"choices": [], "usage": {"completion_tokens": n_tokens}})
    return b"".join(b"data: " + json.dumps(c).encode() + b"\n\n" for c in chunks) + b"data: [DONE]\n\n"


ENGINE_GAP_S = 0.001  # the inter-token gap the fake engine's histogram records


class FakeEndpoint:
    """A sidecar in front of an engine: completions, /v1/models, and /engine/metrics whose TTFT and
    inter-token histograms grow as a vLLM engine's do (one TTFT per request, one gap per later token)."""

    def __init__(self, max_model_len: int = 2048, fail_streams: bool = False):
        self.max_model_len = max_model_len
        self.fail_streams = fail_streams
        self.bodies: list[dict] = []
        self.ttft = [0.0, 0]  # sum, count
        self.gaps = [0.0, 0]

    def metrics_page(self) -> str:
        lines = []
        for family, (total, count) in (
            ("vllm:time_to_first_token_seconds", self.ttft),
            ("vllm:inter_token_latency_seconds", self.gaps),
        ):
            labels = '{engine="0",model_name="palmyra-mini"}'
            lines += [f"# TYPE {family} histogram", f"{family}_sum{labels} {total}", f"{family}_count{labels} {count}"]
        return "\n".join(lines) + "\n"

    async def __call__(self, request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/models":
            return httpx.Response(200, json={"data": [{"id": "palmyra-mini", "max_model_len": self.max_model_len}]})
        if request.url.path == "/engine/metrics":
            return httpx.Response(200, text=self.metrics_page())
        if request.method == "GET":  # /version, /metrics: the sidecar relays neither
            return httpx.Response(404, json={"error": {"message": "not found"}})
        body = json.loads(request.content)
        self.bodies.append(body)
        self.ttft[0] += DELAY_S
        self.ttft[1] += 1
        if body["stream"]:
            self.gaps[0] += ENGINE_GAP_S * (body["max_tokens"] - 1)
            self.gaps[1] += body["max_tokens"] - 1
        await asyncio.sleep(DELAY_S)
        if not body["stream"]:
            return httpx.Response(200, json={"choices": [{"text": "x"}], "usage": {"completion_tokens": 1}})
        if self.fail_streams:
            return httpx.Response(503, json={"error": {"message": "draining", "type": "x", "code": 503}})
        return httpx.Response(200, content=_sse(body["max_tokens"]), headers={"content-type": "text/event-stream"})


def _args(tmp_path: Path, *extra: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    bench.add_arguments(p)
    return p.parse_args(
        [
            "--base-url",
            "http://engine.test",
            "--input-lengths",
            "16,128,4096",
            "--output-tokens",
            "8",
            "--concurrency",
            "1,4",
            "--repetitions",
            "2",
            "--warmup",
            "1",
            "--no-progress",
            "--out",
            str(tmp_path / "out"),
            *extra,
        ]
    )


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> FakeEndpoint:
    fe = FakeEndpoint()
    monkeypatch.setattr(
        bench,
        "make_client",
        lambda args, c: httpx.AsyncClient(base_url=args.base_url, transport=httpx.MockTransport(fe)),
    )
    return fe


def test_plan_caps_at_max_model_len_minus_output() -> None:
    assert bench.plan([128, 512, 8192, 9000], 64, 8192) == [128, 512, 8128]
    with pytest.raises(ValueError):
        bench.plan([1], 100, 100)


def test_comma_lists_are_validated() -> None:
    p = argparse.ArgumentParser()
    bench.add_arguments(p)
    assert p.parse_args(["--concurrency", "1,2,16"]).concurrency == [1, 2, 16]
    for bad in ("1,x", "0,1"):
        with pytest.raises(SystemExit):
            p.parse_args(["--concurrency", bad])


def test_run_writes_seed_shaped_report_json_and_plots(tmp_path: Path, fake: FakeEndpoint, capsys) -> None:
    assert bench.run(_args(tmp_path)) == 0
    out = tmp_path / "out"
    doc = json.loads((out / "results.json").read_text())
    assert doc["schema"] == bench.SCHEMA and doc["errors"] == 0
    assert doc["meta"]["input_lengths"] == [16, 128, 2040]  # 4096 capped at 2048 - 8
    assert [r["input_tokens"] for r in doc["prefill"]] == [16, 128, 2040]
    for section, key in (("prefill", "latency_s"), ("ttft", "ttft_s"), ("decode", "per_token_s")):
        for row in doc[section]:
            assert row[key]["n"] == 2
            assert 0 < row[key]["p50"] <= row[key]["p90"] <= row[key]["p99"]
    thr = {r["concurrency"]: r for r in doc["throughput"]}
    assert thr[4]["tokens_per_s"]["p50"] > 2 * thr[1]["tokens_per_s"]["p50"]
    assert thr[1]["efficiency"] == 1.0 and 0.5 < thr[4]["efficiency"] <= 1.2
    # Requests: token-id prompts of the exact length, fixed output, never the same prompt twice.
    measured = [b for b in fake.bodies if b["stream"] is False]
    assert {len(b["prompt"]) for b in measured} == {16, 128, 2040}
    assert all(b["max_tokens"] == 1 and b["ignore_eos"] for b in measured)
    prompts = [tuple(b["prompt"]) for b in fake.bodies]
    assert len(set(prompts)) == len(prompts)
    assert max(max(b["prompt"]) for b in fake.bodies) < 151643
    # 1 warm-up + 3 lengths x 2 reps x 2 requests + (1 + 4) x 2 reps
    assert len(fake.bodies) == 1 + 12 + 10
    md = (out / "report.md").read_text()
    for heading in ("5.1 Prefill latency", "5.2 Decode latency", "5.3 Time to first token", "5.4 Throughput"):
        assert heading in md
    # The engine's histograms over the same requests: one TTFT per measured request, one gap per
    # later token of a streamed one; the client's TTFT includes the engine's (DELAY_S) and more.
    cross = doc["engine_cross_check"]
    assert cross["path"] == "/engine/metrics"
    sequential, concurrent = cross["phases"]
    assert sequential["engine"]["ttft_count"] == sequential["client"]["requests"] == 12
    assert sequential["engine"]["inter_token_count"] == 6 * 7
    assert sequential["engine"]["ttft_mean_s"] == pytest.approx(DELAY_S)
    assert sequential["engine"]["inter_token_mean_s"] == pytest.approx(ENGINE_GAP_S)
    assert sequential["ratio"]["ttft"] >= 1.0
    assert concurrent["engine"]["ttft_count"] == concurrent["client"]["requests"] == 10
    assert "Client against the engine's own histograms" in md and "/engine/metrics" in md
    # What it ran on, and the reference's scaling beside this run's (not measured: no 16 streams).
    env = doc["environment"]
    assert env["engine_version"] is None and env["mode"] in ("eager", "graph") and env["dtype"]
    assert env["devices"]["kind"] in ("cpu", "cuda", "npu") and env["devices"]["count"] >= 1
    assert "## Measured on" in md and "14.05×" in md
    assert doc["scaling"]["speedup"] is None and doc["scaling"]["reference"]["speedup"] == 14.05
    for png in ("latency_vs_length.png", "throughput_vs_concurrency.png"):
        data = (out / png).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000


def test_without_matplotlib_everything_but_the_plots_is_written(
    tmp_path: Path, fake: FakeEndpoint, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    # The venv a plain install makes may lack the plotting library: a run of minutes must not end
    # in a traceback; it writes the report and the JSON and says how to get the plots.
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # `import matplotlib` raises ImportError
    monkeypatch.delitem(sys.modules, "palmyra_serve.tools.plots", raising=False)
    assert bench.run(_args(tmp_path)) == 0
    out = tmp_path / "out"
    assert json.loads((out / "results.json").read_text())["errors"] == 0
    assert "5.4 Throughput" in (out / "report.md").read_text()
    assert not list(out.glob("*.png"))
    err = capsys.readouterr().err
    assert "matplotlib is not installed" in err and "pip install -e '.[tools]'" in err
    assert f"wrote {out}/report.md, results.json\n" in err


def test_the_key_comes_from_a_flag_a_file_or_the_environment(tmp_path: Path) -> None:
    p = argparse.ArgumentParser()
    bench.add_arguments(p)
    key_file = tmp_path / "key"
    key_file.write_text("from-the-file\n")
    env = {"PALMYRA_API_KEY": "palmyra-env", "OPENAI_API_KEY": "openai-env"}
    assert api_key(p.parse_args(["--api-key", "flag"]), env) == "flag"
    assert api_key(p.parse_args(["--api-key-file", str(key_file)]), env) == "from-the-file"
    assert api_key(p.parse_args([]), env) == "palmyra-env"
    assert api_key(p.parse_args([]), {"OPENAI_API_KEY": "openai-env"}) == "openai-env"
    assert api_key(p.parse_args([]), {"PALMYRA_API_KEY": ""}) is None


def test_failed_requests_are_counted_and_exit_one(tmp_path: Path, fake: FakeEndpoint) -> None:
    fake.fail_streams = True
    assert bench.run(_args(tmp_path)) == 1
    doc = json.loads((tmp_path / "out" / "results.json").read_text())
    assert doc["errors"] == 2 * 3 + 5 * 2  # every measured stream; warm-up failures are not counted
    assert "draining" in doc["first_error"]


def _doc(thr1: float, thr16: float, ttft: float) -> dict:
    s = {"p50": ttft, "p90": ttft, "p99": ttft, "n": 1}
    return {
        "schema": bench.SCHEMA,
        "meta": {"base_url": "u", "host": "h", "started_at": "t"},
        "prefill": [{"input_tokens": 128, "latency_s": s}],
        "ttft": [{"input_tokens": 128, "ttft_s": s}],
        "decode": [{"input_tokens": 128, "per_token_s": s}],
        "throughput": [
            {"concurrency": 1, "tokens_per_s": {"p50": thr1}, "efficiency": 1.0},
            {"concurrency": 16, "tokens_per_s": {"p50": thr16}, "efficiency": thr16 / thr1 / 16},
        ],
    }


def test_compare_ratios_and_direction() -> None:
    a, b = _doc(100.0, 1405.0, 0.100), _doc(100.0, 1000.0, 0.050)
    flat = report.flatten(a)
    assert flat["TTFT p50 @ 128 tok"] == (100.0, "ms", False)
    md = report.compare_markdown(a, b, "a.json", "b.json")
    rows = {line.split("|")[1].strip(): line for line in md.splitlines() if line.startswith("| ")}
    assert "0.500× (better)" in rows["TTFT p50 @ 128 tok"]  # half the latency
    assert "0.712× (worse)" in rows["throughput p50 @ 16 streams"]
    assert "1.000×" in rows["throughput p50 @ 1 streams"] and "better" not in rows["throughput p50 @ 1 streams"]


def test_compare_cli_and_rejects_foreign_json(tmp_path: Path, capsys) -> None:
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps(_doc(100.0, 1400.0, 0.1)))
    b.write_text(json.dumps(_doc(110.0, 1500.0, 0.1)))
    p = argparse.ArgumentParser()
    bench.add_arguments(p)
    assert bench.run(p.parse_args(["--compare", str(a), str(b), "--out", str(tmp_path / "cmp")])) == 0
    assert "1.100×" in (tmp_path / "cmp" / "compare.md").read_text()
    other = copy.deepcopy(_doc(1, 1, 1))
    other["schema"] = "something-else"
    b.write_text(json.dumps(other))
    assert bench.run(p.parse_args(["--compare", str(a), str(b)])) == 2
