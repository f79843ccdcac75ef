#!/usr/bin/env python3
"""Print the pinned requirements of pyproject.toml (base + chosen extras), one per line.

The Dockerfile installs these in a layer that depends on pyproject.toml alone, then installs the
project itself with `--no-deps`: editing the source then rebuilds only the last small layer, not
the 3.5 GB of dependencies. Self-references such as `palmyra-serve[model]` are expanded.
Standard library only (tomllib, Python 3.11+), since it runs before anything is installed.

    requirements-from-pyproject.py PYPROJECT [EXTRA,EXTRA...]
"""

from __future__ import annotations

import re
import sys
import tomllib

SELF_REF = re.compile(r"^\s*([A-Za-z0-9_.-]+)\s*\[([^\]]+)\]\s*$")


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def requirements(project: dict, extras: list[str]) -> list[str]:
    name = _norm(project["name"])
    optional = project.get("optional-dependencies", {})
    out: list[str] = list(project.get("dependencies", []))
    pending, seen = list(extras), set()
    while pending:
        extra = pending.pop(0)
        if extra in seen:
            continue
        seen.add(extra)
        if extra not in optional:
            raise SystemExit(f"unknown extra {extra!r}; known: {', '.join(sorted(optional))}")
        for req in optional[extra]:
            match = SELF_REF.match(req)
            if match and _norm(match.group(1)) == name:
                pending.extend(e.strip() for e in match.group(2).split(","))
            else:
                out.append(req)
    return list(dict.fromkeys(out))  # keep order, drop duplicates


def main(argv: list[str]) -> int:
    if len(argv) not in (1, 2):
        print(__doc__.strip().splitlines()[-1].strip(), file=sys.stderr)
        return 2
    with open(argv[0], "rb") as fh:
        project = tomllib.load(fh)["project"]
    extras = [e for e in (argv[1].split(",") if len(argv) == 2 else []) if e]
    print("\n".join(requirements(project, extras)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
