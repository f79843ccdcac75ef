"""The sidecar stays light: importing and building it pulls in no torch, vllm or transformers,
and nothing from the engine, model or tools packages (its image carries none of them)."""

from __future__ import annotations

import os
import subprocess
import sys

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
