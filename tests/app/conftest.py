"""App tier: the real sidecar process (uvicorn, real sockets) in front of a FAKE engine that
misbehaves on purpose (tests/helpers/fake_engine.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.helpers import procs
from tests.helpers.procs import fake_engine

# Short intervals so transitions happen in seconds, not the production defaults' minutes.
FAST = {
    "PALMYRA_HEALTH_POLL_INTERVAL_S": "0.2",
    "PALMYRA_CANARY_INTERVAL_S": "0.5",
    "PALMYRA_CANARY_TIMEOUT_S": "1",
    "PALMYRA_LIVENESS_BUDGET_S": "3",
    "PALMYRA_WARMUP_MAX_BACKOFF_S": "1",
    "PALMYRA_READ_TIMEOUT_S": "2",
    "PALMYRA_WARMUP_REQUEST_TIMEOUT_S": "2",
    "PALMYRA_CONNECT_TIMEOUT_S": "1",
    "PALMYRA_DRAIN_TIMEOUT_S": "10",
}


@pytest.fixture
def log_dir(tmp_path: Path) -> Path:
    return tmp_path


@pytest.fixture
def engine(log_dir: Path) -> Iterator[procs.Server]:
    with fake_engine(log_dir) as server:
        yield server


@pytest.fixture
def sidecar_factory(log_dir: Path):
    def start(engine_url: str, wait_ready: bool = True, probe: bool = False, **env: str):
        return procs.sidecar(
            engine_url, log_dir, extra_env={**FAST, **env}, wait_ready=wait_ready, timeout_s=30, probe=probe
        )

    return start


@pytest.fixture
def sidecar(engine: procs.Server, sidecar_factory) -> Iterator[procs.Server]:
    with sidecar_factory(engine.url) as server:
        yield server


@pytest.fixture
def client() -> Iterator[httpx.Client]:
    with httpx.Client(timeout=15) as c:
        yield c
