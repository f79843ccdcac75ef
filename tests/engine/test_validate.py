"""validate against the real vLLM CPU engine: agrees in float32, and proves it can fail.

Both run on the tier's shared engine, which serves the tiny stand-in in float32. validate judges
the disagreement between what the engine generates and what the fp32 reference generates from
--model-dir. To make it fail, the reference is given a copy whose layer-1 MLP output projection
carries large noise (a stand-in for a broken kernel or a mis-loaded layer): the same disagreement
as an engine serving that copy against the original, seen from the other side, without starting
an engine of its own (a minute or more on two cores).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

PERTURBED_TENSOR = "model.layers.1.mlp.down_proj.weight"


def _validate(url: str, api_key: str | None, model_dir: Path, out: Path, *extra: str) -> subprocess.CompletedProcess:
    argv = [
        sys.executable,
        "-m",
        "palmyra_serve.cli",
        "validate",
        "--base-url",
        url,
        "--model-dir",
        str(model_dir),
        "--out",
        str(out),
        *extra,
    ]
    if api_key:
        argv += ["--api-key", api_key]
    return subprocess.run(argv, capture_output=True, text=True, timeout=600)


def perturb(src: Path, dst: Path, tensor: str = PERTURBED_TENSOR, std: float = 1.0, seed: int = 1234) -> Path:
    """A copy of checkpoint src with N(0, std) noise added to one tensor (weights themselves are ~0.02)."""
    import torch
    from safetensors.torch import load_file, save_file

    shutil.copytree(src, dst)
    path = dst / "model.safetensors"
    tensors = load_file(str(path))
    w = tensors[tensor]
    noise = torch.randn(w.shape, generator=torch.Generator().manual_seed(seed)) * std
    tensors[tensor] = (w.float() + noise).to(w.dtype)
    save_file(tensors, str(path), metadata={"format": "pt"})
    return dst


def test_float32_engine_agrees_with_the_fp32_reference(tiny_model_dir: Path, engine_server, tmp_path: Path) -> None:
    eng = engine_server
    quick = _validate(eng.url, eng.api_key, tiny_model_dir, tmp_path / "quick", "--quick")
    full = _validate(eng.url, eng.api_key, tiny_model_dir, tmp_path / "full")
    assert quick.returncode == 0, quick.stdout + quick.stderr
    assert json.loads((tmp_path / "quick" / "quick.json").read_text())["ok"] is True
    assert full.returncode == 0, full.stdout + full.stderr
    doc = json.loads((tmp_path / "full" / "results.json").read_text())
    s = doc["summary"]
    assert s["prompts"] == 5
    assert s["first_token_agreement"] == 1.0
    assert s["mean_match_rate"] >= 0.9
    assert s["verdicts"]["suspicious"] == 0
    assert doc["stand_in"]["random_weights"] is True
    assert all(len(p["reference_tokens"]) == 20 for p in doc["prompts"])
    assert "random-weight stand-in" in (tmp_path / "full" / "report.md").read_text()


def test_perturbed_weights_are_called_suspicious(tiny_model_dir: Path, engine_server, tmp_path: Path) -> None:
    broken = perturb(tiny_model_dir, tmp_path / "perturbed")
    res = _validate(engine_server.url, engine_server.api_key, broken, tmp_path / "out")
    assert res.returncode == 1, res.stdout + res.stderr
    doc = json.loads((tmp_path / "out" / "results.json").read_text())
    assert doc["summary"]["suspicious"] is True
    suspicious = [p for p in doc["prompts"] if p["verdict"] == "suspicious"]
    assert len(suspicious) >= 3, [p["reason"] for p in doc["prompts"]]
    # A clear fault: the reference prefers its own token by far more than the near-tie threshold.
    for p in suspicious:
        d = p["divergence"]
        assert d["ref_flip_margin"] > doc["near_tie_threshold_std"] * d["ref_logit_std"]
    assert "Result: SUSPICIOUS" in (tmp_path / "out" / "report.md").read_text()
