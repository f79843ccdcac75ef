"""Digests that name what a checkpoint computes: its weights and its tokenizer.

A golden reference (tools/golden.py) records both, so that a replica checked against it is known
to serve the weights the reference was recorded for. The weights' digest is a SHA-256 over every
`*.safetensors` file's name and bytes in name order (streamed, so a 3.6 GB checkpoint costs its
read time and 1 MiB of memory); the tokenizer's over the files that decide its ids.
"""

from __future__ import annotations

import hashlib
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
