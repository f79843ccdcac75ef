"""The tools stay light to import (the CLI builds every subparser on each call) and never use the sidecar."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import palmyra_serve.tools

TOOLS = Path(palmyra_serve.tools.__file__).parent
HEAVY = ("torch", "transformers", "matplotlib", "httpx", "aiohttp", "tqdm", "numpy", "vllm")


def test_building_the_cli_imports_nothing_heavy() -> None:
    code = (
        "import sys; from palmyra_serve.cli import build_parser; build_parser(); "
        f"print(sorted(m for m in {HEAVY!r} if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_validate_and_bench_parse_through_the_cli() -> None:
    from palmyra_serve.cli import build_parser

    args = build_parser().parse_args(["bench", "--compare", "a.json", "b.json"])
    assert args.compare == ["a.json", "b.json"]
    args = build_parser().parse_args(["validate", "--quick", "--base-url", "http://h:1"])
    assert args.quick and args.base_url == "http://h:1" and args.tokens == 20 and args.model == "palmyra-mini"


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


def test_tools_never_import_the_sidecar() -> None:
    files = sorted(TOOLS.glob("*.py"))
    assert len(files) >= 5
    for f in files:
        assert not any(n.startswith("palmyra_serve.sidecar") for n in _imports(f)), f
