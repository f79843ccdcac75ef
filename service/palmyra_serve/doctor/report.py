"""doctor's output: one line per finding, the fix under each that is not ok, then one verdict;
and the exit status a script or the engine's start can act on (1: the engine would not start)."""

from __future__ import annotations

import json
from collections.abc import Sequence

from palmyra_serve.doctor.checks import Finding

MARK = {"ok": "ok  ", "info": "info", "warn": "WARN", "stop": "STOP"}


def verdict(findings: Sequence[Finding]) -> str:
    stops = sum(f.level == "stop" for f in findings)
    warns = sum(f.level == "warn" for f in findings)
    if stops:
        return f"verdict: the engine will not start here ({stops} to fix" + (f", {warns} warning(s))" if warns else ")")
    if all(f.level == "info" for f in findings if f.check == "driver"):
        return "verdict: not an Ascend host; the CPU engine needs none of this"
    if warns:
        return f"verdict: the engine can start; {warns} warning(s) above may still stop it"
    return "verdict: ready for the Ascend engine"


def exit_status(findings: Sequence[Finding]) -> int:
    return 1 if any(f.level == "stop" for f in findings) else 0


def render_text(findings: Sequence[Finding]) -> str:
    lines = []
    for f in findings:
        lines.append(f"[{MARK[f.level]}] {f.check}: {f.message}")
        if f.fix and f.level in ("warn", "stop"):
            lines.append(f"        fix: {f.fix}")
    lines.append(verdict(findings))
    return "\n".join(lines)


def render_json(findings: Sequence[Finding]) -> str:
    return json.dumps(
        {
            "findings": [{"check": f.check, "level": f.level, "message": f.message, "fix": f.fix} for f in findings],
            "verdict": verdict(findings),
            "exit_status": exit_status(findings),
        },
        indent=2,
    )
