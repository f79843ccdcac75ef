"""The container tier's images, built ahead of the tier: ./test.sh runs this in the background
while the tiers that start no engine run, so the tier's own build (tests/container/conftest.py,
the same steps) comes from podman's layer cache.

    python -m tests.helpers.prebuild LOG_DIR
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from tests.helpers.podman import PODMAN_DIR, build_images


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m tests.helpers.prebuild LOG_DIR", file=sys.stderr)
        return 2
    # The same podman configuration as the tier's (runc, lowered ulimits): see conftest.py.
    os.environ["CONTAINERS_CONF"] = str(PODMAN_DIR / "containers.conf")
    try:
        seconds = build_images(Path(argv[0]))
    except AssertionError as exc:  # run_logged's failure, with the failed step's log tail
        print(exc, file=sys.stderr)
        return 1
    for image, took in seconds.items():
        print(f"{image}: built in {took:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
