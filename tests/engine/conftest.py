"""Session fixtures for the engine tier: one real vLLM CPU engine serving the tiny stand-in
(tiny_model_dir, from tests/conftest.py), one sidecar.

An engine start costs 60-150 s on two cores (three interpreters importing torch and vLLM, then the
compile), so the tier starts as few as it can: the shared engine once, for every test that talks
to an engine, `validate` included (it serves float32 for that: the fp32 reference must agree with
it token for token); `palmyra-serve up` once (tests/engine/test_up.py), which starts its own.
The tests that damage the engine (tests/engine/test_reliability_engine_faults.py) run last, on
the shared engine, and restart it in place.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers import procs
from tests.helpers.otlp_receiver import Receiver, otlp_receiver

# validate's accuracy check compares greedy tokens with the fp32 Transformers reference: only a
# float32 engine agrees token for token. The other tests do not depend on the dtype; bfloat16, the
# CPU default, is what `up` (tests/engine/test_up.py) and the container tier serve.
SHARED_ENGINE_DTYPE = "float32"

# Fixtures that mean "this test talks to the shared engine".
SHARED = {"engine_server", "sidecar_server", "shared_engine", "otlp"}


@pytest.fixture(scope="session")
def log_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("logs")


@pytest.fixture(scope="session")
def otlp(log_dir: Path) -> Iterator[Receiver]:
    """The test OTLP receiver the shared engine exports its spans to, for the whole session."""
    with otlp_receiver() as receiver:
        yield receiver


@pytest.fixture(scope="session")
def shared_engine(tiny_model_dir: Path, log_dir: Path, otlp: Receiver) -> Iterator[procs.RestartableEngine]:
    """The shared engine as an object that can be restarted on its port: the fault tests use it
    directly (and run last); every other test sees its Server through engine_server. Its tracing
    is on, as PALMYRA_OTLP_TRACES_ENDPOINT turns it on in a deployment (tests/engine/
    test_tracing_engine.py reads its spans); spans leave every 200 ms rather than every 5 s."""
    tracing = {"PALMYRA_OTLP_TRACES_ENDPOINT": otlp.url, "OTEL_BSP_SCHEDULE_DELAY": "200"}
    eng = procs.RestartableEngine(tiny_model_dir, log_dir, dtype=SHARED_ENGINE_DTYPE, extra_env=tracing)
    eng.start()
    try:
        yield eng
    finally:
        eng.stop()


@pytest.fixture(scope="session")
def engine_server(shared_engine: procs.RestartableEngine) -> procs.Server:
    assert shared_engine.server is not None, "started by the shared_engine fixture"
    return shared_engine.server


@pytest.fixture(scope="session")
def sidecar_server(engine_server: procs.Server, log_dir: Path) -> Iterator[procs.Server]:
    # With a probe port, as deployed: the full /metrics (per-tenant series) is read there.
    with procs.sidecar(engine_server.url, log_dir, engine_api_key=engine_server.api_key, probe=True) as server:
        yield server


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests that start engines of their own run before the shared engine starts, so that two
    engines never compete for these two cores; the tests that damage the shared engine run after
    every other user of it. (The sort is stable: other tiers' items keep their order, first.)"""

    def order(item: pytest.Item) -> tuple[bool, bool]:
        names = set(getattr(item, "fixturenames", ()))
        return bool(SHARED & names), item.get_closest_marker("damages_shared_engine") is not None

    items.sort(key=order)
