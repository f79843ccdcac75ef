"""Container tier: the real images, built with podman from the Dockerfile, run on 127.0.0.1.

Images are built once per session (the engine image installs ~3.5 GB on a first build; pip's
cache mount makes later builds reuse the downloads, podman's layer cache the layers) and shared by
every module here. Heavy: run the tier under the machine-wide lock, e.g.
    flock /tmp/palmyra-engine.lock .venv/bin/python -m pytest tests/container
(the fixtures do not take the lock themselves: a nested flock on the same file would deadlock).

Podman on these machines: runc (crun refuses the hybrid cgroups) and lowered ulimits, both from
scripts/podman/containers.conf via CONTAINERS_CONF; host networking only (no bridge); HEALTHCHECKs
kept by `--format docker` and run by hand with `podman healthcheck run` (no systemd here).
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers.podman import (
    ENGINE_IMAGE,
    PODMAN_DIR,
    SIDECAR_IMAGE,
    BuiltImages,
    build_images,
    image_size,
)

REPORT = Path(os.environ.get("PALMYRA_CONTAINER_REPORT", "/tmp/palmyra-container-report.json"))
_SUMMARY: list[str] = []


@pytest.fixture(scope="session")
def podman_env() -> Iterator[None]:
    for binary in ("podman", "runc", "debootstrap"):
        assert shutil.which(binary), (
            f"{binary} missing: ./test.sh container installs it (apt-get install podman runc debootstrap)"
        )
    previous = os.environ.get("CONTAINERS_CONF")
    os.environ["CONTAINERS_CONF"] = str(PODMAN_DIR / "containers.conf")
    yield
    if previous is None:
        os.environ.pop("CONTAINERS_CONF", None)
    else:
        os.environ["CONTAINERS_CONF"] = previous


@pytest.fixture(scope="session")
def build_logs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("build-logs")


@pytest.fixture(scope="session")
def built_images(podman_env: None, build_logs: Path) -> BuiltImages:
    # ./test.sh may have built them in the background already (tests/helpers/prebuild.py): then
    # these are the seconds podman's layer cache took to confirm them.
    seconds = build_images(build_logs)
    sizes = {image: image_size(image) for image in (ENGINE_IMAGE, SIDECAR_IMAGE)}
    for image in sizes:
        _SUMMARY.append(f"{image}: {sizes[image] / 1e9:.2f} GB, built in {seconds[image]:.0f} s this session")
    REPORT.write_text(json.dumps({"sizes_bytes": sizes, "build_seconds": seconds}, indent=2))
    return BuiltImages(ENGINE_IMAGE, SIDECAR_IMAGE, sizes, seconds)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if _SUMMARY:
        terminalreporter.section("palmyra container images")
        for line in _SUMMARY:
            terminalreporter.write_line(line)
