"""The unit tests build about ten stand-in checkpoints. Most of each build is converting Qwen2's
151,643 BPE ranks into tokenizer.json (2.7 s of 3.9 s on two cores), and those files are the same
for every checkpoint. So each test process converts once, with the real builder, and copies its
files after; the weights are still built each time."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from palmyra_serve.model import stand_in


@pytest.fixture(scope="session", autouse=True)
def tokenizer_built_once(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    real = stand_in.build_tokenizer
    built: Path | None = None

    def build_or_copy(out_dir: Path) -> None:
        nonlocal built
        if built is None:
            first = tmp_path_factory.mktemp("tokenizer")
            real(first)
            built = first
        for path in built.iterdir():
            shutil.copyfile(path, out_dir / path.name)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(stand_in, "build_tokenizer", build_or_copy)
        yield
