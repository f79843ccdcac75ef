"""The Python in this tree is lint-clean, formatted and type-checked: ruff and mypy from this venv,
with their configuration from pyproject.toml ([tool.ruff], [tool.mypy]; pins in
tests/requirements-tools.txt), over service/, tests/, benchmarks/, scripts/, monitoring/, docker/
and healthchecks/: every Python file of the repository.

- ruff check and ruff format: one rule set and one style for all seven; a per-line `noqa` only
  where a rule is wrong for that line, with the reason beside it.
- mypy, the package (service/palmyra_serve): every function annotated, every body checked: it is
  what the images run, and its code already met that.
- mypy, the shared test helpers (tests/helpers), the benchmarks, scripts and monitoring: the same
  rule; every caller leans on their signatures, and they were annotated already.
- mypy, the tests themselves: every body checked (calls into the package, None handling, typos),
  annotations optional: test functions and fixtures get their arguments from pytest by name, and
  annotating each would only restate the fixtures' types.
"""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# What is checked, relative to the repository root; mypy's own list is [tool.mypy] files.
PATHS = ("service/", "tests/", "benchmarks/", "scripts/", "monitoring/", "docker/", "healthchecks/")


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    # From the repository root, so pyproject.toml is the configuration and mypy's cache (a cold run
    # walks torch's and transformers' stubs for about a minute, a warm one takes seconds) lands in
    # this tree's .mypy_cache.
    return subprocess.run(
        [sys.executable, "-m", *args], cwd=REPO, capture_output=True, text=True, timeout=600, check=False
    )


def _assert_clean(proc: subprocess.CompletedProcess[str]) -> None:
    assert proc.returncode == 0, f"{' '.join(proc.args[2:])} failed:\n{proc.stdout}{proc.stderr}"


def test_ruff_check() -> None:
    _assert_clean(_run("ruff", "check", "--no-fix", *PATHS))


def test_ruff_format() -> None:
    _assert_clean(_run("ruff", "format", "--check", "--diff", *PATHS))


def test_mypy() -> None:
    # Files, plugin (pydantic.mypy) and strictness come from [tool.mypy]; mypy_path points at this
    # tree's service/, so the package checked is this checkout's, not the venv's editable install.
    # Its file list names the same seven trees (the package by its folder), so none drops out.
    files = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["mypy"]["files"]
    assert {f.split("/")[0] for f in files} == {p.rstrip("/") for p in PATHS}, files
    _assert_clean(_run("mypy"))
