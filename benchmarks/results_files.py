"""Where a benchmark's run goes: its JSON (every figure) and its Markdown table, side by side under
--out (benchmarks/results/ by default), the table also printed."""

from __future__ import annotations

import json
from pathlib import Path


def write(out: Path, name: str, doc: dict, md: str) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.json").write_text(json.dumps(doc, indent=2) + "\n")
    (out / f"{name}.md").write_text(md + "\n")
    print(md)
