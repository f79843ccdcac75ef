"""docker-compose.yml brought up for real with podman-compose: the CPU switch (`--profile cpu`)
plus the test-only override (host networking, local images, loopback ports). model-init-cpu
fills the project's `models` volume (the tiny stand-in, built inside the container), the CPU
engine serves it, the sidecar in front reaches /ready and returns real tokens; then `down -v`
leaves nothing behind. podman-compose's `service_healthy` waits can hang, so the test waits on the
sidecar's /ready itself.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from podman_helpers import REPO, BuiltImages, completion, env_with, http, podman, port_is_free, wait_ready

PROJECT = "palmyra-ct"
ENGINE_PORT, SIDECAR_PORT = 18000, 18080
SERVICES = ["model-init-cpu", "engine-cpu", "sidecar"]
READY_TIMEOUT_S = 900


def compose(*args: str, env: dict[str, str], timeout: float = 900) -> subprocess.CompletedProcess[str]:
    argv = [
        str(Path(sys.executable).parent / "podman-compose"),
        "-p", PROJECT,
        "--profile", "cpu",
        "-f", str(REPO / "docker-compose.yml"),
        "-f", str(REPO / "compose" / "podman-test.override.yml"),
        *args,
    ]
    return subprocess.run(argv, capture_output=True, text=True, env=env, timeout=timeout, check=False, cwd=REPO)


def project_containers() -> list[str]:
    out = podman("ps", "-a", "--filter", f"label=io.podman.compose.project={PROJECT}", "--format", "{{.Names}}").stdout
    return out.split()


def project_volumes() -> list[str]:
    out = podman("volume", "ls", "--filter", f"label=io.podman.compose.project={PROJECT}", "--format", "{{.Name}}").stdout
    return out.split()


@pytest.fixture(scope="module")
def stack(built_images: BuiltImages) -> Iterator[dict[str, str]]:
    # The override's fixed loopback ports (podman-compose cannot interpolate inside !override).
    for port in (ENGINE_PORT, SIDECAR_PORT):
        assert port_is_free(port), f"127.0.0.1:{port} is taken: compose/podman-test.override.yml needs it"
    env = env_with(
        PALMYRA_ENGINE_API_KEY="compose-test-engine-key",
        PALMYRA_AUTH_DISABLED="true",  # auth fails closed; this stack serves without client keys
        HF_ENDPOINT="http://127.0.0.1:9",  # nothing leaves the machine
    )
    compose("down", "-v", "-t", "5", env=env, timeout=300)  # leftovers of an interrupted run
    up = compose("up", "-d", *SERVICES, env=env)
    try:
        assert up.returncode == 0, up.stdout[-4000:] + up.stderr[-4000:]
        yield env
    finally:
        down = compose("down", "-v", "-t", "40", env=env, timeout=300)
        env["_down_rc"] = str(down.returncode)
        env["_down_out"] = down.stdout[-2000:] + down.stderr[-2000:]


def names(env: dict[str, str]) -> dict[str, str]:
    containers = project_containers()
    found = {}
    for service in SERVICES:
        match = [c for c in containers if c.startswith(f"{PROJECT}_{service}_") or c == f"{PROJECT}-{service}-1"]
        assert match, f"no container for {service} in {containers}"
        found[service] = match[0]
    return found


def test_stack_reaches_ready_and_serves_tokens(stack: dict[str, str]) -> None:
    url = f"http://127.0.0.1:{SIDECAR_PORT}"
    containers = names(stack)
    ready = wait_ready(url, [containers["engine-cpu"], containers["sidecar"]], READY_TIMEOUT_S)
    assert ready["ready"] is True
    # model-init ran to completion and filled the volume the engine serves from.
    state = podman("inspect", containers["model-init-cpu"], "--format", "{{.State.Status}} {{.State.ExitCode}}")
    assert state.stdout.split() == ["exited", "0"]
    status, body = completion(url)
    assert status == 200, body
    assert body["usage"]["completion_tokens"] == 8
    # The engine's /v1 is behind the shared engine key; its /health stays open.
    engine = f"http://127.0.0.1:{ENGINE_PORT}"
    assert http("GET", f"{engine}/v1/models")[0] == 401
    assert http("GET", f"{engine}/health")[0] == 200


def test_compose_healthchecks_pass(stack: dict[str, str]) -> None:
    containers = names(stack)
    for service in ("engine-cpu", "sidecar"):
        result = podman("healthcheck", "run", containers[service], check=False, timeout=60)
        assert result.returncode == 0, f"{service}: {result.stdout}{result.stderr}"


def test_down_leaves_nothing(stack: dict[str, str]) -> None:
    down = compose("down", "-v", "-t", "40", env=stack, timeout=300)
    assert down.returncode == 0, down.stdout[-2000:] + down.stderr[-2000:]
    assert project_containers() == []
    assert project_volumes() == []
