"""service/ is lint-clean, formatted and type-checked: ruff and mypy from this venv, with their
configuration from pyproject.toml ([tool.ruff], [tool.mypy]; pins in tests/requirements-tools.txt)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    # From the repository root, so pyproject.toml is the configuration and mypy's cache (a cold run
    # walks torch's stubs for ~40 s, a warm one takes seconds) lands in this tree's .mypy_cache.
    return subprocess.run(
        [sys.executable, "-m", *args], cwd=REPO, capture_output=True, text=True, timeout=600, check=False
    )


def _assert_clean(proc: subprocess.CompletedProcess[str]) -> None:
    assert proc.returncode == 0, f"{' '.join(proc.args[2:])} failed:\n{proc.stdout}{proc.stderr}"


def test_ruff_check() -> None:
    _assert_clean(_run("ruff", "check", "--no-fix", "service/"))


def test_ruff_format() -> None:
    _assert_clean(_run("ruff", "format", "--check", "--diff", "service/"))


def test_mypy() -> None:
    # Files, plugin (pydantic.mypy) and strictness come from [tool.mypy]; mypy_path points at this
    # tree's service/, so the package checked is this checkout's, not the venv's editable install.
    _assert_clean(_run("mypy"))
