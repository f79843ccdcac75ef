"""The engine starts only on the weights its golden reference was recorded for; doctor says the same.

Checkpoints here are directories with a `model.safetensors` of a few bytes: the digest reads bytes,
not tensors, so another seed's weights are simply other bytes under the same name."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from pathlib import Path

import pytest

from palmyra_serve.doctor.command import golden_finding
from palmyra_serve.engine import golden_gate, launcher
from palmyra_serve.model.digest import compare_with_golden, weights_digest
from palmyra_serve.settings import Settings


def checkpoint(root: Path, weights: bytes) -> Path:
    root.mkdir(parents=True)
    (root / "config.json").write_text("{}")
    (root / "model.safetensors").write_bytes(weights)
    return root


def golden_for(model_dir: Path, out: Path) -> Path:
    """The part of a golden file the start reads: what `palmyra-serve golden` writes as `weights`."""
    out.write_text(json.dumps({"format": "palmyra-golden/1", "weights": weights_digest(model_dir), "prompts": []}))
    return out


@pytest.fixture
def seeds(tmp_path: Path) -> tuple[Path, Path, Path]:
    """Seed 0's checkpoint, its golden file, and seed 1's checkpoint (same name, other bytes)."""
    seed0 = checkpoint(tmp_path / "seed0", b"weights of seed 0")
    seed1 = checkpoint(tmp_path / "seed1", b"weights of seed 1")
    return seed0, golden_for(seed0, tmp_path / "golden.json"), seed1


def test_the_weights_the_reference_was_recorded_for_start(seeds, caplog):
    seed0, golden, _ = seeds
    caplog.set_level(logging.INFO)
    assert golden_gate.refusal(Settings(golden_file=golden), str(seed0)) is None
    assert weights_digest(seed0) in caplog.text and "are those" in caplog.text


def test_another_seeds_weights_are_refused_with_both_digests(seeds):
    seed0, golden, seed1 = seeds
    reason = golden_gate.refusal(Settings(golden_file=golden), str(seed1))
    assert reason is not None
    assert weights_digest(seed1) in reason and weights_digest(seed0) in reason
    assert weights_digest(seed0) != weights_digest(seed1)
    assert "PALMYRA_GOLDEN_DIGEST=warn" in reason and "palmyra-serve golden" in reason


def test_warn_mode_starts_on_other_weights_and_says_so(seeds, caplog):
    _, golden, seed1 = seeds
    caplog.set_level(logging.INFO)
    assert golden_gate.admit(Settings(golden_file=golden, golden_digest="warn"), str(seed1))
    warned = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warned) == 1 and weights_digest(seed1) in warned[0].getMessage()


def test_without_a_golden_file_nothing_is_hashed(tmp_path):
    assert golden_gate.refusal(Settings(), str(tmp_path / "not-even-there")) is None


@pytest.mark.parametrize(
    ("golden_text", "said"),
    [("not json", "cannot read"), (json.dumps({"format": "palmyra-golden/1"}), "names no weights digest")],
)
def test_a_golden_file_that_names_no_digest_is_refused(seeds, golden_text, said):
    seed0, golden, _ = seeds
    golden.write_text(golden_text)
    reason = golden_gate.refusal(Settings(golden_file=golden), str(seed0))
    assert reason is not None and said in reason


def test_weights_that_cannot_be_hashed_are_refused_naming_the_recorded_digest(seeds):
    seed0, golden, _ = seeds
    # A hub id passed through with --no-fetch: vLLM would download whatever the hub holds now.
    reason = golden_gate.refusal(Settings(golden_file=golden), "Writer/palmyra-mini")
    assert reason is not None and "cannot hash" in reason and weights_digest(seed0) in reason


def test_the_engine_command_refuses_before_running_vllm(seeds, monkeypatch):
    _, golden, seed1 = seeds
    from palmyra_serve.cli import main

    monkeypatch.setattr(launcher, "supervise", lambda argv, env: pytest.fail("vLLM was started"))
    monkeypatch.setenv("PALMYRA_GOLDEN_FILE", str(golden))
    assert main(["engine", "--no-fetch", "--platform", "cpu", "--model", str(seed1)]) == 2


def test_the_engine_exits_2_before_starting_vllm(seeds, tmp_path):
    """The real CLI as the containers and `up` run it: status 2, the refusal in its output where `up`
    finds it (`refusing to start: ...`, up's engine.log holds stdout and stderr), no vLLM started."""
    _, golden, seed1 = seeds
    env = {"PATH": "/usr/bin:/bin", "PALMYRA_GOLDEN_FILE": str(golden), "PALMYRA_ENGINE_API_KEY": "k" * 32}
    done = subprocess.run(
        [sys.executable, "-m", "palmyra_serve.cli", "engine", "--no-fetch", "--platform", "cpu", "--model", str(seed1)],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        cwd=tmp_path,
    )
    assert done.returncode == 2, done.stdout + done.stderr
    from palmyra_serve.up import refusal_message

    said = refusal_message(done.stdout + done.stderr)
    assert said.count("sha256:") == 2 and "refusing to start" in said
    assert "starting vLLM" not in done.stdout + done.stderr


def test_doctor_passes_warns_or_fails_with_both_digests(seeds):
    seed0, golden, seed1 = seeds
    assert golden_finding(Settings()).level == "info"
    ok = golden_finding(Settings(golden_file=golden, model=str(seed0)))
    assert ok.level == "ok" and weights_digest(seed0) in ok.message
    refused = golden_finding(Settings(golden_file=golden, model=str(seed1)))
    warned = golden_finding(Settings(golden_file=golden, model=str(seed1), golden_digest="warn"))
    assert (refused.level, warned.level) == ("stop", "warn")
    for found in (refused, warned):
        assert weights_digest(seed0) in found.message and weights_digest(seed1) in found.message


def test_the_comparison_reports_its_hashing_time(seeds):
    seed0, golden, _ = seeds
    match = compare_with_golden(golden, seed0)
    assert match.matches and 0 <= match.seconds < 5
