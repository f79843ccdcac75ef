"""`palmyra-serve doctor` as an operator runs it, on stand-in host layouts (a passing host, a failing
one, a CPU host), and `palmyra-serve engine` on Ascend refusing to start vLLM when doctor finds a
certain failure. Real processes: the console script's module, its exit status and its output."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from pathlib import Path

from tests.helpers import ascend_host
from tests.helpers.ascend_host import Layout

CLI = [sys.executable, "-m", "palmyra_serve.cli"]
# This environment without its PALMYRA_* settings and Ascend variables: the host's own facts only.
BASE_ENV = {k: v for k, v in os.environ.items() if not k.startswith(("PALMYRA_", "ASCEND_", "NPU_"))}


def doctor(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CLI, "doctor", *args], capture_output=True, text=True, timeout=60, env={**BASE_ENV, **(env or {})}
    )


def test_a_passing_host_prints_every_check_and_the_ready_verdict(tmp_path):
    root = ascend_host.build(tmp_path / "host", Layout())
    done = doctor("--root", str(root))
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    # What this machine adds to the stand-in: its architecture (x86 hosts are warned of vllm-ascend
    # v0.18.0's known issue). /dev/shm and the user's passwd entry are the engine container's, not
    # a mounted root's: info here.
    machine_warnings = []
    if platform.machine() in ("x86_64", "amd64"):
        machine_warnings.append("CANN on x86")
    warned = [line.split("]", 1)[1].split(":", 1)[0].strip() for line in lines if line.startswith("[WARN]")]
    assert warned == machine_warnings, done.stdout
    expected = (
        f"verdict: the engine can start; {len(warned)} warning(s) above may still stop it"
        if warned
        else "verdict: ready for the Ascend engine"
    )
    assert lines[-1] == expected
    checks = ("driver", "driver libraries", "npu-smi", "devices", "HwHiAiUser", "visible devices")
    for check in (*checks, "NPU state", "HBM", "NPU in use", "vNPU"):
        assert any(line.startswith("[ok  ] " + check + ":") for line in lines), (check, done.stdout)
    for check in ("user account", "/dev/shm"):
        assert any(line.startswith("[info] " + check + ": judged where the engine runs") for line in lines)


def test_a_failing_host_exits_1_with_each_fix(tmp_path):
    root = ascend_host.build(tmp_path / "host", Layout(npus=(), driver_version="24.1.rc1"))
    done = doctor("--root", str(root), "--json")
    assert done.returncode == 1, done.stdout + done.stderr
    report = json.loads(done.stdout)
    levels = {f["check"]: f["level"] for f in report["findings"]}
    assert levels["devices"] == "stop" and levels["driver"] == "warn"
    assert all(f["fix"] for f in report["findings"] if f["level"] in ("warn", "stop"))
    assert report["exit_status"] == 1 and report["verdict"].startswith("verdict: the engine will not start here")


def test_a_cpu_host_is_not_an_ascend_host_unless_ascend_is_asked_for(tmp_path):
    (tmp_path / "cpu").mkdir()
    done = doctor("--root", str(tmp_path / "cpu"))
    assert (
        done.returncode == 0
        and done.stdout.splitlines()[-1] == "verdict: not an Ascend host; the CPU engine needs none of this"
    )
    asked = doctor("--root", str(tmp_path / "cpu"), "--platform", "ascend")
    assert asked.returncode == 1 and "[STOP] driver: no Ascend driver here" in asked.stdout


def test_the_engine_on_ascend_refuses_to_start_vllm_when_doctor_finds_a_certain_failure(tmp_path: Path):
    # This machine has no Ascend driver: as an Ascend engine it must stop before vLLM, saying why.
    env = {**BASE_ENV, "PALMYRA_ENGINE_API_KEY": "doctor-test-engine-key-0123456789"}
    argv = [*CLI, "engine", "--platform", "ascend", "--no-fetch", "--model", str(tmp_path)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, env=env)
    # 2, a refused start like a refused argument: `palmyra-serve up` stops instead of restarting it
    assert done.returncode == 2, done.stdout + done.stderr
    logs = done.stdout + done.stderr  # JSON log lines
    assert "no Ascend driver here" in logs and "doctor: refusing to start" in logs
    from palmyra_serve.up import refusal_message

    assert refusal_message(logs).startswith('{"ts"') and "refusing to start" in refusal_message(logs)
    assert "starting vLLM (ascend)" not in logs
    # --print-command starts nothing, so it runs no checks.
    printed = subprocess.run([*argv, "--print-command"], capture_output=True, text=True, timeout=60, env=env)
    assert printed.returncode == 0 and "doctor" not in printed.stdout + printed.stderr


def test_only_judges_the_named_checks(tmp_path):
    # Compose's npu-check runs `--only driver` from the sidecar's image: a host with no Ascend driver
    # stops, naming the CPU path; a driver host passes even where other checks, judged from a
    # container that is not the engine's, would fail (here: no device node at all).
    cpu_host = ascend_host.build(tmp_path / "cpu", Layout(npus=(), control=(), driver_version=None, npu_smi_at=None))
    stopped = doctor("--root", str(cpu_host), "--platform", "ascend", "--no-npu-smi", "--only", "driver")
    assert stopped.returncode == 1, stopped.stdout + stopped.stderr
    assert stopped.stdout.startswith("[STOP] driver: no Ascend driver here") and "compose/cpu.env" in stopped.stdout
    assert "devices:" not in stopped.stdout
    driver_only = ascend_host.build(tmp_path / "npu", Layout(npus=()))
    passed = doctor("--root", str(driver_only), "--platform", "ascend", "--no-npu-smi", "--only", "driver")
    assert passed.returncode == 0 and passed.stdout.startswith("[ok  ] driver:"), passed.stdout + passed.stderr
    unknown = doctor("--root", str(driver_only), "--only", "drivers")
    assert unknown.returncode == 2 and "no check named drivers" in unknown.stdout
