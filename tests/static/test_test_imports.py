"""The tests' own layout: no test module imports another, and shared plumbing lives in tests/helpers/.

A test module used as a library drags its tests, fixtures and module-level work into every importer
(and a rename or a deleted test breaks a tier it does not belong to); a helper hidden in a tier
directory is found by no one looking in tests/helpers/. So every Python file under tests/ may import
from the tests package only its helpers (`tests.helpers...`), never relatively, and a tier directory
holds nothing but test modules, its conftest.py and its __init__.py.
"""

from __future__ import annotations

import ast
from pathlib import Path

from tests.helpers.paths import REPO

TESTS = REPO / "tests"
# The tier directories: one per tier, their modules collected by pytest.
TIER_DIRS = ("unit", "app", "static", "engine", "container")
ALLOWED_IN_TIER = ("conftest.py", "__init__.py")


def forbidden_imports(source: str) -> list[str]:
    """The imports in `source` that reach into the tests package anywhere but tests.helpers."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                found.append(f"line {node.lineno}: relative import from {'.' * node.level}{node.module or ''}")
            elif node.module == "tests":
                found += [f"line {node.lineno}: tests.{a.name}" for a in node.names if a.name != "helpers"]
            elif node.module and _outside_helpers(node.module):
                found.append(f"line {node.lineno}: {node.module}")
        elif isinstance(node, ast.Import):
            found += [f"line {node.lineno}: {a.name}" for a in node.names if _outside_helpers(a.name)]
    return found


def _outside_helpers(module: str) -> bool:
    parts = module.split(".")
    return parts[0] == "tests" and len(parts) > 1 and parts[1] != "helpers"


def python_files() -> list[Path]:
    return sorted(p for p in TESTS.rglob("*.py") if "data" not in p.relative_to(TESTS).parts)


def test_no_module_under_tests_imports_a_test_module_or_a_tier_module():
    files = python_files()
    assert any(p.name.startswith("test_") for p in files) and any(p.parent.name == "helpers" for p in files)
    offences = {
        str(path.relative_to(REPO)): found
        for path in files
        if (found := forbidden_imports(path.read_text(encoding="utf-8")))
    }
    assert not offences, f"move what they share to tests/helpers/ (or a tier's conftest.py): {offences}"


def test_tier_directories_hold_only_test_modules_and_their_conftest():
    strays = [
        str(path.relative_to(REPO))
        for tier in TIER_DIRS
        for path in sorted((TESTS / tier).rglob("*.py"))
        if not path.name.startswith("test_") and path.name not in ALLOWED_IN_TIER
    ]
    assert not strays, f"shared code in a tier directory: move it to tests/helpers/: {strays}"


def test_the_import_check_can_fail():
    """Each way one test module could lean on another is caught; the helpers are not."""
    caught = {
        "from tests.static.test_k8s import render": 1,
        "from tests.engine.reliability_support import FAST": 1,
        "import tests.app.test_proxy": 1,
        "from tests import conftest, helpers": 1,
        "from tests.conftest import DATA": 1,
        "from . import sibling": 1,
        "from .test_k8s import render": 1,
        "def f():\n    from tests.static.test_k8s import render": 1,
        "from tests.helpers.k8s_manifests import render": 0,
        "from tests.helpers import procs": 0,
        "import tests.helpers.procs": 0,
        "from testsuite.static import x": 0,
    }
    for source, count in caught.items():
        assert len(forbidden_imports(source)) == count, source
