"""Digests that name what a checkpoint computes: its weights and its tokenizer.

A golden reference (tools/golden.py) records both, so that a replica checked against it is known
to serve the weights the reference was recorded for. The weights' digest is a SHA-256 over every
`*.safetensors` file's name and bytes in name order (streamed, so a 3.6 GB checkpoint costs its
read time and 1 MiB of memory); the tokenizer's over the files that decide its ids.

The engine's start (engine/golden_gate.py) and doctor compare the served weights' digest with the
golden file's. Measured on a 2-core EPYC (SHA-NI), the 3.55 GB full-size stand-in: 2.3 s with the
files in the page cache (1.5 GB/s, the hash's own speed), 2.7 to 8.0 s after evicting them; the
read also leaves them cached for vLLM's own load. So it is hashed on every start, never cached: a
digest kept by size and mtime would trust a copied-in file of the same shape.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass
from pathlib import Path

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt", "special_tokens_map.json")
_CHUNK = 1 << 20


def _files_digest(paths: list[Path]) -> str:
    h = hashlib.sha256()
    for path in paths:
        h.update(path.name.encode() + b"\0")
        with path.open("rb") as f:
            while chunk := f.read(_CHUNK):
                h.update(chunk)
        h.update(b"\0")
    return "sha256:" + h.hexdigest()


def weights_digest(model_dir: Path) -> str:
    files = sorted(Path(model_dir).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors in {model_dir}")
    return _files_digest(files)


def tokenizer_digest(model_dir: Path) -> str:
    files = [Path(model_dir) / name for name in TOKENIZER_FILES if (Path(model_dir) / name).is_file()]
    if not files:
        raise FileNotFoundError(f"no tokenizer files in {model_dir}")
    return _files_digest(files)


@dataclass(frozen=True)
class WeightsMatch:
    """The served checkpoint's weights against the golden file's: what the engine's start and
    doctor judge. `served` or `recorded` is None when it could not be read (`problem` says why)."""

    golden_file: Path
    model_dir: Path
    served: str | None
    recorded: str | None
    seconds: float  # spent hashing the served weights
    problem: str | None = None

    @property
    def matches(self) -> bool:
        return self.problem is None and self.served is not None and self.served == self.recorded

    def describe(self) -> str:
        if self.problem:
            return self.problem
        if self.matches:
            return f"the weights in {self.model_dir} are those {self.golden_file} was recorded for ({self.served})"
        return (
            f"the weights in {self.model_dir} ({self.served}) are not those {self.golden_file} was recorded for "
            f"({self.recorded}): its output checks would fail as drift"
        )


def recorded_weights(golden_file: Path) -> str:
    """The weights' digest a golden file names (ValueError when it names none or cannot be read)."""
    try:
        doc = json.loads(Path(golden_file).read_bytes())
    except (OSError, ValueError) as exc:
        raise ValueError(f"cannot read {golden_file} as a golden reference ({exc})") from None
    digest = doc.get("weights") if isinstance(doc, dict) else None
    if not isinstance(digest, str) or not digest.startswith("sha256:"):
        raise ValueError(f"{golden_file} names no weights digest (not a file `palmyra-serve golden` wrote)")
    return digest


def compare_with_golden(golden_file: Path, model_dir: Path) -> WeightsMatch:
    """Hash the served weights and compare them with the golden file's; never raises."""
    golden_file, model_dir = Path(golden_file), Path(model_dir)
    try:
        recorded = recorded_weights(golden_file)
    except ValueError as exc:
        return WeightsMatch(golden_file, model_dir, None, None, 0.0, f"PALMYRA_GOLDEN_FILE: {exc}")
    t0 = time.perf_counter()
    try:
        served = weights_digest(model_dir)
    except OSError as exc:  # FileNotFoundError: no *.safetensors (a hub id, an empty directory)
        return WeightsMatch(
            golden_file,
            model_dir,
            None,
            recorded,
            0.0,
            f"cannot hash the served weights to compare them with {golden_file} ({recorded}): {exc}",
        )
    return WeightsMatch(golden_file, model_dir, served, recorded, time.perf_counter() - t0)
