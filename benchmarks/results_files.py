"""Where a benchmark's run goes: its JSON (every figure) and its Markdown table, side by side under
--out (benchmarks/results/ by default), the table also printed."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


def write(out: Path, name: str, doc: dict, md: str) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.json").write_text(json.dumps(doc, indent=2) + "\n")
    (out / f"{name}.md").write_text(md + "\n")
    print(md)


def main(
    parser: argparse.ArgumentParser,
    run: Callable[[argparse.Namespace], dict],
    markdown: Callable[[dict], str],
    name: str,
    argv: list[str] | None,
) -> int:
    """A benchmark's command line, ended: --seed, --name (the files' stem) and --out added to its
    own options, its run written as write() does."""
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--name", default=name, help="file name stem under --out")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    doc = run(args)
    write(args.out, args.name, doc, markdown(doc))
    return 0
