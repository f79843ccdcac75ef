"""Which vLLM the engine tier's engines run: the CPU engine of this venv (the default), or vLLM
0.18.0, the version the Ascend image runs, from its own venv (PALMYRA_TEST_ENGINE=vllm018, which
`./test.sh vllm018` sets; tests/vllm018/README.md says how that venv is built).

Only the interpreter and its environment change: the launcher is this repository's
(palmyra_serve.engine.launcher, from service/ on PYTHONPATH), so the command vLLM receives is
the one the images run."""

from __future__ import annotations

import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SELECTOR = "PALMYRA_TEST_ENGINE"
VLLM018_VENV = Path(os.environ.get("PALMYRA_VLLM018_VENV", REPO / ".venv-vllm018"))
# vLLM 0.18's CPU engine refuses to start unless tcmalloc is preloaded (its CPU worker checks
# LD_PRELOAD), with the venv's Intel OpenMP runtime beside it.
TCMALLOC = "/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4"


def vllm018() -> bool:
    return os.environ.get(SELECTOR) == "vllm018"


def launcher() -> list[str]:
    """The argv prefix that runs `palmyra-serve` for the engine under test."""
    if vllm018():
        return [str(VLLM018_VENV / "bin" / "python"), "-m", "palmyra_serve.cli"]
    return [str(Path(sys.executable).parent / "palmyra-serve")]


def environment() -> dict[str, str]:
    """What the engine under test needs in its environment beyond the tier's settings."""
    if not vllm018():
        return {}
    iomp = sorted(VLLM018_VENV.glob("lib/libiomp5.so")) + sorted(
        VLLM018_VENV.glob("lib/python3*/site-packages/*/lib/libiomp5.so")
    )
    preload = [TCMALLOC, *(str(p) for p in iomp[:1])]
    # Compiled, as the images run it: in eager mode vLLM 0.18's CPU engine stalled for seconds on
    # batch shapes it had not run yet (canaries and streams timed out after a restart), which
    # compilation's warm-up covers. About 40 s to start instead of 14 s.
    return {"PYTHONPATH": str(REPO / "service"), "LD_PRELOAD": ":".join(preload)}
