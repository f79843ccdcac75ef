"""The PromQL inside the Grafana dashboards, with template variables filled in.

Shared by the tests that send every panel query to a real Prometheus (static tier: parse and NPU
data; engine tier: data from the live sidecar and engine). Standard library only.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

DASHBOARDS = Path(__file__).resolve().parent / "grafana" / "dashboards"
VAR_RE = re.compile(r"\$\{(\w+)\}|\$(\w+)")


@dataclass(frozen=True)
class PanelQuery:
    dashboard: str
    panel: str
    legend: str
    expr: str

    @property
    def key(self) -> str:
        return f"{self.dashboard} / {self.panel} / {self.legend or '-'}"


def load(name: str) -> dict:
    return json.loads((DASHBOARDS / name).read_text(encoding="utf-8"))


def panel_queries(dashboard: dict) -> list[PanelQuery]:
    out = []
    for p in dashboard["panels"]:
        for t in p.get("targets", []):
            out.append(PanelQuery(dashboard["uid"], p["title"], t.get("legendFormat", ""), t.get("expr", "")))
    return out


def variables_used(expr: str) -> set[str]:
    return {a or b for a, b in VAR_RE.findall(expr)}


def substitute(expr: str, values: dict[str, str]) -> str:
    """Fill $var / ${var} like Grafana does; an unknown variable is an error, not left in place."""

    def repl(m: re.Match) -> str:
        name = m.group(1) or m.group(2)
        if name not in values:
            raise KeyError(f"no value for ${name} in {expr!r}")
        return values[name]

    return VAR_RE.sub(repl, expr)


def label_values_selector(definition: str) -> str:
    """`label_values(SELECTOR, label)` (a Grafana function) -> SELECTOR, which is PromQL."""
    m = re.fullmatch(r"\s*label_values\((.*),\s*\w+\s*\)\s*", definition)
    if not m:
        raise ValueError(f"not a label_values() query: {definition!r}")
    return m.group(1)
