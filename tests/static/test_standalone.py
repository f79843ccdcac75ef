"""The repository stands alone: a clone with nothing beside it passes its tests. The published
schemas and recorded fixtures the tests read are vendored in tests/data, each unmodified (its
sha256 as listed) with its source, version and license noted in tests/data/README.md, and no file
reaches for a directory beside the repository (the `../shared` the project was developed next to).
"""

from __future__ import annotations

import hashlib
import re
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DATA = REPO / "tests" / "data"
INDEX = DATA / "README.md"
# Not vendored: the contract snapshot of this project's own code, written by
# tests/static/test_contract.py (PALMYRA_UPDATE_CONTRACT=1) and changed with the code it records.
OWN_SNAPSHOTS = DATA / "contract"
SHA256 = re.compile(r"^[0-9a-f]{64}$")
# A path to a sibling directory of the repository: `../shared`, `parent / "shared"`, `/work/shared`.
BESIDE = re.compile(r"""\.\./shared\b|parent\s*/\s*["']shared["']|/work/shared\b""")
TEXT_SUFFIXES = {".py", ".sh", ".md", ".yaml", ".yml", ".toml", ".cfg", ".ini", ".txt", ".json", ".j2", ""}


def _rows() -> dict[str, dict[str, str]]:
    """file -> its row in tests/data/README.md's table (header names as keys)."""
    lines = [line for line in INDEX.read_text(encoding="utf-8").splitlines() if line.startswith("|")]
    header = [cell.strip() for cell in lines[0].strip("|").split("|")]
    rows = {}
    for line in lines[2:]:
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        assert len(cells) == len(header), f"malformed row: {line}"
        rows[cells[0]] = dict(zip(header, cells, strict=True))
    return rows


def _vendored() -> set[str]:
    return {
        p.relative_to(DATA).as_posix()
        for p in DATA.rglob("*")
        if p.is_file() and p != INDEX and OWN_SNAPSHOTS not in p.parents
    }


def test_every_vendored_file_has_a_row_and_every_row_a_file():
    rows = _rows()
    assert _vendored(), "tests/data is empty"
    assert set(rows) == _vendored(), "tests/data/README.md's table and the files in tests/data differ"


@pytest.mark.parametrize("name", sorted(_vendored()))
def test_vendored_file_is_the_published_copy_with_provenance(name):
    row = _rows()[name]
    for column in ("from", "version / commit", "license"):
        assert row[column], f"{name}: no {column!r} noted"
    assert SHA256.match(row["sha256"]), f"{name}: sha256 column is not a sha256"
    digest = hashlib.sha256((DATA / name).read_bytes()).hexdigest()
    assert digest == row["sha256"], (
        f"tests/data/{name} is not the copy noted in tests/data/README.md (edited or reformatted?): "
        "vendored data stays byte-for-byte as published"
    )


def _repository_files() -> list[Path]:
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    if listed.returncode == 0:
        names = [n for n in listed.stdout.split("\0") if n]
    else:  # an export without .git
        names = [
            p.relative_to(REPO).as_posix()
            for p in REPO.rglob("*")
            if p.is_file() and not any(part.startswith(".") for part in p.relative_to(REPO).parts)
        ]
    return [REPO / n for n in names if Path(n).suffix in TEXT_SUFFIXES and (REPO / n).is_file()]


def test_no_file_reads_beside_the_repository():
    me = Path(__file__).resolve()
    offenders = []
    for path in _repository_files():
        if path.resolve() == me:
            continue
        text = path.read_text(encoding="utf-8", errors="replace")
        offenders += [
            f"{path.relative_to(REPO)}:{text.count(chr(10), 0, m.start()) + 1}: {m.group(0)}"
            for m in BESIDE.finditer(text)
        ]
    assert not offenders, "a clone has nothing beside it; vendor into tests/data instead:\n" + "\n".join(offenders)
