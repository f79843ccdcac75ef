#!/usr/bin/env python3
"""Proves a layer added nothing to a base image's Python but what it declared, and moved nothing.

    check-base-unmoved.py snapshot STATE.json CONSTRAINTS.txt
        records `pip freeze` and `pip check` of the running interpreter; writes every installed
        distribution as a `name==version` constraint (so a following install cannot move one).
    check-base-unmoved.py compare STATE.json REQUIREMENTS.txt [NO_DEPS_NAME ...]
        fails when a distribution of the snapshot changed version or disappeared, when a new one is
        not named in REQUIREMENTS.txt or as a NO_DEPS_NAME (so an undeclared dependency cannot slip
        in), or when `pip check` reports a problem it did not report before. A NO_DEPS_NAME is a
        distribution installed with --no-deps on purpose (the project: its declared dependencies
        are the sidecar's web stack, which the engine image does not run); `pip check` lines about
        its own requirements are printed, not fatal; the build's import of the launcher is the test.
        The base's own `pip check` complaints are printed, not fatal: vllm-ascend's image carries
        deliberate overrides (torch_npu and triton_ascend builds newer than its pins).
Standard library only: it runs in the base image's interpreter before anything is added.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from importlib import metadata
from pathlib import Path


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def installed() -> dict[str, str]:
    """Every distribution on sys.path (CANN's PYTHONPATH packages included); the first one wins, as on import."""
    out: dict[str, str] = {}
    for dist in metadata.distributions():
        name = dist.metadata["Name"]
        if name:
            out.setdefault(canonical(name), dist.version)
    return out


def constrainable(version: str) -> bool:
    """pip rejects a constraints file with a non-PEP 440 version (vendor packages have some)."""
    try:
        from pip._vendor.packaging.version import (  # the base's own pip
            InvalidVersion,
            Version,
        )
    except ImportError:
        return bool(re.fullmatch(r"[0-9][0-9a-zA-Z.+!-]*", version))
    try:
        Version(version)
    except InvalidVersion:
        return False
    return True


def pip_check() -> list[str]:
    run = subprocess.run([sys.executable, "-m", "pip", "check"], capture_output=True, text=True, check=False)
    return sorted(line for line in run.stdout.splitlines() if line and not line.startswith("No broken"))


def requirement_names(path: Path) -> set[str]:
    names = set()
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            names.add(canonical(re.split(r"[<>=!~;\[ ]", line, maxsplit=1)[0]))
    return names


def snapshot(state: Path, constraints: Path) -> int:
    dists = installed()
    state.write_text(json.dumps({"installed": dists, "pip_check": pip_check()}, indent=1, sort_keys=True))
    # Local versions (+git..., +empty, +cpu) constrain exactly as they are installed.
    pinned = {name: version for name, version in dists.items() if constrainable(version)}
    constraints.write_text("".join(f"{name}=={version}\n" for name, version in sorted(pinned.items())))
    # Those left out of the constraints are still compared afterwards.
    skipped = sorted(set(dists) - set(pinned))
    print(
        f"check-base-unmoved: {len(dists)} distributions in the base"
        + (f"; not constrainable (non-PEP 440 versions), compared only: {', '.join(skipped)}" if skipped else "")
    )
    return 0


def compare(state: Path, requirements: Path, extra: list[str]) -> int:
    """extra: the NO_DEPS_NAMEs."""
    before = json.loads(state.read_text())
    now = installed()
    allowed = requirement_names(requirements) | {canonical(n) for n in extra}
    problems = []
    for name, version in sorted(before["installed"].items()):
        if now.get(name) != version:
            problems.append(f"moved: {name} {version} -> {now.get(name, 'removed')}")
    for name in sorted(set(now) - set(before["installed"])):
        if name not in allowed:
            problems.append(f"added but not declared: {name} {now[name]}")
    check = pip_check()
    for line in before["pip_check"]:
        print(f"check-base-unmoved: the base's own pip check: {line}")
    no_deps = tuple(f"{canonical(n)} " for n in extra)
    for line in check:
        if line in before["pip_check"]:
            continue
        if canonical(line.split(" ", 1)[0]) + " " in no_deps:
            print(f"check-base-unmoved: installed --no-deps, not checked: {line}")
        else:
            problems.append(f"new pip check problem: {line}")
    for line in problems:
        print(f"check-base-unmoved: {line}", file=sys.stderr)
    added = sorted(set(now) - set(before["installed"]))
    listed = ", ".join(f"{n}=={now[n]}" for n in added) or "nothing"
    print(f"check-base-unmoved: added {listed}; base unmoved, pip check clean: {not problems}")
    return 1 if problems else 0


def main(argv: list[str]) -> int:
    if len(argv) >= 3 and argv[0] == "snapshot":
        return snapshot(Path(argv[1]), Path(argv[2]))
    if len(argv) >= 3 and argv[0] == "compare":
        return compare(Path(argv[1]), Path(argv[2]), argv[3:])
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
