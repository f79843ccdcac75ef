"""The engine launcher's argv and environment per platform (the command the containers run)."""

from __future__ import annotations

import shlex
import subprocess
import sys

import pytest

from palmyra_serve.engine import launcher
from palmyra_serve.engine.launcher import EngineCommand, build_command
from palmyra_serve.settings import Settings
from tests.helpers.paths import DATA


def flag(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def test_cpu_command_carries_the_seed_flags_and_cpu_env(monkeypatch):
    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE", raising=False)
    monkeypatch.delenv("VLLM_USE_AOT_COMPILE", raising=False)
    cmd = build_command(Settings(engine_api_key="secret", cpu_kvcache_gib=3), "/models/palmyra-mini", "cpu")
    a = cmd.argv
    assert a[1:3] == ["-m", "vllm.entrypoints.openai.api_server"]
    assert flag(a, "--model") == "/models/palmyra-mini"
    assert flag(a, "--served-model-name") == "palmyra-mini"
    assert flag(a, "--dtype") == "bfloat16" and flag(a, "--max-model-len") == "8192"
    assert "--enable-chunked-prefill" in a and flag(a, "--port") == "8000"
    assert "--gpu-memory-utilization" not in a
    # Qwen2 needs no remote code; the key goes by environment, never on argv (ps shows argv).
    assert "--trust-remote-code" not in a
    assert "--api-key" not in a and "secret" not in " ".join(a)
    # Without AOT compile: its artifact does not load back on vLLM-CPU 0.32 (the launcher's comment).
    assert cmd.env == {"VLLM_CPU_KVCACHE_SPACE": "3", "VLLM_API_KEY": "secret", "VLLM_USE_AOT_COMPILE": "0"}
    printed = cmd.redacted()
    assert "secret" not in printed and printed.startswith("'VLLM_API_KEY=***' VLLM_CPU_KVCACHE_SPACE=3 ")


def test_cpu_aot_compile_stays_the_operators_choice(monkeypatch):
    monkeypatch.setenv("VLLM_USE_AOT_COMPILE", "1")
    assert build_command(Settings(), "/m", "cpu").env["VLLM_USE_AOT_COMPILE"] == "1"
    assert "VLLM_USE_AOT_COMPILE" not in build_command(Settings(), "/m", "cuda").env


def test_ascend_command_sets_npu_env_and_memory_share(monkeypatch):
    monkeypatch.delenv("PYTORCH_NPU_ALLOC_CONF", raising=False)
    cmd = build_command(Settings(npu_devices="2"), "/m", "ascend")
    assert flag(cmd.argv, "--gpu-memory-utilization") == "0.85"
    assert cmd.env == {"ASCEND_RT_VISIBLE_DEVICES": "2"}
    assert "--api-key" not in cmd.argv


def test_the_npu_allocator_setting_is_the_operators_or_vllm_ascends_never_the_launchers(monkeypatch):
    # vllm-ascend adds expandable_segments:True itself, outside sleep mode, whose allocator asserts
    # it is absent: a launcher default would break sleep mode (vendored upstream files, below).
    monkeypatch.setenv("PYTORCH_NPU_ALLOC_CONF", "max_split_size_mb:256")
    assert "PYTORCH_NPU_ALLOC_CONF" not in build_command(Settings(), "/m", "ascend").env  # passes through as is
    platform_py = (DATA / "ascend-host" / "vllm-ascend-v0.18.0-platform.py.txt").read_text()
    camem_py = (DATA / "ascend-host" / "vllm-ascend-v0.18.0-device_allocator_camem.py.txt").read_text()
    assert "if model_config and not model_config.enable_sleep_mode:" in platform_py
    assert 'os.getenv("PYTORCH_NPU_ALLOC_CONF", "expandable_segments:True")' in platform_py
    assert 'assert "expandable_segments:True" not in conf' in camem_py


def test_drain_and_shutdown_timeout_agree_and_extra_args_append():
    cmd = build_command(Settings(drain_timeout_s=45, engine_extra_args="--seed 7 --enforce-eager"), "/m", "cuda")
    assert flag(cmd.argv, "--shutdown-timeout") == "45"
    assert cmd.argv[-3:] == ["--seed", "7", "--enforce-eager"]


def test_print_command_prints_env_then_argv_without_the_key(capsys, monkeypatch, tmp_path):
    from palmyra_serve.cli import main

    monkeypatch.setenv("PALMYRA_ENGINE_API_KEY", "topsecret")
    monkeypatch.delenv("PYTORCH_NPU_ALLOC_CONF", raising=False)
    assert main(["engine", "--no-fetch", "--platform", "ascend", "--model", str(tmp_path), "--print-command"]) == 0
    out = capsys.readouterr().out
    assert "topsecret" not in out and out.count("\n") == 1
    words = shlex.split(out)
    assert words[:1] == ["VLLM_API_KEY=***"]
    assert words[2:4] == ["-m", "vllm.entrypoints.openai.api_server"] and flag(words, "--model") == str(tmp_path)


def test_a_missing_tmpdir_is_created_not_silently_replaced_by_tmp(tmp_path):
    from palmyra_serve.engine.launcher import ensure_tmpdir

    wanted = tmp_path / "cache" / "tmp"
    ensure_tmpdir({"TMPDIR": str(wanted)})
    assert wanted.is_dir()
    ensure_tmpdir({})  # no TMPDIR: nothing to do


@pytest.mark.parametrize("given", ["PALMYRA_ENGINE_API_KEY", "VLLM_API_KEY"])
def test_a_placeholder_engine_key_is_refused_before_anything_starts(tmp_path, monkeypatch, caplog, given):
    """The compose/*.env files once shipped change-me-engine-key: the engine refuses it (and any
    key the sidecar's placeholder rule refuses), whether it comes from PALMYRA_ENGINE_API_KEY
    (the launcher sets VLLM_API_KEY from it) or as VLLM_API_KEY directly (Compose, Kubernetes)."""
    # The command runs plainly: supervising it (a subreaper reaping every child) is for a launcher
    # that is a process of its own (tests/unit/test_engine_leftovers.py), not for pytest's.
    monkeypatch.setattr(launcher, "supervise", lambda argv, env: subprocess.run(argv, env=env).returncode)
    monkeypatch.delenv("VLLM_API_KEY", raising=False)
    marker = tmp_path / "started"

    def command(key: str) -> EngineCommand:
        touch = EngineCommand(argv=[sys.executable, "-c", f"open({str(marker)!r}, 'w')"])
        if given == "VLLM_API_KEY":
            monkeypatch.setenv("VLLM_API_KEY", key)
        else:
            touch.env = build_command(Settings(engine_api_key=key), "/m", "cpu").env
        return touch

    assert launcher.run(command("change-me-engine-key")) == 2
    assert not marker.exists()
    assert "refusing to start" in caplog.text and "openssl rand -hex 32" in caplog.text
    assert "change-me-engine-key" not in caplog.text  # the key itself is never logged
    assert launcher.run(command("a-real-engine-key-123")) == 0 and marker.exists()


def test_priority_scheduling_asks_the_engine_for_the_priority_policy():
    """vLLM's default policy (fcfs) accepts a request's priority and ignores it: the launcher asks
    for the priority policy exactly when the sidecar will set priorities."""
    plain = build_command(Settings(engine_api_key="secret"), "/m", "cpu").argv
    assert "--scheduling-policy" not in plain
    with_priority = build_command(Settings(engine_api_key="secret", priority_scheduling=True), "/m", "cpu").argv
    assert flag(with_priority, "--scheduling-policy") == "priority"


def test_tracing_points_the_engines_own_tracing_at_the_same_endpoint_over_http():
    """vLLM exports over gRPC unless told otherwise; the setting is an OTLP/HTTP URL, so the launcher
    says http/protobuf, and names the engine's service. Off, the engine gets none of it."""
    url = "http://collector:4318/v1/traces"
    plain = build_command(Settings(engine_api_key="secret"), "/m", "cpu")
    assert "--otlp-traces-endpoint" not in plain.argv
    assert not any(k.startswith("OTEL_") for k in plain.env)
    traced = build_command(Settings(engine_api_key="secret", otlp_traces_endpoint=url), "/m", "ascend")
    assert flag(traced.argv, "--otlp-traces-endpoint") == url
    assert traced.env["OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"] == "http/protobuf"
    assert traced.env["OTEL_SERVICE_NAME"] == "palmyra-engine"
