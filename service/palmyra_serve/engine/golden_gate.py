"""The engine starts only on the weights its golden reference was recorded for.

With PALMYRA_GOLDEN_FILE set, `palmyra-serve engine` hashes the checkpoint it is about to serve
(model/digest.py) and compares the digest with the one the golden file names, before vLLM starts.
A reference recorded for other weights would make every output check fail as drift, with nothing
wrong in the numbers; the start says so instead, with both digests. PALMYRA_GOLDEN_DIGEST=refuse
(the default) stops there with exit status 2, which `palmyra-serve up` reports as a refused start
and does not retry; warn logs the same line and starts.
"""

from __future__ import annotations

import logging
from pathlib import Path

from palmyra_serve.model.digest import compare_with_golden
from palmyra_serve.settings import Settings

log = logging.getLogger(__name__)

WARN_HINT = "PALMYRA_GOLDEN_DIGEST=warn starts it anyway"
FIX_HINT = "record the reference for these weights (palmyra-serve golden --model-dir DIR --out FILE)"


def refusal(settings: Settings, model_path: str) -> str | None:
    """None when the engine may start; else the reason it must not (already logged)."""
    if settings.golden_file is None:
        return None
    result = compare_with_golden(settings.golden_file, Path(model_path))
    if result.matches:
        log.info("golden digest: %s (hashed in %.1f s)", result.describe(), result.seconds)
        return None
    reason = f"{result.describe()}; {FIX_HINT}, or point PALMYRA_GOLDEN_FILE at the one recorded for them"
    if settings.golden_digest == "warn":
        log.warning("golden digest: %s (starting anyway: PALMYRA_GOLDEN_DIGEST=warn)", reason)
        return None
    return f"{reason} ({WARN_HINT})"


def admit(settings: Settings, model_path: str) -> bool:
    """The engine's start: False (do not start; the caller exits 2) when refusal() says so."""
    reason = refusal(settings, model_path)
    if reason:
        log.error("refusing to start: %s", reason)
        return False
    return True
