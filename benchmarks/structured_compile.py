"""Grammar compile time of structured-output shapes, as vLLM's xgrammar backend builds them.

vLLM compiles a request's schema, regex, grammar or choice list with xgrammar against the served
tokenizer (Qwen2's, 151,936 ids) while it validates the request, in its API server. This times
that compile for the shapes policy/structured.py bounds, one compiler thread, caching off, with
Qwen2's tokenizer rebuilt offline (palmyra_serve.model.tokenizer), so each figure is what one
request costs before any request behind it is answered.

    python -m benchmarks.structured_compile     # from the repository root; prints a table
"""

from __future__ import annotations

import json
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from palmyra_serve.model.tokenizer import build_tokenizer
from palmyra_serve.sidecar.policy.structured import repeat_units


def _string(prop: dict) -> str:
    return json.dumps({"type": "object", "properties": {"a": {"type": "string", **prop}}})


CASES: list[tuple[str, str, Any, int]] = [
    ("plain object schema", "schema", json.dumps({"type": "object", "properties": {"a": {"type": "string"}}}), 0),
    *[(f"string maxLength {n}", "schema", _string({"maxLength": n}), n) for n in (16, 64, 128, 256)],
    *[
        (f"pattern [\\x00-\\uffff]{{0,{n}}}", "schema", _string({"pattern": f"^[\\x00-\\uffff]{{0,{n}}}$"}), n)
        for n in (16, 64, 8000)
    ],
    *[(f"regex [a-z ]{{0,{n}}}", "regex", f"[a-z ]{{0,{n}}}", n) for n in (16, 256)],
    *[(f"choice of {n}", "choice", [f"choice number {i}" for i in range(n)], 0) for n in (256, 1000, 4000)],
    ("array maxItems 4000", "schema", json.dumps({"type": "array", "items": {"type": "integer"}, "maxItems": 4000}), 0),
]


def main() -> None:
    import xgrammar as xgr
    from transformers import AutoTokenizer

    with tempfile.TemporaryDirectory() as tmp:
        build_tokenizer(Path(tmp))
        tokenizer = AutoTokenizer.from_pretrained(tmp)
    info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=151936)
    compile_as: dict[str, Callable[[Any, Any], Any]] = {
        "schema": lambda c, v: c.compile_json_schema(v),
        "regex": lambda c, v: c.compile_regex(v),
        "choice": lambda c, v: c.compile_grammar("root ::= " + " | ".join(json.dumps(s) for s in v)),
    }
    compile_as["schema"](xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False), CASES[0][2])  # warm-up
    print("| shape | units counted | compile s |\n|---|---|---|")
    for label, kind, value, _ in CASES:
        compiler = xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False)
        t0 = time.perf_counter()
        compile_as[kind](compiler, value)
        took = time.perf_counter() - t0
        units = repeat_units(value) if kind == "regex" else _schema_units(value) if kind == "schema" else 0
        print(f"| {label} | {units} | {took:.3f} |", flush=True)


def _schema_units(schema: str) -> int:
    from palmyra_serve.sidecar.policy import structured

    limits = structured.StructuredLimits(
        max_bytes=1 << 20, max_repeat=1 << 30, max_choices=1 << 20, regex_and_grammar=True
    )
    return structured.check({"json": schema}, "schema", limits).units


if __name__ == "__main__":
    main()
