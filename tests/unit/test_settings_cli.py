"""Settings come from PALMYRA_* variables; CLI flags override them; every subcommand has --help."""

from __future__ import annotations

import subprocess
import sys

import pytest

from palmyra_serve.cli import _settings, build_parser
from palmyra_serve.settings import Settings, split_keys

SUBCOMMANDS = ("up", "engine", "sidecar", "tenants", "make-model", "fetch-model", "validate", "golden", "bench")


def test_env_prefix_and_defaults(monkeypatch):
    monkeypatch.setenv("PALMYRA_ENGINE_URL", "http://engine:8000")
    monkeypatch.setenv("PALMYRA_MAX_IN_FLIGHT", "7")
    s = Settings()
    assert s.engine_url == "http://engine:8000" and s.max_in_flight == 7
    assert s.port == 8080 and s.engine_port == 8000 and s.served_model_name == "palmyra-mini"
    assert s.dtype == "bfloat16" and s.max_model_len == 8192


def test_an_empty_variable_is_unset(monkeypatch):
    # Compose hands every setting over as ${PALMYRA_X:-}: one the env file leaves out arrives empty
    # and must mean "the default", not a parse error or an empty value.
    for name in ("MAX_MODEL_LEN", "ALLOW_STAND_IN", "ADMISSION_MAX_LIMIT", "API_KEYS", "ENFORCE_EAGER", "PLATFORM"):
        monkeypatch.setenv(f"PALMYRA_{name}", "")
    s = Settings()
    assert s.max_model_len == 8192 and s.allow_stand_in is None and s.admission_max_limit is None
    assert s.api_keys == [] and s.enforce_eager is False and s.platform == "auto"


def test_flags_override_environment(monkeypatch):
    monkeypatch.setenv("PALMYRA_PORT", "9999")
    monkeypatch.setenv("PALMYRA_HOST", "10.0.0.1")
    args = build_parser().parse_args(["sidecar", "--port", "8181"])
    s = _settings(args)
    assert s.port == 8181  # the flag wins
    assert s.host == "10.0.0.1"  # no flag: the environment stays


def test_engine_port_flag_maps_to_engine_port():
    s = _settings(build_parser().parse_args(["engine", "--port", "8001", "--dtype", "float32"]))
    assert s.engine_port == 8001 and s.dtype == "float32"


def test_api_keys_from_env_list_and_file(monkeypatch, tmp_path):
    f = tmp_path / "keys"
    # One format for both (k8s/README.md's `kubectl create secret` writes a comma list to the file).
    f.write_text("# comment, not keys\n\nk3\n  k4  , k5,\n")
    monkeypatch.setenv("PALMYRA_API_KEYS", " k1, ,k2 ")
    monkeypatch.setenv("PALMYRA_API_KEYS_FILE", str(f))
    settings = Settings()
    assert settings.api_keys == ["k1", "k2"]
    assert settings.api_keys_file is not None and split_keys(settings.api_keys_file.read_text()) == ["k3", "k4", "k5"]


def test_invalid_setting_is_rejected(monkeypatch):
    monkeypatch.setenv("PALMYRA_PLATFORM", "tpu")
    with pytest.raises(ValueError):
        Settings()


@pytest.mark.parametrize("sub", SUBCOMMANDS)
def test_every_subcommand_has_help(sub):
    out = subprocess.run(
        [sys.executable, "-m", "palmyra_serve.cli", sub, "--help"], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert "usage: palmyra-serve " + sub in out.stdout
    if sub in ("engine", "sidecar"):
        assert "--host" in out.stdout and "--port" in out.stdout


def test_every_command_says_what_it_does_with_examples_and_names_each_flags_variable():
    import argparse

    parser = build_parser()
    assert parser.description and "palmyra-mini" in parser.description and "thin subcommand" not in parser.description
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    assert set(sub.choices) == set(SUBCOMMANDS) | {"doctor"}
    for name, command in sub.choices.items():
        assert command.description and len(command.description.split()) >= 8, name
        assert (
            command.epilog and command.epilog.startswith("examples:\n  ") and f"palmyra-serve {name}" in command.epilog
        ), name
        if name in ("validate", "golden", "bench"):  # tools: their flags are not settings
            continue
        for action in command._actions:
            if action.dest not in Settings.model_fields:
                continue
            variable = f"PALMYRA_{action.dest.upper()}"
            assert action.help and variable in action.help, (name, action.option_strings)
            # More than the variable's name: what the flag does.
            assert len(action.help.replace(variable, "").split()) >= 3, (name, action.option_strings, action.help)
