"""The built images themselves: sizes, what each holds, its user and layout, its declared
HEALTHCHECK, and the layer cache on a rebuild. The images run, serve tokens, pass their probes and
fail the engine's when the engine is gone in tests/container/test_compose_up.py (the Compose stack)
and tests/container/test_kube_play.py (the CPU overlay, with a host directory as the model volume)."""

from __future__ import annotations

import json
import subprocess
import time

import pytest

from tests.helpers.podman import PODMAN_DIR, PROBE, BuiltImages, podman


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


@pytest.mark.parametrize(
    ("which", "probed"),
    [("sidecar", "http://127.0.0.1:8080/health/sidecar"), ("engine", "http://127.0.0.1:8000/health")],
)
def test_healthcheck_declared_in_images(built_images: BuiltImages, which: str, probed: str) -> None:
    """Each image's HEALTHCHECK is the shipped probe at the port its default command listens on.
    The probe itself runs against a live engine and sidecar in tests/container/test_compose_up.py."""
    # --format docker keeps HEALTHCHECK; without it podman drops it silently.
    inspect = json.loads(podman("image", "inspect", getattr(built_images, which)).stdout)[0]
    config = inspect.get("Config") or {}
    check = inspect.get("Healthcheck") or config.get("Healthcheck") or {}
    assert check.get("Test") == ["CMD", "python3", PROBE, probed, "--timeout", "3"], inspect
    default_command = (config.get("Entrypoint") or []) + (config.get("Cmd") or [])
    port = probed.split(":")[2].split("/")[0]
    assert default_command[-2:] == ["--port", port], default_command
