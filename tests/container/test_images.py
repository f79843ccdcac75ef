"""The built images, run for real: the CPU engine serving the tiny stand-in from a mounted model
directory, the sidecar in front of it, both non-root, their HEALTHCHECKs run by podman, real
tokens through the sidecar. Everything on 127.0.0.1 (host networking)."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.container.podman_helpers import (
    PODMAN_DIR,
    PROBE,
    BuiltImages,
    completion,
    http,
    podman,
    port_is_free,
    probe_cmd,
    wait_ready,
)
from tests.helpers.procs import free_port

ENGINE_KEY = "container-test-engine-key"
READY_TIMEOUT_S = 900  # engine start (compile) on 2 cores, then warmup


@dataclass(frozen=True)
class Pair:
    engine: str
    sidecar: str
    engine_port: int
    sidecar_port: int

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.sidecar_port}"


def _remove(*names: str) -> None:
    for name in names:
        podman("rm", "-f", "-t", "40", name, check=False, timeout=120)


@pytest.fixture(scope="module")
def running_pair(built_images: BuiltImages, tiny_model_dir: Path) -> Iterator[Pair]:
    # The images' HEALTHCHECKs probe the default ports (8000, 8080): use them when free, so
    # `podman healthcheck run` checks the probes exactly as shipped.
    engine_port = 8000 if port_is_free(8000) else free_port()
    sidecar_port = 8080 if port_is_free(8080) else free_port()
    pair = Pair("palmyra-ct-engine", "palmyra-ct-sidecar", engine_port, sidecar_port)
    _remove(pair.engine, pair.sidecar)
    engine_args = [
        "run",
        "-d",
        "--name",
        pair.engine,
        "--network",
        "host",
        "--shm-size",
        "1g",
        "-v",
        f"{tiny_model_dir}:/models/palmyra-mini:ro",
        # Compile cache kept between sessions (a named volume, filled with the image's
        # /cache and its uid 1000 ownership on first use): a warm start takes half the time.
        "-v",
        "palmyra-ct-cache:/cache",
        "-e",
        "PALMYRA_MODEL=/models/palmyra-mini",
        "-e",
        "PALMYRA_MODEL_SOURCE=local",
        "-e",
        "PALMYRA_MAX_MODEL_LEN=2048",
        "-e",
        "PALMYRA_CPU_KVCACHE_GIB=1",
        "-e",
        f"PALMYRA_ENGINE_API_KEY={ENGINE_KEY}",
        # Nothing may leave 127.0.0.1: a hub lookup would hit a refused local port.
        "-e",
        "HF_ENDPOINT=http://127.0.0.1:9",
        "-e",
        "HF_HUB_OFFLINE=1",
    ]
    if engine_port != 8000:
        engine_args += ["--health-cmd", probe_cmd(f"http://127.0.0.1:{engine_port}/health")]
    podman(
        *engine_args, built_images.engine, "palmyra-serve", "engine", "--host", "127.0.0.1", "--port", str(engine_port)
    )
    sidecar_args = [
        "run",
        "-d",
        "--name",
        pair.sidecar,
        "--network",
        "host",
        "-e",
        f"PALMYRA_ENGINE_URL=http://127.0.0.1:{engine_port}",
        "-e",
        f"PALMYRA_ENGINE_API_KEY={ENGINE_KEY}",
        "-e",
        "PALMYRA_AUTH_DISABLED=true",  # auth fails closed; this pair serves without client keys
    ]
    if sidecar_port != 8080:
        sidecar_args += ["--health-cmd", probe_cmd(f"http://127.0.0.1:{sidecar_port}/health/sidecar")]
    podman(*sidecar_args, built_images.sidecar, "--host", "127.0.0.1", "--port", str(sidecar_port))
    try:
        wait_ready(pair.url, [pair.engine, pair.sidecar], READY_TIMEOUT_S)
        yield pair
    finally:
        _remove(pair.sidecar, pair.engine)


def test_image_sizes_recorded(built_images: BuiltImages) -> None:
    engine, sidecar = built_images.sizes[built_images.engine], built_images.sizes[built_images.sidecar]
    print(f"\nimage sizes: engine-cpu {engine / 1e9:.2f} GB, sidecar {sidecar / 1e9:.2f} GB")
    assert sidecar < 600e6, "the sidecar image should stay small (no torch)"
    assert engine > 1e9 > sidecar


def test_sidecar_image_has_no_torch(built_images: BuiltImages) -> None:
    script = (
        "import importlib.util as u, sys\n"
        "found = [m for m in ('torch', 'vllm', 'transformers', 'numpy') if u.find_spec(m)]\n"
        "print(found); sys.exit(1 if found else 0)\n"
    )
    result = podman(
        "run", "--rm", "--network", "host", "--entrypoint", "python3", built_images.sidecar, "-c", script, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr
    # ...while the engine image has both (the same check would pass on an empty image).
    engine = podman(
        "run",
        "--rm",
        "--network",
        "host",
        "--entrypoint",
        "python3",
        built_images.engine,
        "-c",
        "import importlib.util as u; print(bool(u.find_spec('torch') and u.find_spec('vllm')))",
    )
    assert engine.stdout.strip() == "True"


def test_engine_image_user_and_layout(built_images: BuiltImages) -> None:
    result = podman(
        "run",
        "--rm",
        "--network",
        "host",
        built_images.engine,
        "sh",
        "-c",
        "id -u; id -g; id -un; getent passwd 1000 | cut -d: -f1,6; stat -c %u /models /cache/vllm; "
        "test -w /cache/vllm && echo writable; command -v palmyra-serve",
    )
    lines = result.stdout.split()
    assert lines[:4] == ["1000", "1000", "HwHiAiUser", "HwHiAiUser:/home/HwHiAiUser"]
    assert lines[4:6] == ["1000", "1000"] and "writable" in lines
    assert lines[-1] == "/opt/venv/bin/palmyra-serve"


def test_build_reuses_cache_when_nothing_changed(built_images: BuiltImages) -> None:
    # The session built both images just now; a rebuild must come from podman's layer cache.
    started = time.monotonic()
    result = subprocess.run(
        [str(PODMAN_DIR / "build-image.sh"), "sidecar", built_images.sidecar],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Using cache" in result.stdout + result.stderr
    assert time.monotonic() - started < 120


def test_both_containers_run_as_non_root(running_pair: Pair) -> None:
    engine = podman("exec", running_pair.engine, "id", "-u").stdout.strip()
    sidecar = podman("exec", running_pair.sidecar, "id", "-u").stdout.strip()
    assert engine == "1000"
    assert sidecar.isdigit() and sidecar != "0"
    assert podman("exec", running_pair.engine, "id", "-un").stdout.strip() == "HwHiAiUser"


def test_ready_reports_warmed_engine(running_pair: Pair) -> None:
    status, body = http("GET", f"{running_pair.url}/ready")
    assert status == 200 and body["ready"] is True and body["phase"] == "ready"
    status, body = http("GET", f"{running_pair.url}/health")
    assert status == 200 and body["status"] == "ok"


def test_completion_through_the_sidecar_returns_tokens(running_pair: Pair) -> None:
    status, body = completion(running_pair.url, max_tokens=8)
    assert status == 200, body
    assert body["usage"]["completion_tokens"] == 8
    assert isinstance(body["choices"][0]["text"], str) and body["choices"][0]["text"]


def test_engine_v1_needs_the_engine_key(running_pair: Pair) -> None:
    status, _ = http("GET", f"http://127.0.0.1:{running_pair.engine_port}/v1/models")
    assert status == 401
    status, _ = http("GET", f"http://127.0.0.1:{running_pair.engine_port}/health")
    assert status == 200


@pytest.mark.parametrize("which", ["engine", "sidecar"])
def test_podman_healthcheck_reports_healthy(running_pair: Pair, which: str) -> None:
    name = getattr(running_pair, which)
    result = podman("healthcheck", "run", name, check=False, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "unhealthy" not in result.stdout


def test_healthcheck_declared_in_images(built_images: BuiltImages) -> None:
    # --format docker keeps HEALTHCHECK; without it podman drops it silently.
    inspect = json.loads(podman("image", "inspect", built_images.sidecar).stdout)[0]
    check = inspect.get("Healthcheck") or (inspect.get("Config") or {}).get("Healthcheck") or {}
    assert check.get("Test") == ["CMD", "python3", PROBE, "http://127.0.0.1:8080/health/sidecar", "--timeout", "3"], (
        inspect
    )


def test_unhealthy_when_engine_is_gone(running_pair: Pair) -> None:
    # Runs last in this module: stops the engine and expects the engine probe to fail. The
    # sidecar's own liveness stays healthy (it must not be restarted for the engine's fault).
    podman("stop", "-t", "40", running_pair.engine, timeout=120)
    result = podman(
        "exec",
        running_pair.sidecar,
        "python3",
        PROBE,
        f"http://127.0.0.1:{running_pair.engine_port}/health",
        "--timeout",
        "2",
        check=False,
    )
    assert result.returncode == 1 and "unhealthy" in result.stdout
    sidecar = podman("healthcheck", "run", running_pair.sidecar, check=False, timeout=60)
    assert sidecar.returncode == 0, sidecar.stdout + sidecar.stderr
