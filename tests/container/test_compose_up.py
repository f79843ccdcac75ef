"""docker-compose.yml brought up for real with podman-compose: the CPU switch (`--profile cpu`)
plus the test-only override (host networking for the namespace holder, local images, loopback
ports), with an operator's env file that sets one engine and one sidecar setting (each seen to
take effect). model-init-cpu fills the project's `models` volume (the tiny stand-in, built inside
the container), the CPU engine serves it, the sidecar in front reaches /ready and returns real tokens;
the engine and the sidecar really share the holder's network namespace, the engine listens on its
loopback only, both run as non-root users, the engine image's shipped probe passes against the live
engine, a restarted sidecar finds the engine again, and with the engine stopped its probe fails
while the sidecar's own liveness holds; then `down -v` leaves nothing behind. podman-compose's
`service_healthy` waits can hang, so the test waits on the sidecar's /ready itself.
"""

from __future__ import annotations

import ipaddress
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers import deployed
from tests.helpers.podman import (
    PROBE,
    REPO,
    BuiltImages,
    completion,
    http,
    listening_addresses,
    podman,
    port_is_free,
    wait_ready,
)

PROJECT = "palmyra-ct"
ENGINE_PORT, SIDECAR_PORT = 18000, 18080
HOLDER = "pod"  # holds the network namespace the engine and the sidecar join
SERVICES = [HOLDER, "model-init-cpu", "engine-cpu", "sidecar"]
READY_TIMEOUT_S = 900


# The operator's env file of this stack: the keys Compose requires, and one engine setting and one
# sidecar setting away from their defaults, to see each take effect in its container.
ENV_FILE_MAX_MODEL_LEN = 1536  # the engine's (default 8192)
ENV_FILE_MAX_TOKENS_CAP = 100  # the sidecar's (default: max-model-len)
OPERATOR_ENV = {
    "COMPOSE_PROFILES": "cpu",
    "PALMYRA_PLATFORM": "cpu",
    "PALMYRA_ENGINE_API_KEY": "compose-test-engine-key",
    "GRAFANA_ADMIN_PASSWORD": "compose-test-grafana-password",
    "PALMYRA_AUTH_DISABLED": "true",  # auth fails closed; this stack serves without client keys
    "HF_ENDPOINT": "http://127.0.0.1:9",  # nothing leaves the machine
    "PALMYRA_MAX_MODEL_LEN": str(ENV_FILE_MAX_MODEL_LEN),
    "PALMYRA_MAX_TOKENS_CAP": str(ENV_FILE_MAX_TOKENS_CAP),
}
ENV_FILE = REPO / ".test-reports" / "compose-test.env"


def compose(*args: str, env: dict[str, str], timeout: float = 900) -> subprocess.CompletedProcess[str]:
    argv = [
        str(Path(sys.executable).parent / "podman-compose"),
        "--env-file",
        str(ENV_FILE),
        "-p",
        PROJECT,
        "--profile",
        "cpu",
        "-f",
        str(REPO / "docker-compose.yml"),
        "-f",
        str(REPO / "compose" / "podman-test.override.yml"),
        *args,
    ]
    return subprocess.run(argv, capture_output=True, text=True, env=env, timeout=timeout, check=False, cwd=REPO)


def project_containers() -> list[str]:
    out = podman("ps", "-a", "--filter", f"label=io.podman.compose.project={PROJECT}", "--format", "{{.Names}}").stdout
    return out.split()


def project_volumes() -> list[str]:
    out = podman(
        "volume", "ls", "--filter", f"label=io.podman.compose.project={PROJECT}", "--format", "{{.Name}}"
    ).stdout
    return out.split()


@pytest.fixture(scope="module")
def stack(built_images: BuiltImages) -> Iterator[dict[str, str]]:
    # The override's fixed loopback ports (podman-compose cannot interpolate inside !override).
    for port in (ENGINE_PORT, SIDECAR_PORT):
        assert port_is_free(port), f"127.0.0.1:{port} is taken: compose/podman-test.override.yml needs it"
    ENV_FILE.parent.mkdir(exist_ok=True)
    ENV_FILE.write_text("".join(f"{k}={v}\n" for k, v in OPERATOR_ENV.items()))
    # The shell's PALMYRA_* would win over the env file: the file alone speaks here.
    env = deployed.compose_shell_env()
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


def test_settings_in_the_env_file_take_effect_in_their_containers(stack: dict[str, str]) -> None:
    url = f"http://127.0.0.1:{SIDECAR_PORT}"
    containers = names(stack)
    wait_ready(url, [containers["engine-cpu"], containers["sidecar"]], READY_TIMEOUT_S)
    # The engine's: vLLM serves the env file's max-model-len (what /v1/models reports).
    status, body = http("GET", f"{url}/v1/models")
    assert status == 200 and body["data"][0]["max_model_len"] == ENV_FILE_MAX_MODEL_LEN, body
    # The sidecar's: its max_tokens cap refuses one token more, before the engine.
    status, body = completion(url, max_tokens=ENV_FILE_MAX_TOKENS_CAP + 1)
    assert status == 400 and "max_tokens" in body["error"]["message"], body
    status, body = completion(url, max_tokens=ENV_FILE_MAX_TOKENS_CAP)
    assert status == 200, body


