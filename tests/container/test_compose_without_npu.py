"""A plain `docker compose up` with the shipped `.env` (the Ascend profile) on a host without an NPU,
such as this one: the profile's first service, npu-check, runs doctor's driver check from the
sidecar's image against the host's /dev and /usr/local and stops the start, saying to use the CPU
profile, before Docker would fail on the engine's missing /dev/davinci* nodes. Run for real with
podman-compose and the built sidecar image, as Compose runs it (no test override)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.helpers import deployed
from tests.helpers.podman import REPO, SIDECAR_IMAGE, BuiltImages


def test_the_ascend_profile_on_a_host_without_an_npu_stops_at_npu_check_and_names_the_cpu_path(
    built_images: BuiltImages,
) -> None:
    assert not list(Path("/dev").glob("davinci[0-9]*")), "this test needs a host without an NPU"
    env = deployed.compose_shell_env(
        PALMYRA_ENGINE_API_KEY="npu-check-test-engine-key",
        GRAFANA_ADMIN_PASSWORD="npu-check-test-grafana-password",
        PALMYRA_SIDECAR_IMAGE=built_images.sidecar,
    )
    assert built_images.sidecar == SIDECAR_IMAGE
    done = subprocess.run(
        [
            str(Path(sys.executable).parent / "podman-compose"),
            "--env-file",
            ".env",  # the shipped one: COMPOSE_PROFILES=ascend
            "-p",
            "palmyra-npu-check",
            "run",
            "--rm",
            "npu-check",
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    out = done.stdout + done.stderr
    assert done.returncode == 1, out[-3000:]
    assert "[STOP] driver: no Ascend driver here" in done.stdout, out[-3000:]
    assert "docker compose --env-file compose/cpu.env up -d" in done.stdout
    assert "verdict: the engine will not start here" in done.stdout
