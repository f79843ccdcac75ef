"""Where the repository and its vendored test data are, for every tier and helper."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# Published schemas and recorded fixtures, vendored with their provenance (tests/data/README.md):
# a clone passes its tests with nothing beside it.
DATA = REPO / "tests" / "data"