def test_engine_and_sidecar_share_the_holders_namespace(stack: dict[str, str]) -> None:
    containers = names(stack)
    holder_id = podman("inspect", containers[HOLDER], "--format", "{{.Id}}").stdout.strip()
    for service in ("engine-cpu", "sidecar"):
        mode = podman("inspect", containers[service], "--format", "{{.HostConfig.NetworkMode}}").stdout.strip()
        assert mode == f"container:{holder_id}", f"{service}: network mode {mode}"
    # One namespace: the same network namespace inode in all three.
    inodes = {
        podman("exec", containers[s], "readlink", "/proc/self/ns/net").stdout.strip()
        for s in (HOLDER, "engine-cpu", "sidecar")
    }
    assert len(inodes) == 1, inodes
    # The engine listens on the namespace's loopback only.
    addresses = listening_addresses(containers["engine-cpu"], ENGINE_PORT)
    assert addresses and all(ipaddress.ip_address(a).is_loopback for a in addresses), addresses
    # Its metrics reach Prometheus through the sidecar, unchanged.
    status, _ = http("GET", f"http://127.0.0.1:{SIDECAR_PORT}/engine/metrics")
    assert status == 200


def test_both_containers_run_as_non_root(stack: dict[str, str]) -> None:
    containers = names(stack)
    assert podman("exec", containers["engine-cpu"], "id", "-u").stdout.strip() == "1000"
    assert podman("exec", containers["engine-cpu"], "id", "-un").stdout.strip() == "HwHiAiUser"
    sidecar = podman("exec", containers["sidecar"], "id", "-u").stdout.strip()
    assert sidecar.isdigit() and sidecar != "0"


def engine_probe(container: str) -> subprocess.CompletedProcess[str]:
    """The engine image's HEALTHCHECK command (tests/container/test_images.py checks it is declared
    so), aimed at this stack's engine port instead of the default 8000."""
    url = f"http://127.0.0.1:{ENGINE_PORT}/health"
    return podman("exec", container, "python3", PROBE, url, "--timeout", "3", check=False)


def test_the_engine_images_shipped_probe_passes_against_the_live_engine(stack: dict[str, str]) -> None:
    result = engine_probe(names(stack)["engine-cpu"])
    assert result.returncode == 0 and "unhealthy" not in result.stdout, result.stdout + result.stderr


def test_a_restarted_sidecar_finds_the_engine_again(stack: dict[str, str]) -> None:
    containers = names(stack)
    engine_pid = podman("inspect", containers["engine-cpu"], "--format", "{{.State.Pid}}").stdout.strip()
    podman("restart", "-t", "10", containers["sidecar"], timeout=120)
    ready = wait_ready(
        f"http://127.0.0.1:{SIDECAR_PORT}", [containers["engine-cpu"], containers["sidecar"]], READY_TIMEOUT_S
    )
    assert ready["ready"] is True
    # The engine was not restarted along with it.
    assert podman("inspect", containers["engine-cpu"], "--format", "{{.State.Pid}}").stdout.strip() == engine_pid


def test_compose_healthchecks_pass(stack: dict[str, str]) -> None:
    containers = names(stack)
    for service in ("engine-cpu", "sidecar"):
        result = podman("healthcheck", "run", containers[service], check=False, timeout=60)
        assert result.returncode == 0, f"{service}: {result.stdout}{result.stderr}"


def test_the_engine_probe_fails_when_the_engine_is_gone_and_the_sidecar_stays_live(stack: dict[str, str]) -> None:
    # Next to last: stops the engine. The sidecar's own liveness must stay healthy: it must not be
    # restarted for the engine's fault.
    containers = names(stack)
    podman("stop", "-t", "40", containers["engine-cpu"], timeout=120)
    result = engine_probe(containers["sidecar"])  # same namespace: the engine's loopback port
    assert result.returncode == 1 and "unhealthy" in result.stdout, result.stdout + result.stderr
    sidecar = podman("healthcheck", "run", containers["sidecar"], check=False, timeout=60)
    assert sidecar.returncode == 0, sidecar.stdout + sidecar.stderr


def test_down_leaves_nothing(stack: dict[str, str]) -> None:
    down = compose("down", "-v", "-t", "40", env=stack, timeout=300)
    assert down.returncode == 0, down.stdout[-2000:] + down.stderr[-2000:]
    assert project_containers() == []
    assert project_volumes() == []
