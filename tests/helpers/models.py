"""The tests' download and build cache, and the tiny stand-in checkpoint the engine and container
tiers (and the benchmarks) serve: built once, reused by every run on the machine."""

from __future__ import annotations

import os
from pathlib import Path

TEST_CACHE = Path(os.environ.get("PALMYRA_TEST_CACHE", Path.home() / ".cache" / "palmyra-serve-tests"))


def stand_in_model(size: str = "tiny") -> Path:
    """The stand-in checkpoint of this size (seed 0), built into the cache on first use."""
    from palmyra_serve.model import stand_in

    return stand_in.build(TEST_CACHE / "models" / size, size, seed=0)
