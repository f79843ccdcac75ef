"""Model resolution: local weights used as they are; an unreachable hub falls back loudly."""

from __future__ import annotations

import pytest

from palmyra_serve.model import resolve, stand_in
from palmyra_serve.settings import Settings

UNREACHABLE = "http://127.0.0.1:9"  # discard port: nothing answers


def test_local_checkpoint_is_used_as_is(tmp_path):
    ckpt = stand_in.build(tmp_path / "ckpt", "tiny")
    assert resolve.resolve(Settings(model=str(ckpt), model_dir=tmp_path / "unused")) == ckpt
    assert not (tmp_path / "unused").exists()


def test_directory_without_checkpoint_is_an_error(tmp_path):
    with pytest.raises(resolve.ModelUnavailable, match="holds no checkpoint"):
        resolve.resolve(Settings(model=str(tmp_path)))


def test_unreachable_hub_builds_the_stand_in_with_a_loud_warning(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("HF_ENDPOINT", UNREACHABLE)
    out = resolve.resolve(Settings(model_dir=tmp_path / "m"))
    assert stand_in.marker(out)["random_weights"] is True
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "RANDOM-WEIGHT stand-in" in err and UNREACHABLE in err


def test_no_silent_substitution_when_stand_in_is_disallowed(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_ENDPOINT", UNREACHABLE)
    with pytest.raises(resolve.ModelUnavailable, match="not reachable"):
        resolve.resolve(Settings(model_dir=tmp_path / "m", allow_stand_in=False))
    with pytest.raises(resolve.ModelUnavailable, match="not reachable"):
        resolve.resolve(Settings(model_dir=tmp_path / "m", model_source="huggingface"))


def test_weights_already_present_are_not_fetched_again(tmp_path, monkeypatch):
    dest = stand_in.build(tmp_path / "m", "tiny")
    monkeypatch.setattr(resolve, "reachable", lambda *_: pytest.fail("must not probe the hub"))
    assert resolve.resolve(Settings(model_dir=dest)) == dest


def test_fetch_model_copies_a_local_checkpoint_into_its_destination(tmp_path):
    from palmyra_serve.cli import main

    src = stand_in.build(tmp_path / "src", "tiny")
    assert main(["fetch-model", "--model", str(src), "--dest", str(tmp_path / "vol")]) == 0
    assert resolve.is_checkpoint(tmp_path / "vol") and stand_in.marker(tmp_path / "vol") == stand_in.marker(src)
