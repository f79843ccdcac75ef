"""Session fixtures for the engine tier: one real vLLM CPU engine serving the tiny stand-in
(tiny_model_dir, from tests/conftest.py), one sidecar.

The engine starts once per session (about a minute) and every engine test shares it. Tests that
need an engine of their own (another dtype, perturbed weights, a killed engine) use
`helpers.procs.engine(...)` directly, one at a time.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers import procs


@pytest.fixture(scope="session")
def log_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("logs")


@pytest.fixture(scope="session")
def engine_server(tiny_model_dir: Path, log_dir: Path) -> Iterator[procs.Server]:
    with procs.engine(tiny_model_dir, log_dir) as server:
        yield server


@pytest.fixture(scope="session")
def sidecar_server(engine_server: procs.Server, log_dir: Path) -> Iterator[procs.Server]:
    with procs.sidecar(engine_server.url, log_dir, engine_api_key=engine_server.api_key) as server:
        yield server


@pytest.fixture(scope="session")
def start_engine(log_dir: Path):
    """Factory for an extra engine: `with start_engine(model_dir, dtype="float32") as e: ...`."""

    def factory(model_dir: Path, dtype: str = "bfloat16", extra_env: dict[str, str] | None = None):
        return procs.engine(model_dir, log_dir, dtype=dtype, extra_env=extra_env)

    return factory


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests that start engines of their own run before the shared engine starts, so that two
    engines never compete for these two cores."""
    shared = {"engine_server", "sidecar_server"}
    items.sort(key=lambda item: bool(shared & set(getattr(item, "fixturenames", ()))))
