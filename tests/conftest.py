"""Shared test plumbing: tier markers by directory, paths to the shared fixtures and schemas."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SHARED = REPO.parent / "shared"
TIERS = ("unit", "app", "static", "engine", "container")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    long_enabled = os.environ.get("PALMYRA_LONG") == "1"
    for item in items:
        tier = Path(str(item.fspath)).relative_to(REPO / "tests").parts[0]
        if tier in TIERS:
            item.add_marker(getattr(pytest.mark, tier))
        if item.get_closest_marker("long") and not long_enabled:
            item.add_marker(pytest.mark.skip(reason="long variant: run with PALMYRA_LONG=1"))


@pytest.fixture(scope="session")
def repo() -> Path:
    return REPO


@pytest.fixture(scope="session")
def shared_dir() -> Path:
    assert SHARED.is_dir(), f"{SHARED} missing: tests read ../shared/fixtures and ../shared/schemas in place"
    return SHARED
