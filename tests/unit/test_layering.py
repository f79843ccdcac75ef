"""The sidecar stays light: importing and building it pulls in no torch, vllm or transformers,
and nothing from the engine, model or tools packages (its image carries none of them). And its
imports keep to its four floors."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

PROBE = """
import sys
from palmyra_serve.sidecar.app import create_app
from palmyra_serve.sidecar import server  # noqa: F401
create_app()
heavy = sorted(m for m in sys.modules if m.split(".")[0] in {"torch", "vllm", "transformers", "numpy"}
               or m.startswith(("palmyra_serve.engine", "palmyra_serve.model", "palmyra_serve.tools")))
print(",".join(heavy))
"""


def test_sidecar_imports_nothing_heavy():
    env = {**os.environ, "PALMYRA_AUTH_DISABLED": "true"}  # auth fails closed without keys or this
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=60, env=env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == ""


# The sidecar's four floors (CONTRIBUTING.md, "The house"): an import goes to a lower floor, or stays
# in its own room; never up, never sideways between concerns.
SIDECAR = Path(__file__).resolve().parents[2] / "service" / "palmyra_serve" / "sidecar"
GROUND = "core"
CONCERNS = frozenset({"edge", "upstream", "admission", "tenants", "observability", "lifecycle", "policy"})
RELAY = "relay"


def room_of(module: str) -> str:
    """A module's room: its package under sidecar/, or `root` for the composition root's modules
    at the top (app, server, openapi, memory_budget)."""
    first = module.split(".")[0]
    return first if (SIDECAR / first).is_dir() else "root"


def floor_of(room: str) -> int:
    if room == GROUND:
        return 0
    if room in CONCERNS:
        return 1
    return 2 if room == RELAY else 3


def sidecar_imports() -> list[tuple[str, str]]:
    """(importing module, imported module) for every import of the sidecar by the sidecar, relative
    to palmyra_serve.sidecar; imports under TYPE_CHECKING count too."""
    edges = []
    for path in SIDECAR.rglob("*.py"):
        module = ".".join(path.relative_to(SIDECAR).with_suffix("").parts)
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("palmyra_serve.sidecar"):
                base = node.module.removeprefix("palmyra_serve.sidecar").lstrip(".")
                targets = [f"{base}.{a.name}" if base else a.name for a in node.names]
                edges += [(module, t) for t in targets]
            elif isinstance(node, ast.Import):
                edges += [
                    (module, a.name.removeprefix("palmyra_serve.sidecar."))
                    for a in node.names
                    if a.name.startswith("palmyra_serve.sidecar.")
                ]
    return edges


def test_every_room_is_on_a_known_floor():
    rooms = {room_of(".".join(p.relative_to(SIDECAR).with_suffix("").parts)) for p in SIDECAR.rglob("*.py")}
    assert rooms - {"__init__"} <= {GROUND, RELAY, "root", *CONCERNS}, "a new package needs its floor here"


def test_no_import_runs_up_or_sideways():
    wrong = []
    for source, target in sidecar_imports():
        a, b = room_of(source), room_of(target)
        if a == b or a == "__init__":
            continue
        if floor_of(b) >= floor_of(a):
            wrong.append(f"{source} -> {target}")
    assert not wrong, "imports that run up or between concerns:\n" + "\n".join(sorted(wrong))


def test_the_floor_check_catches_an_arrow_back_up():
    assert floor_of(room_of("relay.handler")) > floor_of(room_of("tenants.quota")) > floor_of(room_of("core.errors"))
    assert floor_of(room_of("tenants.quota")) == floor_of(room_of("admission.control"))  # sideways: refused


MAX_LINES = 400
LONG_REASON = "# Longer than 400 lines: "


def test_no_module_over_400_lines_without_a_stated_reason():
    package = SIDECAR.parent
    long = []
    for path in package.rglob("*.py"):
        text = path.read_text()
        if text.count("\n") > MAX_LINES and LONG_REASON not in text:
            long.append(f"{path.relative_to(package)}: {text.count(chr(10))} lines")
    assert not long, "split these, or say why not at the top (`" + LONG_REASON + "...`):\n" + "\n".join(long)
