"""Shared test plumbing: tier markers by directory, the path to the vendored test data, the tiny
stand-in checkpoint."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.helpers.paths import DATA, REPO

TIERS = ("unit", "app", "static", "engine", "container")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    long_enabled = os.environ.get("PALMYRA_LONG") == "1"
    for item in items:
        tier = Path(str(item.fspath)).relative_to(REPO / "tests").parts[0]
        if tier in TIERS:
            item.add_marker(getattr(pytest.mark, tier))
        if item.get_closest_marker("long") and not long_enabled:
            item.add_marker(pytest.mark.skip(reason="long variant: run with PALMYRA_LONG=1"))
    # pytest-xdist hands modules out in collection order (test.sh passes --no-loadscope-reorder;
    # by default it would order them by their number of tests): the longest first, so that no
    # worker starts one of them when the others are nearly done (seen: 3 minutes after them).
    # Stable: every other module keeps its place.
    items.sort(key=lambda item: _longest_first(Path(str(item.fspath)).relative_to(REPO).as_posix()))


# The modules of the parallel tiers with the longest test time, longest first (measured: a minute
# or more each, most of it waiting on query windows, drains and timers).
LONGEST_MODULES = (
    "tests/app/test_autoscaling_live.py",
    "tests/app/test_edge_front.py",
    "tests/static/test_ascend_image.py",
    "tests/app/test_rollout.py",
    "tests/static/test_lint.py",
)


def _longest_first(path: str) -> int:
    return LONGEST_MODULES.index(path) if path in LONGEST_MODULES else len(LONGEST_MODULES)


LOG_LINES_KEPT = 150


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    """A failed test's report keeps the end of the logs of the processes it ran (sidecar, engine,
    fake engine): a failure seen once in CI must be explainable from its report alone."""
    report = yield
    if report.failed:
        for path in _process_logs(item):
            lines = path.read_text(errors="replace").splitlines()[-LOG_LINES_KEPT:]
            report.sections.append((f"log {path.name} (last {len(lines)} lines)", "\n".join(lines)))
    return report


def _process_logs(item: pytest.Item) -> list[Path]:
    from tests.helpers.procs import Server

    found: dict[Path, None] = {}
    for name, value in getattr(item, "funcargs", {}).items():
        if isinstance(value, Server):
            found[value.log_path] = None
        elif name == "log_dir" and isinstance(value, Path):
            found.update(dict.fromkeys(sorted(value.glob("*.log"))))
    return [p for p in found if p.is_file()]


@pytest.fixture(scope="session")
def repo() -> Path:
    return REPO


@pytest.fixture(scope="session")
def tiny_model_dir() -> Path:
    """The tiny stand-in checkpoint, one cached copy for the engine and container tiers."""
    from tests.helpers.models import stand_in_model

    return stand_in_model("tiny")


@pytest.fixture(scope="session")
def data_dir() -> Path:
    assert DATA.is_dir(), f"{DATA} missing: the vendored test data ships with the repository"
    return DATA
