"""The `vllm:` metric names this repository reads (monitoring, k8s, the sidecar), collected from the
files that read them, and their base names without the exposition suffixes."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

SUFFIXES = ("_bucket", "_count", "_sum", "_total", "_created")


# Where vllm: names are read: what Prometheus, Grafana, KEDA and the router load (generated
# dashboards included), and the sidecar, which parses the engine's /metrics page itself
# (sidecar/upstream/capacity.py: vllm:cache_config_info for the admission ceiling).
METRIC_USERS = {"monitoring": {".yaml", ".yml", ".json"}, "k8s": {".yaml", ".yml", ".json"}, "service": {".py"}}


def used_metric_lines() -> dict[str, list[str]]:
    """Every vllm: metric name in monitoring/, k8s/ and service/, with the lines using it."""
    found: dict[str, list[str]] = {}
    for top, suffixes in METRIC_USERS.items():
        for path in (REPO / top).rglob("*"):
            # promtool's test inputs feed old names on purpose and are not queries.
            if not path.is_file() or path.suffix not in suffixes or "tests" in path.parts:
                continue
            for line in path.read_text(errors="ignore").splitlines():
                if line.lstrip().startswith("#"):
                    continue
                for name in re.findall(r"vllm:[a-zA-Z0-9_:]+", line):
                    found.setdefault(name, []).append(f"{path.relative_to(REPO)}: {line.strip()[:200]}")
    return found


def base_name(name: str) -> str:
    for suffix in SUFFIXES:
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name
